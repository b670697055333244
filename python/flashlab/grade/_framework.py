"""The grader's machinery: checks, reports, the worker process and its limits, the release."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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


class NotRun(Exception):
    """A check that cannot run on this machine (lab 06's GPU checks where there is no GPU): it
    scores 0 and is reported NOT RUN with the reason, never as a pass."""


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
    """One graded test of a lab: `run(submission)` raises Failure (or any error) when it fails,
    NotRun when it cannot run here; it may return a str that says what it found."""

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
    # How the worker turns the submission's path into what the checks get: None imports it as a
    # Python module; lab 06 compiles it (nvcc) and loads the library.
    load: Optional[Callable] = None
    # What the memory limit bounds: "address_space" (RLIMIT_AS), or "resident" (the worker's
    # resident memory, watched by the grader: CUDA reserves far more address space than it uses).
    memory_rule: str = "address_space"
    requires: str = ""  # what grading needs beyond the package, for `flashlab-grade list`


@dataclass
class TestResult:
    name: str
    points: float
    max_points: float
    message: str
    hint: str = ""
    not_run: bool = False  # could not run here (no GPU): 0 points, never a pass

    @property
    def passed(self) -> bool:
        return not self.not_run and self.points == self.max_points

    @property
    def status(self) -> str:
        return "not run" if self.not_run else "passed" if self.passed else "failed"

    def to_dict(self) -> dict:
        """A test as autograding services' results.json has it. Their status is passed or failed:
        a check not run is "failed" there, with 0 points and its output saying NOT RUN and why."""
        output = ("NOT RUN: " if self.not_run else "") + self.message + (f"\nHint: {self.hint}" if self.hint else "")
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

    @property
    def not_run_note(self) -> str:
        """What was not run here, and why (empty when every check ran)."""
        skipped = [r for r in self.results if r.not_run]
        if not skipped:
            return ""
        points = sum(r.max_points for r in skipped)
        reason = skipped[0].message.removeprefix("not run: ")
        return (f"NOT RUN here: {len(skipped)} checks worth {points:g} points, {reason}. They score 0 here and count "
                "only where they run.")

    def to_dict(self) -> dict:
        """The results.json format autograding services accept (score, tests, output)."""
        output = f"Lab {self.lab.key} ({self.lab.title}): {self.score:g} / {self.max_score:g}"
        for line in (self.note, self.not_run_note):
            if line:
                output += f"\n{line}"
        return {"score": self.score, "max_score": self.max_score, "output": output,
                "tests": [r.to_dict() for r in self.results]}

    def write_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    def text(self) -> str:
        lines = [f"Lab {self.lab.key}: {self.lab.title}", f"submission: {self.submission}", ""]
        marks = {"passed": "PASS", "failed": "FAIL", "not run": "NOT RUN"}
        for r in self.results:
            lines.append(f"[{marks[r.status]}] {r.name}: {r.points:g} / {r.max_points:g}")
            for line in r.message.splitlines():
                lines.append(f"       {line}")
            if r.hint and not r.passed:
                lines.append(f"       hint: {r.hint}")
        for note in (self.note, self.not_run_note):
            if note:
                lines += ["", note]
        lines += ["", f"score: {self.score:g} / {self.max_score:g}"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _labs() -> dict:
    from . import (lab01_online_softmax, lab02_tiled_attention, lab03_backward, lab04_flash_decoding,
                   lab05_io_model_experiment, lab06_gpu_kernel)
    chosen = (lab01_online_softmax.LAB, lab02_tiled_attention.LAB, lab03_backward.LAB, lab04_flash_decoding.LAB,
              lab05_io_model_experiment.LAB, lab06_gpu_kernel.LAB)
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
        module = (lab.load or _load_submission)(path)
    except BaseException as error:  # noqa: BLE001 (a submission may raise anything)
        message = f"the submission does not load: {type(error).__name__}: {error}"
        for check in lab.checks:
            emit({"name": check.name, "passed": False, "message": message, "hint": "run the file on its own first"})
        return 0
    for check in lab.checks:
        try:
            said = check.run(module)  # a check may say what it found (a str), or nothing
            emit({"name": check.name, "passed": True, "message": said if isinstance(said, str) else "ok", "hint": ""})
        except Failure as failure:
            emit({"name": check.name, "passed": False, "message": failure.message, "hint": failure.hint or check.hint})
        except NotRun as reason:
            emit({"name": check.name, "passed": False, "not_run": True, "message": str(reason), "hint": ""})
        except BaseException as error:  # noqa: BLE001
            hint = next((h for phrase, h in lab.error_hints if phrase in str(error)), check.hint)
            if isinstance(error, NotImplementedError):
                hint = "write the function the TODO marks"
            emit({"name": check.name, "passed": False, "message": _describe_error(error), "hint": hint})
    return 0


SCRATCH_VARIABLE = "FLASHLAB_GRADE_SCRATCH"  # the worker's scratch folder, made and removed by grade()


def scratch_folder() -> str:
    """The worker's scratch folder (grade() gives one; a new temporary one otherwise)."""
    return os.environ.get(SCRATCH_VARIABLE) or tempfile.mkdtemp(prefix="flashlab_grade_")


def _limit_memory(megabytes: Optional[int]):
    def apply():
        os.setsid()  # a process group of its own: a time limit ends the worker and whatever it started
        if megabytes is not None:
            import resource
            limit = megabytes * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def _resident_megabytes(pid: int) -> float:
    """The resident memory of a process (Linux /proc; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return 0.0


def run_limited(command, *, env=None, cwd=None, time_limit: float, memory_limit: int,
                memory_rule: str = "address_space"):
    """Runs `command` with its output captured, under `time_limit` seconds and `memory_limit` MB:
    of address space (RLIMIT_AS), or, with memory_rule "resident", of resident memory, which the
    grader watches and ends the process past. Returns (stdout, stderr, returncode, note), the note
    saying which limit ended it ("" when none did). The process and everything it started end
    with it."""
    posix = os.name == "posix"
    preexec = _limit_memory(memory_limit if memory_rule == "address_space" else None) if posix else None
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                               preexec_fn=preexec)

    def end():
        if posix:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the worker's group: it and, say, its nvcc
            except (ProcessLookupError, PermissionError):
                pass
        process.kill()
        return process.communicate()

    watch = memory_rule == "resident"
    deadline = time.monotonic() + time_limit
    while True:
        try:
            out, err = process.communicate(timeout=max(0.01, min(0.2 if watch else time_limit, deadline - time.monotonic())))
            return out, err, process.returncode, ""
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            out, err = end()
            return out, err, process.returncode, (
                f"The grading stopped at its time limit ({time_limit:g} s): the checks not reported took too long "
                "(a loop that never ends?).")
        if watch and _resident_megabytes(process.pid) > memory_limit:
            out, err = end()
            return out, err, process.returncode, (
                f"The grading stopped at its memory limit ({memory_limit} MB resident): the submission kept "
                "allocating; the checks not reported get 0.")


def grade(lab: str, submission, *, time_limit: float = 120.0, memory_limit: int = 4096) -> Report:
    """Grades `submission` (a path to the lab's file) on every check of `lab`, in a worker process
    with `time_limit` seconds and `memory_limit` MB (of address space, or for lab 06 of resident
    memory); returns the Report."""
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
    # A scratch folder for what the worker builds (lab 06's library), removed here even when a
    # limit ended the worker.
    with tempfile.TemporaryDirectory(prefix="flashlab_grade_") as scratch:
        env[SCRATCH_VARIABLE] = scratch
        out, err, returncode, note = run_limited(command, env=env, cwd=str(path.resolve().parent),
                                                 time_limit=time_limit, memory_limit=memory_limit,
                                                 memory_rule=found.memory_rule)
    done = {}
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the submission's own prints
        if isinstance(record, dict) and "name" in record and "passed" in record:
            done[record["name"]] = record
    if not note and returncode != 0:
        last = (err.strip().splitlines() or ["no message"])[-1]
        note = f"The grader's worker ended early (exit status {returncode}: {last}); the checks not reported get 0."
    report = Report(lab=found, submission=str(submission), note=note)
    for check in found.checks:
        record = done.get(check.name)
        if record is None:
            reason = ("not finished: the time limit" if "time limit" in note else
                      "not finished: the memory limit" if "memory limit" in note else "not finished: the worker ended")
            report.results.append(TestResult(check.name, 0, check.points, reason, check.hint))
        else:
            report.results.append(TestResult(check.name, check.points if record["passed"] else 0, check.points,
                                             record["message"], record["hint"], bool(record.get("not_run"))))
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
