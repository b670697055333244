"""The grader's worker process: python -m flashlab.grade._worker LAB SUBMISSION (see _framework)."""

import sys

from ._framework import worker_main

if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1], sys.argv[2]))
