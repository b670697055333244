"""The benchmark scripts' argument checks, free of GPU imports so that they run before PyTorch is
loaded: a bad argument is refused with one line on stderr naming it and what is allowed, exit
status 2, before anything is written."""
import os
import sys


def refuse(script, text):
    print(f"{script}: {text}", file=sys.stderr)
    sys.exit(2)


def check_ranges(script, checks):
    """checks: (flag, value, low, high), each value to lie in [low, high]."""
    for flag, value, low, high in checks:
        if not low <= value <= high:
            refuse(script, f"{flag} {value} is outside [{low}, {high}]")


def check_choice(script, flag, value, allowed):
    """value to be one of `allowed`."""
    if value not in allowed:
        refuse(script, f"{flag} {value}: give one of {', '.join(allowed)}")


def check_output_folders(script, outputs):
    """outputs: (flag, path), each given path's folder to exist (a flag not given has path None)."""
    for flag, path in outputs:
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            refuse(script, f"{flag} {path}: no folder {folder}")
