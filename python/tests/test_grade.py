"""The course labs' grader (flashlab.grade, notebooks/labs): every reference solution gets full
marks, every untouched skeleton zero with a clear message, planted mistakes lose the points they
should with the hint meant for them, and a submission that never ends is stopped by the limit."""

import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("numpy")
from flashlab import grade  # noqa: E402
from flashlab.grade import _framework, lab06_gpu_kernel as lab06  # noqa: E402

import lab06_mistakes  # noqa: E402

LABS = Path(__file__).resolve().parents[2] / "notebooks" / "labs"
PYTHON_LABS = [lab for lab in grade.labs() if lab.load is None]  # lab 06 is CUDA C++, below


def solution(lab):
    return LABS / "solutions" / lab.folder / lab.submission


def planted(tmp_path, lab_key, old, new, count=1):
    """The reference solution with one mistake planted (old replaced by new, `count` times)."""
    lab = grade.find_lab(lab_key)
    text = solution(lab).read_text()
    assert text.count(old) == count, f"the solution no longer has {old!r}"
    path = tmp_path / lab.submission
    path.write_text(text.replace(old, new))
    return grade.grade(lab_key, path)


def results(report):
    return {r.name: r for r in report.results}


@pytest.mark.parametrize("lab", PYTHON_LABS, ids=lambda lab: lab.folder)
def test_reference_solution_gets_full_marks(lab):
    report = grade.grade(lab.key, solution(lab))
    assert report.score == report.max_score == 10, report.text()


@pytest.mark.parametrize("lab", PYTHON_LABS, ids=lambda lab: lab.folder)
def test_untouched_skeleton_gets_zero_with_a_clear_message(lab):
    report = grade.grade(lab.key, LABS / lab.folder / lab.submission)
    assert report.score == 0 and report.max_score == 10
    for r in report.results:
        assert "not written yet" in r.message and "NotImplementedError" in r.message, r.message
        assert r.hint == "write the function the TODO marks"


def test_no_rescale_of_the_running_sum_loses_the_online_softmax(tmp_path):
    report = planted(tmp_path, "01", "        mem.scale_rows(d, rescale)  # line 5", "        pass  # line 5")
    r = results(report)
    assert r["online softmax is correct on odd shapes"].points == 0
    assert "never rescaled" in r["online softmax is correct on odd shapes"].message
    assert "exp(m_old - m_new)" in r["online softmax is correct on odd shapes"].hint
    assert report.score == 8  # the passes are still right, and the other two algorithms


def test_a_block_that_overruns_the_row_is_named(tmp_path):
    report = planted(tmp_path, "01", "yield Range(begin, min(block_cols, X.cols - begin))", "yield Range(begin, block_cols)")
    r = results(report)["three-pass softmax is correct on odd shapes"]
    assert r.points == 0 and "outside its" in r.message and "overruns" in r.hint


def test_holding_every_block_of_x_loses_the_bounded_sram(tmp_path):
    report = planted(tmp_path, "01", "        del v, x\n", "        kept.append((v, x))\n")
    assert report.results[-1].name == "softmax(X) V holds one block at a time (a bounded SRAM)"
    # kept is undefined: the mistake must be written out in full
    text = Path(report.submission).read_text().replace("    state = start_softmax_state", "    kept = []\n    state = start_softmax_state")
    Path(report.submission).write_text(text)
    report = grade.grade("01", report.submission)
    r = results(report)["softmax(X) V holds one block at a time (a bounded SRAM)"]
    assert r.points == 0 and "free each block's tiles" in r.hint
    assert report.score == 9


def test_causal_off_by_one_loses_the_masks_only(tmp_path):
    report = planted(tmp_path, "02", "if coverage == BlockCoverage.partial or head.modifies_scores():",
                     "if head.modifies_scores():")
    r = results(report)
    assert r["FA2 forward is correct under causal masks and a window"].points == 0
    assert "off by one" in r["FA2 forward is correct under causal masks and a window"].hint
    assert r["FA2 forward is correct on the odd shapes, no mask"].passed
    assert r["HBM traffic equals FA2's closed form for the tiling used"].passed


def test_no_rescale_of_o_loses_correctness(tmp_path):
    report = planted(tmp_path, "02", "    mem.scale_rows(state.o, rescale)\n", "")
    r = results(report)["FA2 forward is correct on the odd shapes, no mask"]
    assert r.points == 0 and "exp(m - m_new)" in r.hint


def test_keeping_all_of_k_in_sram_loses_the_arena_and_the_traffic(tmp_path):
    report = planted(tmp_path, "02", "        q = mem.load(x.Q, rows)  # line 4\n",
                     "        q = mem.load(x.Q, rows)  # line 4\n        k_all = mem.load(x.K, Range(0, head.seqlen_k))\n")
    r = results(report)
    assert r["runs within FA2's working set (a bounded SRAM)"].points == 0
    assert "load K_j and V_j inside the loop" in r["runs within FA2's working set (a bounded SRAM)"].hint
    assert r["HBM traffic equals FA2's closed form for the tiling used"].points == 0
    assert r["FA2 forward is correct on the odd shapes, no mask"].passed


