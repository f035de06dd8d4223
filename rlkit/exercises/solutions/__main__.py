"""The instructor's commands for the exercises' stored expectations and hidden cases.

    python -m rlkit.exercises.solutions record [--chapter N]
    python -m rlkit.exercises.solutions hidden [--seed N]
    python -m rlkit.exercises.solutions points [--points points.json]

``record`` runs each reference and each registered mistake on every case and writes
``rlkit/exercises/expected/chNN.pt`` (only chapter N's file with ``--chapter``): run it after
changing a chapter's exercises, cases or mistakes, and commit the file. ``hidden`` prints how many
hidden cases each exercise gets at a seed (0: its cases are not seeded). ``points`` prints what
each exercise is worth.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkit.exercises.solutions", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_rec = sub.add_parser("record", help="write the stored expectations, rlkit/exercises/expected/chNN.pt")
    p_rec.add_argument("--chapter", type=int, default=None, help="rewrite this chapter's file only")
    p_hid = sub.add_parser("hidden", help="count the hidden cases of each exercise")
    p_hid.add_argument("--seed", type=int, default=1)
    p_pts = sub.add_parser("points", help="print each exercise's points")
    p_pts.add_argument("--points", default=None, help="a JSON file of overrides {name: points}")
    args = parser.parse_args(argv)

    from rlkit.exercises import solutions

    if args.cmd == "record":
        try:
            written = solutions.record(args.chapter)
        except ValueError as err:
            parser.error(str(err))
        for ch, (path, n) in written.items():
            print(f"chapter {ch}: {n} exercises -> {path} ({path.stat().st_size / 1024:.1f} KiB)")
        return 0
    if args.cmd == "hidden":
        report = solutions.hidden_report(args.seed)
        for name, n in report.items():
            print(f"{name}: {n} hidden case(s)" + ("" if n else " (its cases are not seeded: none)"))
        print(f"{sum(1 for n in report.values() if n)} of {len(report)} exercises have hidden cases at seed "
              f"{args.seed} ({sum(report.values())} cases)")
        return 0
    try:
        pts = solutions.points(args.points)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    for name, p in pts.items():
        print(f"{name}: {p:g}")
    print(f"total: {sum(pts.values()):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
