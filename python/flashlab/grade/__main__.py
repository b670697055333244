"""flashlab-grade: the course labs' grader on the command line.

  flashlab-grade LAB SUBMISSION [--json results.json] [--time-limit S] [--memory-limit MB]
  flashlab-grade release OUT [--labs notebooks/labs]     the student version, without solutions/
  flashlab-grade list                                    the labs

Grading prints the report and exits 0 (the score is in the report and the JSON); bad input is one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from . import _framework


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        print(f"flashlab-grade: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["list"]:
        for lab in _framework.labs():
            needs = f"; needs {lab.requires}" if lab.requires else ""
            print(f"{lab.key}  {lab.folder:24s} {lab.title} (hand in {lab.submission}{needs})")
        return 0
    if argv[:1] == ["release"]:
        parser = _Parser(prog="flashlab-grade release")
        parser.add_argument("out")
        parser.add_argument("--labs", default="notebooks/labs")
        args = parser.parse_args(argv[1:])
        try:
            files = _framework.release(args.labs, args.out)
        except ValueError as error:
            print(f"flashlab-grade: {error}", file=sys.stderr)
            return 2
        print(f"released {len(files)} files to {args.out} (solutions left out)")
        return 0
    parser = _Parser(prog="flashlab-grade", description="Grades a course lab's submission.")
    parser.add_argument("lab", help="the lab: 01 ... 06, or its folder name (flashlab-grade list)")
    parser.add_argument("submission", help="the file handed in")
    parser.add_argument("--json", help="also write the results.json autograding services read")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds for the whole lab (default 120)")
    parser.add_argument("--memory-limit", type=int, default=4096,
                        help="MB of address space, or for lab 06 of resident memory (default 4096)")
    args = parser.parse_args(argv)
    try:
        report = _framework.grade(args.lab, args.submission, time_limit=args.time_limit, memory_limit=args.memory_limit)
    except ValueError as error:
        print(f"flashlab-grade: {error}", file=sys.stderr)
        return 2
    print(report.text())
    if args.json:
        report.write_json(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
