"""The grader's machinery: checks, reports, the worker process and its limits, the release."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional


class Failure(Exception):
    """A check that did not pass: what was wrong, and the hint meant for that mistake."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


# What the memory model says when a tile reaches past a matrix's edge (a Range check, a load), and
# the hint for it: a lab's error_hints.
OVERRUN_PHRASES = ("is out of range", "outside its")
OVERRUN_HINT = "a block overruns the sequence: the last block is narrower, Range(begin, min(block, n - begin))"


def overrun_hints(hint: str = OVERRUN_HINT) -> list:
    return [(phrase, hint) for phrase in OVERRUN_PHRASES]


def traffic_differences(got: dict, expected: dict) -> str:
    """The tensors whose HBM traffic (counters["tensors"]) differs from the closed form's: elements
    read and written, each beside the closed form's."""
    def count(tensors, name, key):
        return tensors.get(name, {}).get(key, 0)
    return "; ".join(f"{n}: read {count(got, n, 'read_elements')} (closed form {count(expected, n, 'read_elements')}), "
                     f"written {count(got, n, 'write_elements')} ({count(expected, n, 'write_elements')})"
                     for n in sorted(set(got) | set(expected)) if got.get(n) != expected.get(n))


@dataclass
class Check:
    """One graded test of a lab: `run(submission)` raises Failure (or any error) when it fails."""

    name: str
    points: int
    run: Callable
    hint: str = ""  # for failures that come with no hint of their own (an exception, a crash)


@dataclass
class Lab:
    key: str          # "01"
    folder: str       # "01_online_softmax": notebooks/labs/<folder>
    title: str
    submission: str   # the file a student hands in: "softmax.py"
    checks: list
    # Hints for the errors a mistake raises: (a phrase of the error's message, the hint).
    error_hints: list = field(default_factory=list)


@dataclass
class TestResult:
    name: str
    points: float
    max_points: float
    message: str
    hint: str = ""

    @property
    def passed(self) -> bool:
        return self.points == self.max_points

    def to_dict(self) -> dict:
        """A test as autograding services' results.json has it."""
        output = self.message + (f"\nHint: {self.hint}" if self.hint else "")
        return {"name": self.name, "score": self.points, "max_score": self.max_points,
                "status": "passed" if self.passed else "failed", "output": output}


