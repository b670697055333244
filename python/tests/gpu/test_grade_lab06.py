"""Lab 06's grader on a GPU: the reference solution gets 10 / 10, the untouched skeleton 0 with
"not written yet", each planted mistake (python/tests/lab06_mistakes.py) loses the checks it must
with the hint meant for it, and a kernel that never ends or a host that allocates without bound is
stopped by the limits. Each report's score line is printed (pytest -s shows them;
scripts/device_check.sh lab06 runs this file)."""
import concurrent.futures
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")
from flashlab import grade  # noqa: E402
from flashlab.grade import lab06_gpu_kernel as lab06  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # python/tests: the planted mistakes
import lab06_mistakes  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.own_kernels]

COMPILES, ODD_SHAPES, CAUSAL, RESCALE, LARGE, INSIDE = (check.name for check in lab06.LAB.checks)


def score_line(name, report):
    marks = " ".join(f"{'PASS' if r.passed else 'NOT RUN' if r.not_run else 'FAIL'}:{r.points:g}" for r in report.results)
    return f"lab06 {name:18s} score {report.score:g} / {report.max_score:g}   [{marks}]"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The solution, the skeleton and each planted mistake, graded four at a time; each score line
    printed, and the whole report after it."""
    folder = tmp_path_factory.mktemp("lab06_gpu")
    submissions = {"solution": lab06_mistakes.SOLUTION, "skeleton": lab06_mistakes.SKELETON}
    for name, replacement in lab06_mistakes.PLANTED.items():
        submissions[name] = lab06_mistakes.write(folder / name, replacement)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(grade.grade, "06", path) for name, path in submissions.items()}
        done = {name: future.result() for name, future in futures.items()}
    for name, report in done.items():
        print("\n" + score_line(name, report))
        print(report.text())
    return done


def results(report):
    return {r.name: r for r in report.results}


def test_the_reference_solution_gets_full_marks_on_the_gpu(reports):
    report = reports["solution"]
    assert not any(r.not_run for r in report.results), report.text()
    assert report.score == report.max_score == 10, report.text()
    assert results(report)[COMPILES].message.startswith("compiled for sm_")


def test_the_untouched_skeleton_gets_zero_not_written_yet(reports):
    report = reports["skeleton"]
    assert report.score == 0 and not any(r.not_run for r in report.results), report.text()
    for r in report.results:
        assert r.message.startswith("not written yet: TODO 1 (the loop over key blocks)"), r.message
        assert r.hint == lab06.TODO_HINT


def lost(report, *checks):
    """The checks that failed are exactly `checks`; every other one passed."""
    got = results(report)
    assert not any(r.not_run for r in report.results), report.text()
    assert {name for name, r in got.items() if not r.passed} == set(checks), report.text()
    return got


def test_no_rescale_of_o_loses_correctness_with_the_rescale_hint(reports):
    got = results(reports["no_rescale"])
    for name in (ODD_SHAPES, RESCALE):
        assert got[name].points == 0 and got[name].hint == lab06.RESCALE_HINT, reports["no_rescale"].text()
    assert got[COMPILES].passed and got[INSIDE].passed


def test_a_causal_off_by_one_loses_the_causal_check_only(reports):
    got = lost(reports["causal_off_by_one"], CAUSAL)
    assert got[CAUSAL].hint == lab06.MASK_HINT and "causal" in got[CAUSAL].message
    assert reports["causal_off_by_one"].score == 8


def test_normalising_inside_the_loop_gets_the_normalise_hint(reports):
    got = results(reports["normalise_in_loop"])
    for name in (ODD_SHAPES, RESCALE):
        assert got[name].points == 0 and got[name].hint == lab06.NORMALISE_HINT, reports["normalise_in_loop"].text()
    assert got[COMPILES].passed and got[INSIDE].passed


def test_a_key_block_that_overruns_the_sequence_gets_the_overrun_hint(reports):
    got = results(reports["overrun"])
    assert got[INSIDE].points == 0 and "reads keys past seqlen_k" in got[INSIDE].message
    for name in (INSIDE, ODD_SHAPES):
        assert got[name].hint == lab06.OVERRUN_HINT, reports["overrun"].text()
    assert got[COMPILES].passed


def test_no_visible_gpu_reports_the_gpu_checks_not_run(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    report = grade.grade("06", lab06_mistakes.SOLUTION)
    print("\n" + score_line("solution, no GPU", report))
    assert report.score == 1 and all(r.not_run and r.message.startswith("not run: no GPU") for r in report.results[1:])


def test_a_kernel_that_never_ends_is_stopped_by_the_time_limit(tmp_path):
    report = grade.grade("06", lab06_mistakes.write(tmp_path, lab06_mistakes.NEVER_ENDS), time_limit=15)
    print("\n" + score_line("never_ends", report))
    assert "time limit (15 s)" in report.note, report.text()
    got = results(report)
    assert got[COMPILES].passed  # reported before the kernel hung
    assert got[ODD_SHAPES].points == 0 and got[ODD_SHAPES].message == "not finished: the time limit"


def test_a_host_that_allocates_without_bound_is_stopped_by_the_memory_limit(tmp_path):
    report = grade.grade("06", lab06_mistakes.write(tmp_path, lab06_mistakes.HOARDS_HOST_MEMORY), memory_limit=2048)
    print("\n" + score_line("hoards_memory", report))
    assert "memory limit (2048 MB resident)" in report.note, report.text()
    assert results(report)[ODD_SHAPES].message == "not finished: the memory limit"
