"""Grade a student's file of exercise functions from the command line.

    python -m rlkit.exercises list [--chapter N]
    python -m rlkit.exercises grade student.py [--chapter N] [--timeout SECONDS] [--verbose]
    python -m rlkit.exercises student-edition OUT/ [--lessons lessons/] [--force]
    python -m rlkit.exercises grade-folder SUBMISSIONS/ --report report.json [--csv report.csv]
        [--timeout S] [--submission-timeout S] [--hidden-seed N] [--points points.json]
    python -m rlkit.exercises student-bundle OUT/ [--lessons lessons/]

``grade`` runs the file in a separate Python process (so only run it on code you are willing to
execute), checks every registered exercise whose function the file defines, prints one line per
exercise and a score, and exits with status 0 when everything passed, 1 otherwise. The import of
the file and the check of each exercise must each finish within ``--timeout`` seconds (default
60): an exercise that takes longer (a function that never returns) is reported as timed out, the
process is killed and a fresh one grades the remaining exercises; one that ends the process
(``sys.exit``, a crash) is reported as such. The separate process contains hangs and crashes, not
cheating: it still holds the checkers and their reference solutions. ``student-edition`` writes
the chapter notebooks without their solutions into a missing or empty folder, or with
``--force`` over the chapter files of a folder that is not empty (see
:mod:`rlkit.exercises.student`). ``grade-folder`` (the instructor's install) grades every submitted
notebook of a folder, chapters and problem sets, with partial credit, hidden cases and a JSON
(and CSV) report: see :mod:`rlkit.exercises.grading`. ``student-bundle`` writes what students
receive, rlkit without its solutions: see :mod:`rlkit.exercises.bundle`.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import rlkit
from rlkit.exercises import CheckResult, exercises, get, has_solutions
from rlkit.exercises.student import student_edition

DEFAULT_TIMEOUT = 60.0
#: seconds a grading process may take to start Python and load the checkers (before the submission runs)
STARTUP_TIMEOUT = 600.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, got {text!r}")
    return value


class _Worker:
    """One grading process: its JSON-lines reports, read by a thread, with a deadline on each wait."""

    def __init__(self, file: Path, worker_args: list[str]):
        cmd = [sys.executable, "-m", "rlkit.exercises._worker", str(file), *worker_args]
        env = dict(os.environ)   # the child imports the same rlkit as this process
        root = str(Path(rlkit.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
                                     start_new_session=os.name == "posix")
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                self.events.put(json.loads(raw.decode("utf-8")))
            except ValueError:
                continue
        self.events.put(None)                         # end of the reports: the process is ending

    def next(self, timeout: float):
        """The next report; None when the process ended; "timeout" after ``timeout`` seconds."""
        try:
            return self.events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return "timeout"

    def exit_code(self) -> int | None:
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                if os.name == "posix":
                    os.killpg(self.proc.pid, signal.SIGKILL)   # the submission's own children too
                else:
                    self.proc.kill()
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()


def _failed(name: str, why: str) -> CheckResult:
    total = len(get(name).get_cases())
    return CheckResult(name, False, f"✗ {name}: {why}", 0, total)


def _wait(timeout: float, deadline: float | None) -> tuple[float, bool]:
    """How long to wait for the next report, and whether the submission's deadline is what limits it."""
    if deadline is None:
        return timeout, False
    left = deadline - time.monotonic()
    return (left, True) if left < timeout else (timeout, False)


def _collect(worker: _Worker, names: list[str], results: dict, timeouts: dict, deadline: float | None,
             over: str) -> str | None:
    """Collect one worker's reports into ``results`` (``{"failed": why}`` for an item that timed out or
    crashed); the item it stopped at without a result (None if none)."""
    current = None
    while True:
        pending = current if current is not None else next(n for n in names if n not in results)
        wait, by_deadline = _wait(timeouts[pending], deadline)
        event = worker.next(wait)
        if event == "timeout":
            worker.kill()
            if by_deadline:             # the whole submission ran out of time: every item left gets 0
                results[pending] = {"failed": over.replace("before this item was graded", "while grading this item")}
                for n in names:
                    results.setdefault(n, {"failed": over})
                return None
            results[pending] = {"failed": f"timed out: the check did not finish within {timeouts[pending]:g} s "
                                          f"(does your function return? an infinite loop?)"}
            return pending
        if event is None:
            code = worker.exit_code()
            if current is not None and current not in results:
                results[current] = {"failed": f"the grading process ended (exit code {code}) while checking "
                                              f"this item: your function exited or crashed Python"}
                return current
            return None
        if event.get("event") == "start":
            current = event["name"]
        elif event.get("event") == "result":
            results[event["name"]] = event
            current = None
            if len(results) == len(names):
                worker.exit_code()
                return None


