"""The process in which ``python -m rlkit.exercises grade`` runs a submission (not a public interface).

    python -m rlkit.exercises._worker FILE [--chapter N] [--after NAME]

imports FILE, checks every registered exercise (of chapter N; after the exercise NAME, when the
grader restarts it past one that timed out or crashed) and reports to the grader, one JSON object
a line on the file descriptor that was standard output: ``{"event": "ready"}`` once the checkers
are loaded, ``{"event": "imported"}`` or
``{"event": "import_error", "error": ...}``, then ``{"event": "start", "name": ...}`` and
``{"event": "result", ...}`` for each exercise. The submission's own standard output goes to
standard error, so that nothing it prints can be taken for a report.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkit.exercises._worker")
    parser.add_argument("file")
    parser.add_argument("--chapter", type=int, default=None)
    parser.add_argument("--after", default=None)
    args = parser.parse_args(argv)

    sys.stdout.flush()
    report = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)                                   # the submission's prints go to stderr

    def send(**event):
        report.write(json.dumps(event) + "\n")
        report.flush()

    from rlkit.exercises import check, exercises

    names = [ex.name for ex in exercises(args.chapter)]
    send(event="ready")
    try:
        spec = importlib.util.spec_from_file_location("student_submission", args.file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as err:                    # SystemExit from the submission too
        send(event="import_error", error=f"{type(err).__name__}: {err}")
        return 0
    send(event="imported")
    todo = names[names.index(args.after) + 1:] if args.after in names else names
    namespace = vars(module)
    for name in todo:
        send(event="start", name=name)
        fn = namespace.get(name)
        if fn is None or not callable(fn):
            send(event="result", name=name, passed=False, message=f"✗ {name}: missing", cases_passed=0,
                 cases_total=0)
            continue
        r = check(fn, name=name, verbose=False)
        send(event="result", name=name, passed=r.passed, message=r.message, cases_passed=r.cases_passed,
             cases_total=r.cases_total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
