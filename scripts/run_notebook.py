#!/usr/bin/env python3
"""Runs the code cells of a notebook in order, headless (matplotlib's Agg backend), and fails on
the first cell that raises: the notebooks' test, without a Jupyter installation. The notebooks
import the package flashlab: installed (`pip install .`), or a build tree's copy on the path
(PYTHONPATH=build/release/python, as ctest runs them).

usage: run_notebook.py NOTEBOOK
"""
import json
import os
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: run_notebook.py NOTEBOOK", file=sys.stderr)
        return 2
    path = sys.argv[1]
    import matplotlib
    matplotlib.use("Agg")
    with open(path) as file:
        notebook = json.load(file)
    os.chdir(os.path.dirname(os.path.abspath(path)))
    scope = {"__name__": "__main__"}
    for number, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        exec(compile(source, f"{path} cell {number}", "exec"), scope)
    print(f"{path}: every code cell ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