def test_a_submission_that_never_ends_is_stopped(tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text(solution(grade.find_lab("01")).read_text().replace(
        "def softmax_online(mem, X, Y, block_cols):\n", "def softmax_online(mem, X, Y, block_cols):\n    while True:\n        pass\n"))
    report = grade.grade("01", path, time_limit=8)
    assert "time limit" in report.note
    r = results(report)
    assert r["three-pass softmax is correct on odd shapes"].passed  # finished before the loop
    assert r["online softmax is correct on odd shapes"].points == 0
    assert "time limit" in r["online softmax is correct on odd shapes"].message
    assert report.score == 3


def test_a_submission_that_does_not_load(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text("def fa2_forward(:\n")
    report = grade.grade("02", path)
    assert report.score == 0 and all("does not load: SyntaxError" in r.message for r in report.results)


def test_command_line_report_json_and_bad_input(tmp_path):
    out = tmp_path / "results.json"
    lab = grade.find_lab("02")
    run = subprocess.run([sys.executable, "-m", "flashlab.grade", "02", str(solution(lab)), "--json", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "score: 10 / 10" in run.stdout
    data = json.loads(out.read_text())
    assert data["score"] == 10 and len(data["tests"]) == 5
    assert all({"name", "score", "max_score", "status", "output"} <= set(t) for t in data["tests"])
    for argv, phrase in [(["07", str(solution(lab))], "lab '07' is unknown"),
                         (["02", str(tmp_path / "missing.py")], "is not a file"),
                         (["02", str(solution(lab)), "--time-limit", "0"], "time_limit = 0.0"),
                         (["02", str(solution(lab)), "--memory-limit", "10"], "memory_limit = 10"),
                         (["release", str(tmp_path / "out"), "--labs", str(tmp_path)], "has no README.md")]:
        bad = subprocess.run([sys.executable, "-m", "flashlab.grade", *argv], capture_output=True, text=True)
        assert bad.returncode == 2 and phrase in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_release_leaves_the_solutions_out_and_never_overwrites(tmp_path):
    files = grade.release(LABS, tmp_path / "release")
    assert "01_online_softmax/softmax.py" in files and "02_tiled_attention/attention.py" in files
    assert "01_online_softmax/lab.ipynb" in files and "README.md" in files
    assert not any(f.startswith("solutions") or f.endswith("INSTRUCTOR.md") for f in files)
    assert not (tmp_path / "release" / "solutions").exists()
    # Lab 06: the skeleton, never the solution
    assert {"06_gpu_kernel/attention.cu", "06_gpu_kernel/lab.ipynb"} <= set(files)
    released = (tmp_path / "release" / "06_gpu_kernel" / "attention.cu").read_text()
    assert released == lab06_mistakes.SKELETON.read_text() != lab06_mistakes.SOLUTION.read_text()
    with pytest.raises(ValueError, match="not empty"):
        grade.release(LABS, tmp_path / "release")


def test_a_submission_that_allocates_without_bound_is_stopped(tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text(solution(grade.find_lab("01")).read_text().replace(
        "def softmax_online(mem, X, Y, block_cols):\n",
        "def softmax_online(mem, X, Y, block_cols):\n    hoard = [bytearray(1 << 26) for _ in range(1 << 12)]\n"))
    report = grade.grade("01", path, memory_limit=1024)
    r = results(report)
    assert r["online softmax is correct on odd shapes"].points == 0
    assert "ran out of memory" in r["online softmax is correct on odd shapes"].message
    assert r["softmax(X) V in one pass is correct on odd shapes"].passed  # the other functions still graded
    assert report.score == 7


def test_lab05_grader_measures_what_the_theory_says():
    from flashlab.grade import lab05_io_model_experiment as lab05
    numbers = lab05.measured()
    assert 1.9 <= numbers["fa2_exponent_in_n"] <= 2.0  # N^2 d^2 / M, with the N d term fading
    assert -1.15 <= numbers["fa2_exponent_in_m"] <= -0.9  # 1 / M
    assert 0.5 <= numbers["crossover_m_over_d2"] <= 2  # Saha and Ye: Theta(d^2)
    assert numbers["fa1_over_fa2"] > 1


def test_lab05_the_last_winner_for_the_crossover_gets_its_hint(tmp_path):
    report = planted(tmp_path, "05", "        if hbm_elements(\"square_tiling\", 1024, d, sram_bytes) >= hbm_elements(\"fa2\", 1024, d, sram_bytes):\n            return ratio\n",
                     "        if hbm_elements(\"square_tiling\", 1024, d, sram_bytes) >= hbm_elements(\"fa2\", 1024, d, sram_bytes):\n            return 2 ** ((k - 1) / 2)\n")
    r = results(report)["the Saha-Ye crossover, M / d^2"]
    assert r.points == 0 and "last M at which square tiling still wins" in r.hint
    assert report.score == 8


def test_lab05_a_fit_without_logs_loses_the_exponent(tmp_path):
    report = planted(tmp_path, "05", "np.polyfit(np.log(xs), np.log(ys), 1)", "np.polyfit(xs, ys, 1)")
    r = results(report)
    assert r["FA2's exponent in N"].points == 0 and "polyfit(log N, log y, 1)" in r["FA2's exponent in N"].hint
    assert r["FA1's traffic over FA2's"].passed


def test_lab03_a_wrong_d_is_recognised_from_a_right_dv(tmp_path):
    report = planted(tmp_path, "03", "d_row = mem.row_dot(TensorId.D, d_out, o)", "d_row = mem.row_dot(TensorId.D, d_out, d_out)")
    r = results(report)
    assert r["gradients within the 3x rule on odd shapes, no mask"].points == 0
    assert "dV is right, so P is" in r["gradients within the 3x rule on odd shapes, no mask"].hint
    assert r["HBM traffic equals FA2 backward's closed form for the tiling used"].passed


def test_lab03_unseen_keys_left_unwritten_lose_their_check(tmp_path):
    report = planted(tmp_path, "03", "            for target, width in ((x.dK, d), (x.dV, dv)):\n"
                     "                zeros = mem.zeros(target.id, cols, Range(0, width))\n"
                     "                mem.store(target, cols, zeros)\n                del zeros\n", "")
    r = results(report)
    assert r["keys no query sees get zero gradients, never NaN"].points == 0
    assert "NaN" in r["keys no query sees get zero gradients, never NaN"].message
    assert r["gradients within the 3x rule on odd shapes, no mask"].passed


def test_lab04_unnormalised_partials_lose_correctness(tmp_path):
    report = planted(tmp_path, "04", "            lse = finish_softmax_state(mem, state)  # line 7: O_c and LSE_c\n"
                     "            mem.store(o_partial, Range(row * chunks + chunk, 1), state.o)\n",
                     "            mem.store(o_partial, Range(row * chunks + chunk, 1), state.o)\n"
                     "            lse = finish_softmax_state(mem, state)  # line 7: O_c and LSE_c\n")
    r = results(report)
    assert r["split-KV decoding is correct (1 to 8 splits, odd lengths)"].points == 0
    assert "normalised by its own l" in r["split-KV decoding is correct (1 to 8 splits, odd lengths)"].hint
    assert r["HBM traffic equals split-KV's closed form"].passed  # the same traffic, wrong values
    assert r["splits_to_fill: how many splits fill the GPU"].passed


def test_lab04_splits_without_the_key_block_cap(tmp_path):
    report = planted(tmp_path, "04", "    return min(key_blocks, max(1, -(-sms // units)))", "    return max(1, -(-sms // units))")
    r = results(report)["splits_to_fill: how many splits fill the GPU"]
    assert r.points == 0 and "no more chunks than key blocks" in r.hint


# ------------------------------------------------------------------------------------------------
# Lab 06, a CUDA kernel: here (no GPU, or none made visible) nvcc compiles the solution, the
# skeleton and each planted mistake, and every GPU check is reported NOT RUN; gpu/test_grade_lab06.py
# grades them on a GPU.

needs_nvcc = pytest.mark.skipif(lab06.find_nvcc() is None, reason="nvcc is not on the PATH or in CUDA_HOME")
GPU_CHECKS = [check.name for check in lab06.LAB.checks[1:]]


@pytest.fixture(scope="module")
def lab06_reports(tmp_path_factory):
    """The reports of the solution, the skeleton, each planted mistake and a syntax error, graded
    two at a time with no GPU visible (CUDA_VISIBLE_DEVICES empty: the same outcome on a GPU machine)."""
    folder = tmp_path_factory.mktemp("lab06")
    submissions = {"solution": lab06_mistakes.SOLUTION, "skeleton": lab06_mistakes.SKELETON,
                   "syntax_error": lab06_mistakes.write(folder / "syntax_error", lab06_mistakes.SYNTAX_ERROR)}
    for name, replacement in lab06_mistakes.PLANTED.items():
        submissions[name] = lab06_mistakes.write(folder / name, replacement)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = {name: pool.submit(grade.grade, "06", path) for name, path in submissions.items()}
            return {name: future.result() for name, future in futures.items()}


def assert_gpu_checks_not_run(report):
    for r in report.results[1:]:
        assert r.not_run and r.status == "not run" and r.points == 0 and not r.passed, r
        assert r.message.startswith("not run: no GPU"), r.message
    assert "NOT RUN here: 5 checks worth 9 points, no GPU" in report.text()
    tests = report.to_dict()["tests"]
    assert all(t["status"] == "failed" and t["output"].startswith("NOT RUN: not run: no GPU") for t in tests[1:])


@needs_nvcc
@pytest.mark.parametrize("name", ["solution", *lab06_mistakes.PLANTED])
def test_lab06_solution_and_planted_mistakes_compile_and_the_gpu_checks_are_not_run(lab06_reports, name):
    report = lab06_reports[name]
    compiled = report.results[0]
    assert compiled.passed and compiled.message.startswith("compiled for sm_80 in "), report.text()
    assert "compile only: no GPU" in compiled.message
    assert [r.name for r in report.results[1:]] == GPU_CHECKS
    assert_gpu_checks_not_run(report)
    assert report.score == 1 and report.max_score == 10
    assert "[NOT RUN]" in report.text() and "[PASS] compiles with nvcc" in report.text()


@needs_nvcc
def test_lab06_untouched_skeleton_compiles_and_is_not_written_yet(lab06_reports):
    report = lab06_reports["skeleton"]
    compiled = report.results[0]
    assert compiled.points == 0 and compiled.status == "failed"
    assert compiled.message == ("not written yet: TODO 1 (the loop over key blocks), TODO 2 (the online-softmax "
                                "update), TODO 3 (the causal mask's edge) still marked by LAB06_TODO in attention.cu")
    assert compiled.hint == lab06.TODO_HINT
    assert_gpu_checks_not_run(report)
    assert report.score == 0


@needs_nvcc
def test_lab06_a_syntax_error_shows_nvcc_s_first_error_and_its_hint(lab06_reports):
    report = lab06_reports["syntax_error"]
    compiled = report.results[0]
    assert compiled.points == 0 and compiled.hint == lab06.COMPILE_HINT
    lines = compiled.message.splitlines()
    assert lines[0] == "nvcc -arch=sm_80 failed (exit status 2):"
    assert lines[1].startswith("attention.cu(") and "): error: expected a \";\"" in lines[1], compiled.message
    assert "warning" not in compiled.message and len(lines) <= 14
    assert_gpu_checks_not_run(report)


def test_lab06_without_nvcc_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc there
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    report = grade.grade("06", lab06_mistakes.SOLUTION)
    compiled = report.results[0]
    assert compiled.points == 0 and compiled.message == "nvcc not found: not on the PATH, and CUDA_HOME is not set"
    assert "install the CUDA toolkit" in compiled.hint
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    report = grade.grade("06", lab06_mistakes.SOLUTION)
    assert report.results[0].message.endswith(f"not in CUDA_HOME/bin ({tmp_path / 'cuda'})")


def test_lab06_todo_markers_count_only_in_code():
    source = lab06_mistakes.SKELETON.read_text()
    assert lab06.todo_markers(source) == [1, 2, 3]
    assert lab06.todo_markers(lab06_mistakes.SOLUTION.read_text()) == []  # the #define is not a marker
    assert lab06.todo_markers("// LAB06_TODO(1);\n/* LAB06_TODO(2); */\n  LAB06_TODO( 3 );\n") == [3]


def test_the_resident_memory_limit_ends_a_process_that_keeps_allocating():
    start = time.monotonic()
    out, err, status, note = _framework.run_limited(
        [sys.executable, "-c", "import time\nx = bytearray(1536 << 20)\nprint('allocated', flush=True)\ntime.sleep(60)"],
        time_limit=60, memory_limit=512, memory_rule="resident")
    assert "memory limit (512 MB resident)" in note and status != 0
    assert time.monotonic() - start < 30
    out, err, status, note = _framework.run_limited([sys.executable, "-c", "import time; time.sleep(60)"],
                                                    time_limit=1, memory_limit=512, memory_rule="resident")
    assert "time limit (1 s)" in note
    out, err, status, note = _framework.run_limited([sys.executable, "-c", "print('done')"], time_limit=30,
                                                    memory_limit=512, memory_rule="resident")
    assert (out, status, note) == ("done\n", 0, "")


@needs_nvcc
def test_lab06_a_gpu_this_nvcc_cannot_compile_for_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(lab06, "probe_device", lambda: lab06.Device(True, name="an old GPU", arch="sm_60"))
    monkeypatch.setenv(_framework.SCRATCH_VARIABLE, str(tmp_path))
    submission = lab06.load(lab06_mistakes.SOLUTION)
    assert submission.compile_error[0] == "this nvcc cannot compile for the GPU here (sm_60, an old GPU)"
    with pytest.raises(grade.Failure, match="did not compile"):
        submission.require_run()