def _ready(worker: _Worker) -> str | None:
    """Wait for the worker to load the checkers: None when it did, else why not."""
    event = worker.next(STARTUP_TIMEOUT)
    if event == "timeout" or event is None or event.get("event") != "ready":
        worker.kill()
        return f"the grading process did not start (within {STARTUP_TIMEOUT:g} s)"
    return None


def _import(worker: _Worker, timeout: float, deadline: float | None = None) -> str | None:
    """Wait for the worker to load the checkers, then to import the submission: None when it did, else why not."""
    return _ready(worker) or _imported(worker, timeout, deadline)


def _imported(worker: _Worker, timeout: float, deadline: float | None = None) -> str | None:
    """Wait for the worker (ready) to import the submission: None when it did, else why not."""
    event = worker.next(_wait(timeout, deadline)[0])
    if event == "timeout":
        worker.kill()
        return f"the file did not finish importing within {timeout:g} s (a loop at the top level of the file?)"
    if event is None:
        return f"the grading process ended (exit code {worker.exit_code()}) while importing the file"
    if event.get("event") == "import_error":
        worker.kill()
        return f"the file raised {event['error']} while being imported"
    return None


def run_items(file: Path, worker_args: list[str], names: list[str], timeouts: dict[str, float],
              import_timeout: float, submission_timeout: float | None = None) -> dict[str, dict]:
    """Grade the items ``names`` of ``file`` in fresh worker processes (``rlkit.exercises._worker``).

    Each item must finish within ``timeouts[name]`` seconds, the import within ``import_timeout``,
    and the whole submission within ``submission_timeout`` (None: no limit), counted from the moment
    the first process has loaded the checkers (starting Python and torch is not the submission's
    time). An item that times out or crashes the process gets ``{"failed": why}``; the next process
    resumes after it. Returns the worker's result event per item. Raises ``RuntimeError`` when the
    file cannot be imported.
    """
    deadline = None
    over = f"the submission's time limit ({submission_timeout or 0:g} s) ran out before this item was graded"
    results: dict[str, dict] = {}
    after = None
    while len(results) < len(names):
        if deadline is not None and time.monotonic() >= deadline:
            for n in names:
                results.setdefault(n, {"failed": over})
            break
        worker = _Worker(file, [*worker_args, *(["--after", after] if after is not None else [])])
        try:
            problem = _ready(worker)
            if problem is None and submission_timeout is not None and deadline is None:
                deadline = time.monotonic() + submission_timeout
            problem = problem or _imported(worker, import_timeout, deadline)
            if problem is not None:
                raise RuntimeError(problem)
            after = _collect(worker, names, results, timeouts, deadline, over)
            if after is None and len(results) < len(names):
                missing = [n for n in names if n not in results]
                raise RuntimeError(f"the grading process stopped before grading {missing[0]}")
        finally:
            worker.kill()
    return results


def _grade_file(file: Path, chapter: int | None = None, timeout: float = DEFAULT_TIMEOUT) -> list[CheckResult]:
    """Grade the functions of ``file`` in separate processes, each check bounded by ``timeout`` seconds.

    Returns one :class:`CheckResult` per registered exercise (of ``chapter``), in order. Raises
    ``RuntimeError`` when the file cannot be imported (within ``timeout``).
    """
    names = [ex.name for ex in exercises(chapter)]
    args = [] if chapter is None else ["--chapter", str(chapter)]
    results = run_items(file, args, names, dict.fromkeys(names, timeout), timeout)
    out = []
    for n in names:
        r = results[n]
        out.append(_failed(n, r["failed"].replace("this item", "this exercise")) if "failed" in r else
                   CheckResult(n, r["passed"], r["message"], r["cases_passed"], r["cases_total"]))
    return out


def _print_results(results: list[CheckResult], verbose: bool) -> None:
    for r in results:
        if verbose:
            print(r.message)
            continue
        lines = r.message.splitlines()
        print(lines[0])
        if not r.passed and r.cases_total > 0:
            for line in lines[1:]:
                print("    " + line.strip())


def _instructor_module(parser, name: str):
    try:
        return importlib.import_module(f"rlkit.exercises.{name}")
    except ModuleNotFoundError:
        parser.error(f"this command needs the instructor's install of rlkit (rlkit.exercises.{name} and "
                     f"rlkit.exercises.solutions); the student bundle does not have it")


