"""Grade a student's file of exercise functions from the command line.

    python -m rlkit.exercises list [--chapter N]
    python -m rlkit.exercises grade student.py [--chapter N]
    python -m rlkit.exercises student-edition OUT/ [--lessons lessons/]

``grade`` imports the file (so only run it on code you are willing to execute), checks every
registered exercise whose function the file defines, prints one line per exercise and a score,
and exits with status 0 when everything passed, 1 otherwise. ``student-edition`` writes the
chapter notebooks without their solutions (see :mod:`rlkit.exercises.student`).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from rlkit.exercises import exercises, grade
from rlkit.exercises.student import student_edition


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkit.exercises", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_list = sub.add_parser("list", help="list the registered exercises")
    p_list.add_argument("--chapter", type=int, default=None)
    p_grade = sub.add_parser("grade", help="check a student's functions")
    p_grade.add_argument("file", type=Path)
    p_grade.add_argument("--chapter", type=int, default=None)
    p_grade.add_argument("--verbose", action="store_true", help="print each check's full report")
    p_student = sub.add_parser("student-edition", help="write the chapter notebooks without their solutions")
    p_student.add_argument("out", type=Path, help="the folder to write the student notebooks to")
    p_student.add_argument("--lessons", type=Path, default=None,
                           help="the chapter notebooks (default: lessons/ of an editable install)")
    args = parser.parse_args(argv)

    if args.cmd == "student-edition":
        try:
            report = student_edition(args.out, args.lessons)
        except (FileNotFoundError, ValueError) as err:
            parser.error(str(err))
        for name, removed in report.items():
            print(f"{name}: {removed['blocks']} solution blocks and {removed['cells']} solution cell(s) removed")
        print(f"wrote {len(report)} student notebooks to {args.out}")
        return 0

    if args.cmd == "list":
        for ex in exercises(args.chapter):
            print(f"ch{ex.chapter:02d}  {ex.name}")
        return 0

    if not args.file.is_file():
        parser.error(f"file: {args.file} does not exist")
    spec = importlib.util.spec_from_file_location("student_submission", args.file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = grade(vars(module), chapter=args.chapter, verbose=args.verbose)
    attempted = [r for r in results if r.cases_total > 0]
    for r in results:
        first = r.message.splitlines()[0]
        print(first)
        if not r.passed and r.cases_total > 0 and not args.verbose:
            for line in r.message.splitlines()[1:]:
                print("    " + line.strip())
    passed = sum(r.passed for r in results)
    print(f"score: {passed}/{len(results)} exercises passed ({len(attempted)} attempted)")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