@dataclass
class Report:
    lab: Lab
    submission: str
    results: list = field(default_factory=list)
    note: str = ""  # what stopped the grading early (a time or memory limit, a crash)

    @property
    def score(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_score(self) -> float:
        return sum(r.max_points for r in self.results)

    def to_dict(self) -> dict:
        """The results.json format autograding services accept (score, tests, output)."""
        output = f"Lab {self.lab.key} ({self.lab.title}): {self.score:g} / {self.max_score:g}"
        if self.note:
            output += f"\n{self.note}"
        return {"score": self.score, "max_score": self.max_score, "output": output,
                "tests": [r.to_dict() for r in self.results]}

    def write_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    def text(self) -> str:
        lines = [f"Lab {self.lab.key}: {self.lab.title}", f"submission: {self.submission}", ""]
        for r in self.results:
            mark = "PASS" if r.passed else "FAIL"
            lines.append(f"[{mark}] {r.name}: {r.points:g} / {r.max_points:g}")
            for line in r.message.splitlines():
                lines.append(f"       {line}")
            if r.hint and not r.passed:
                lines.append(f"       hint: {r.hint}")
        if self.note:
            lines += ["", self.note]
        lines += ["", f"score: {self.score:g} / {self.max_score:g}"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _labs() -> dict:
    from . import (lab01_online_softmax, lab02_tiled_attention, lab03_backward, lab04_flash_decoding,
                   lab05_io_model_experiment)
    chosen = (lab01_online_softmax.LAB, lab02_tiled_attention.LAB, lab03_backward.LAB, lab04_flash_decoding.LAB,
              lab05_io_model_experiment.LAB)
    return {lab.key: lab for lab in chosen}


def labs() -> list:
    """Every lab, in the order a course teaches them."""
    return list(_labs().values())


def find_lab(name: str) -> Lab:
    """A lab by its number ("01", "1") or its folder ("01_online_softmax")."""
    table = _labs()
    key = str(name)
    for lab in table.values():
        if key in (lab.key, lab.folder) or (key.isdigit() and int(key) == int(lab.key)):
            return lab
    raise ValueError(f"lab {name!r} is unknown; allowed: " + ", ".join(f"{l.key} ({l.folder})" for l in table.values()))


# ------------------------------------------------------------------------------------------------
# The worker: runs one lab's checks on one submission, in a process of its own, and prints one JSON
# line per check as it ends, so that a submission that hangs or eats memory loses only the checks
# it had not finished, and the grader itself never hangs.

def _load_submission(path: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    return module


def _describe_error(error: BaseException) -> str:
    if isinstance(error, NotImplementedError):
        return f"not written yet: {error or 'a function of the skeleton'} raises NotImplementedError (its TODO)"
    if isinstance(error, MemoryError):
        return "the submission ran out of memory (the grader's memory limit)"
    frames = traceback.extract_tb(error.__traceback__)
    where = next((f for f in reversed(frames) if f.filename.endswith(os.path.basename(sys.modules.get(
        "submission").__file__ or "?"))), None) if "submission" in sys.modules else None
    at = f" (line {where.lineno}: {where.line})" if where is not None else ""
    return f"{type(error).__name__}: {error}{at}"


def worker_main(lab_name: str, path: str) -> int:
    lab = find_lab(lab_name)
    emit = lambda record: print(json.dumps(record), flush=True)  # noqa: E731
    try:
        module = _load_submission(path)
    except BaseException as error:  # noqa: BLE001 (a submission may raise anything)
        message = f"the submission does not load: {type(error).__name__}: {error}"
        for check in lab.checks:
            emit({"name": check.name, "passed": False, "message": message, "hint": "run the file on its own first"})
        return 0
    for check in lab.checks:
        try:
            check.run(module)
            emit({"name": check.name, "passed": True, "message": "ok", "hint": ""})
        except Failure as failure:
            emit({"name": check.name, "passed": False, "message": failure.message, "hint": failure.hint or check.hint})
        except BaseException as error:  # noqa: BLE001
            hint = next((h for phrase, h in lab.error_hints if phrase in str(error)), check.hint)
            if isinstance(error, NotImplementedError):
                hint = "write the function the TODO marks"
            emit({"name": check.name, "passed": False, "message": _describe_error(error), "hint": hint})
    return 0


def _limit_memory(megabytes: int):
    def apply():
        import resource
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def grade(lab: str, submission, *, time_limit: float = 120.0, memory_limit: int = 4096) -> Report:
    """Grades `submission` (a path to the lab's file) on every check of `lab`, in a worker process
    with `time_limit` seconds and `memory_limit` MB of address space; returns the Report."""
    found = find_lab(lab)
    path = Path(submission)
    if not path.is_file():
        raise ValueError(f"submission {str(submission)!r} is not a file; allowed: the lab's {found.submission}")
    if not 1 <= time_limit <= 3600:
        raise ValueError(f"time_limit = {time_limit}; allowed: 1..3600 seconds")
    if not 256 <= memory_limit <= 1 << 20:
        raise ValueError(f"memory_limit = {memory_limit}; allowed: 256..{1 << 20} MB")
    command = [sys.executable, "-m", "flashlab.grade._worker", found.key, str(path.resolve())]
    # The worker runs in the submission's folder (its own imports), and finds this very package
    # there too: its parent folder first on the path, absolute.
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_parent] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=_limit_memory(memory_limit) if os.name == "posix" else None,
                               cwd=str(path.resolve().parent))
    note = ""
    try:
        out, err = process.communicate(timeout=time_limit)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        note = f"The grading stopped at its time limit ({time_limit:g} s): the checks not reported took too long (a loop that never ends?)."
    done = {}
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the submission's own prints
        if isinstance(record, dict) and "name" in record and "passed" in record:
            done[record["name"]] = record
    if not note and process.returncode != 0:
        last = (err.strip().splitlines() or ["no message"])[-1]
        note = f"The grader's worker ended early (exit status {process.returncode}: {last}); the checks not reported get 0."
    report = Report(lab=found, submission=str(submission), note=note)
    for check in found.checks:
        record = done.get(check.name)
        if record is None:
            reason = "not finished: the time limit" if "time limit" in note else "not finished: the worker ended"
            report.results.append(TestResult(check.name, 0, check.points, reason, check.hint))
        else:
            report.results.append(TestResult(check.name, check.points if record["passed"] else 0, check.points,
                                             record["message"], record["hint"]))
    return report


def release(labs_dir, out_dir) -> list:
    """Writes the student version of the labs: everything in `labs_dir` but its solutions/ folder
    and the instructor pages (INSTRUCTOR.md).
    Refuses an `out_dir` that exists and is not empty (nothing is overwritten). Returns the files."""
    source, target = Path(labs_dir), Path(out_dir)
    if not (source / "README.md").is_file():
        raise ValueError(f"labs_dir {str(labs_dir)!r} has no README.md; allowed: the course's notebooks/labs")
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not empty; allowed: a new or empty folder")
    written = []
    for file in sorted(source.rglob("*")):
        relative = file.relative_to(source)
        if relative.parts[0] == "solutions" or relative.name == "INSTRUCTOR.md" or "__pycache__" in relative.parts \
                or not file.is_file():
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, destination)
        written.append(str(relative))
    return written