def _grade_folder(parser, args) -> int:
    grading = _instructor_module(parser, "grading")
    if not has_solutions():
        parser.error("grade-folder needs rlkit.exercises.solutions (the instructor's install)")
    if args.hidden_seed < 0:
        parser.error(f"--hidden-seed must be >= 0, got {args.hidden_seed}")

    def progress(r):
        extra = f" ({r.to_grade_by_hand:g} to grade by hand)" if r.to_grade_by_hand else ""
        print(f"{r.file}: {r.score:.4g}/{r.max:g}{extra}" + (f"  [{r.error}]" if r.error else ""), flush=True)

    try:
        results = grading.grade_folder(args.folder, args.timeout, args.hidden_seed, args.points,
                                       args.submission_timeout, progress)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    grading.write_json(results, args.report)
    if args.csv is not None:
        grading.write_csv(results, args.csv)
    print(f"graded {len(results)} submission(s); report: {args.report}" + (f", {args.csv}" if args.csv else ""))
    return 0


def _student_bundle(parser, args) -> int:
    bundle = _instructor_module(parser, "bundle")
    try:
        report = bundle.student_bundle(args.out, args.lessons)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    print(f"wrote the student bundle to {args.out}: {report['files']} files of rlkit (no solutions), "
          f"{report['notebooks']} student notebooks, {report['problem_sets']} problem-set skeletons")
    print(f"students install it with: pip install {args.out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkit.exercises", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_list = sub.add_parser("list", help="list the registered exercises")
    p_list.add_argument("--chapter", type=int, default=None)
    p_grade = sub.add_parser("grade", help="check a student's functions")
    p_grade.add_argument("file", type=Path)
    p_grade.add_argument("--chapter", type=int, default=None)
    p_grade.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT,
                         help=f"seconds allowed for importing the file and for each exercise's check "
                              f"(default {DEFAULT_TIMEOUT:g})")
    p_grade.add_argument("--verbose", action="store_true", help="print each check's full report")
    p_student = sub.add_parser("student-edition", help="write the chapter notebooks without their solutions")
    p_student.add_argument("out", type=Path, help="the folder to write the student notebooks to (missing or empty)")
    p_student.add_argument("--lessons", type=Path, default=None,
                           help="the chapter notebooks (default: lessons/ of an editable install)")
    p_student.add_argument("--force", action="store_true",
                           help="replace the chapter notebooks in an OUT folder that is not empty")
    p_folder = sub.add_parser("grade-folder", help="grade a folder of submitted notebooks (instructor)")
    p_folder.add_argument("folder", type=Path)
    p_folder.add_argument("--report", type=Path, required=True, help="the JSON report to write")
    p_folder.add_argument("--csv", type=Path, default=None, help="also write a CSV, one row per submission and item")
    p_folder.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT,
                          help=f"seconds for importing a submission and for each exercise (default "
                               f"{DEFAULT_TIMEOUT:g}; a problem set's tests have their own)")
    p_folder.add_argument("--submission-timeout", type=_seconds, default=None,
                          help="seconds for a whole submission (default: no limit beyond the items')")
    p_folder.add_argument("--hidden-seed", type=int, default=1,
                          help="the seed of the hidden cases (default 1; 0: no hidden cases)")
    p_folder.add_argument("--points", type=Path, default=None, help="a JSON file {exercise name: points}")
    p_bundle = sub.add_parser("student-bundle", help="write what students receive: rlkit without the solutions, "
                                                     "the student edition, the problem-set skeletons")
    p_bundle.add_argument("out", type=Path, help="the folder to write (missing or empty)")
    p_bundle.add_argument("--lessons", type=Path, default=None,
                          help="the chapter notebooks (default: lessons/ of an editable install)")
    args = parser.parse_args(argv)

    if args.cmd == "grade-folder":
        return _grade_folder(parser, args)
    if args.cmd == "student-bundle":
        return _student_bundle(parser, args)

    if args.cmd == "student-edition":
        try:
            report = student_edition(args.out, args.lessons, force=args.force)
        except (OSError, ValueError) as err:
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
    try:
        results = _grade_file(args.file, args.chapter, args.timeout)
    except RuntimeError as err:
        print(f"grade: {args.file}: {err}", file=sys.stderr)
        print(f"score: 0/{len(exercises(args.chapter))} exercises passed (the file could not be graded)")
        return 1
    _print_results(results, args.verbose)
    attempted = [r for r in results if r.cases_total > 0]
    passed = sum(r.passed for r in results)
    print(f"score: {passed}/{len(results)} exercises passed ({len(attempted)} attempted)")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
