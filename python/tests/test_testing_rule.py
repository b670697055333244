"""The reference-test rule from Python (flashlab._core.testing, the C++ library itself), on
hand-made numbers and on implementations written in numpy: no torch, no GPU."""
import math

import numpy as np
import pytest

from flashlab import _core

rule = _core.testing


def test_within_rule_is_factor_times_naive_plus_slack():
    # 2 x 0.01 + 1e-5 = 0.02001: 0.02 is in, 0.0201 is out; a NaN fails whatever the error.
    assert rule.within_rule(0.02, 0.01, 2.0, 1e-5)
    assert rule.within_rule(0.02001, 0.01, 2.0, 1e-5)
    assert not rule.within_rule(0.0201, 0.01, 2.0, 1e-5)
    assert not rule.within_rule(0.0, 0.01, 2.0, 1e-5, nan_count=1)
    # The gradients' factor: 3 x 0.01 + 1e-4 = 0.0301.
    assert rule.within_rule(0.0301, 0.01, 3.0, 1e-4)
    assert not rule.within_rule(0.0302, 0.01, 3.0, 1e-4)


def test_rounding_slack_by_hand():
    # bf16 (8 significant bits): fl(1 + 0.3) = 1.296875 (spacing 2^-7 above 1); minus 0.3 is
    # 0.996875, which rounds to 0.99609375 (spacing 2^-8 below 1): 2^-8 from 1, slack 2 x 2^-8.
    assert rule.rounding_slack("bf16", [1.0]) == 2 * 2.0 ** -8
    # fp16 (11 bits): fl(1.3) = 1.2998046875, minus 0.3 = 0.99980468..., nearer 1 than
    # 0.99951171875 (spacing 2^-11 below 1): back to 1 exactly, slack 0.
    assert rule.rounding_slack("fp16", [1.0]) == 0.0
    assert rule.rounding_slack("fp32", [1.0, 7.0]) == 0.0
    # Infinite references (fully masked rows' LSE) are left out; the largest value decides.
    assert rule.rounding_slack("bf16", [-math.inf, 1.0, 0.0]) == 2 * 2.0 ** -8


def test_compare_finds_the_largest_error_and_where():
    expected = np.zeros((2, 3, 4))
    got = np.zeros((2, 3, 4), dtype=np.float32)
    got[1, 2, 3] = 0.5
    got[0, 1, 0] = -0.25
    report = rule.compare(got, expected)
    assert report["max_error"] == 0.5
    assert (report["row"], report["head"], report["col"]) == (1, 2, 3)
    assert report["nan_count"] == 0
    expected[0, 0, 0] = got[0, 0, 0] = -math.inf  # a fully masked row's LSE matches itself
    assert rule.compare(got, expected)["max_error"] == 0.5
    got[0, 0, 1] = math.nan
    report = rule.compare(got, expected)
    assert report["nan_count"] == 1 and report["max_error"] == math.inf


def small_problem(causal=False, bottom_right=True, seqlen_q=17, seqlen_k=29, heads=(4, 2), dtype="bf16"):
    problem = _core.Problem()
    problem.batch, (problem.heads_q, problem.heads_kv) = 2, heads
    problem.seqlen_q, problem.seqlen_k, problem.head_dim = seqlen_q, seqlen_k, 16
    problem.dtype = dtype
    problem.causal = causal
    problem.alignment = "bottom_right" if bottom_right else "top_left"
    return problem


def numpy_attention(problem, q, k, v, mask_shift=0):
    """Exact attention in float64 from the C++ mask rule, O and LSE as float32; mask_shift=1
    plants an off-by-one (every query sees one key past its mask)."""
    fields = rule.problem_fields(problem)
    group = fields["heads_q"] // fields["heads_kv"]
    o = np.zeros(q.shape, dtype=np.float32)
    lse = np.zeros((q.shape[0], q.shape[1], 1), dtype=np.float32)
    seqlen_q, seqlen_k = fields["seqlen_q"], fields["seqlen_k"]
    for b in range(fields["batch"]):
        visible = np.array(rule.visible_keys(problem, b))
        if mask_shift:
            visible = visible | np.roll(visible, mask_shift, axis=1)
        rows_q, rows_k = slice(b * seqlen_q, (b + 1) * seqlen_q), slice(b * seqlen_k, (b + 1) * seqlen_k)
        for h in range(fields["heads_q"]):
            scores = q[rows_q, h].astype(np.float64) @ k[rows_k, h // group].T.astype(np.float64)
            scores = np.where(visible, scores * fields["softmax_scale"], -np.inf)
            row_max = scores.max(axis=1, keepdims=True)
            safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
            p = np.exp(scores - safe_max)
            total = p.sum(axis=1, keepdims=True)
            o[rows_q, h] = np.where(total > 0, (p / np.where(total > 0, total, 1)) @ v[rows_k, h // group], 0.0)
            lse[rows_q, h, 0] = np.where(total[:, 0] > 0, np.log(np.where(total[:, 0] > 0, total[:, 0], 1)) +
                                         safe_max[:, 0], -np.inf)
    return o, lse


def test_an_exact_implementation_passes_and_an_off_by_one_fails():
    problem = small_problem(causal=True)
    exact = rule.check_forward_case(lambda p, q, k, v: numpy_attention(p, q, k, v), problem)
    assert exact.status == "passed", exact.report
    assert exact.report.startswith("passed batch 2, heads 4/2, seqlen 17x29")
    shifted = rule.check_forward_case(lambda p, q, k, v: numpy_attention(p, q, k, v, mask_shift=1), problem)
    assert shifted.status == "failed", shifted.report
    assert shifted.report.startswith("FAILED ") and "O: max error" in shifted.report
    assert shifted.o_error > 2 * shifted.o_naive_error + 1e-5


def test_fully_masked_rows_must_be_exact():
    # Bottom-right causal with 29 queries and 17 keys: queries 0-11 see no key.
    problem = small_problem(causal=True, seqlen_q=29, seqlen_k=17)

    def leaks(p, q, k, v):
        o, lse = numpy_attention(p, q, k, v)
        o[np.isinf(lse[:, :, 0])] = 1e-3
        return o, lse

    result = rule.check_forward_case(leaks, problem)
    assert result.fully_masked_rows == 2 * 4 * 12
    assert result.status == "failed" and "fully masked rows not exactly O = 0, LSE = -inf" in result.report


def test_a_value_error_is_a_refusal_with_its_message():
    def refuses(p, q, k, v):
        raise ValueError("head_dim = 16; allowed: 32")

    result = rule.check_forward_case(refuses, small_problem())
    assert result.status == "refused"
    assert result.report.endswith(": head_dim = 16; allowed: 32")


def test_other_exceptions_propagate():
    def broken(p, q, k, v):
        raise KeyError("a bug in the implementation")

    with pytest.raises(KeyError, match="a bug in the implementation"):
        rule.check_forward_case(broken, small_problem())


def test_outputs_of_the_wrong_shape_or_type_fail_the_case():
    wrong_shape = rule.check_forward_case(lambda p, q, k, v: (q[:, :, :8].copy(), None), small_problem(),
                                          check_lse=False)
    assert wrong_shape.status == "failed" and "o has shape (34, 4, 8); expected (34, 4, 16)" in wrong_shape.report
    float64 = rule.check_forward_case(lambda p, q, k, v: (q.astype(np.float64), None), small_problem(),
                                      check_lse=False)
    assert float64.status == "failed" and "expected a C-contiguous float32 numpy array" in float64.report
    no_lse = rule.check_forward_case(lambda p, q, k, v: (numpy_attention(p, q, k, v)[0], None), small_problem())
    assert no_lse.status == "failed" and "gave no LSE" in no_lse.report
    o_alone = rule.check_forward_case(lambda p, q, k, v: (numpy_attention(p, q, k, v)[0], None), small_problem(),
                                      check_lse=False)
    assert o_alone.status == "passed" and "LSE: not checked" in o_alone.report


def test_a_nondeterministic_implementation_fails():
    calls = []

    def flaky(p, q, k, v):
        o, lse = numpy_attention(p, q, k, v)
        calls.append(1)
        if len(calls) == 2:
            o[0, 0, 0] += 0.25
        return o, lse

    result = rule.check_forward_case(flaky, small_problem())
    assert result.status == "failed" and "not deterministic" in result.report


def test_the_default_grid_is_the_cpp_one():
    grid = rule.default_forward_grid("bf16")
    assert len(grid) == 40
    assert [tuple(s) for s in rule.official_odd_shapes()] == [
        (113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1023, 1024), (1024, 1023), (1, 1),
        (239, 1), (799, 3)]
    fields = [rule.problem_fields(p) for p in grid]
    assert {(f["heads_q"], f["heads_kv"]) for f in fields} == {(2, 2), (4, 2), (3, 1)}
    assert {f["head_dim"] for f in fields} == {40, 59, 64, 96, 111, 128, 256}
    assert sum(f["varlen"] for f in fields) == 2
    assert sum(f["window_left"] >= 0 or f["window_right"] >= 0 for f in fields) == 5
    assert sum(f["causal"] and not f["bottom_right"] for f in fields) == 11
    assert all(f["dtype"] == "bf16" for f in fields)


def test_summary_lists_what_did_not_pass_then_the_counts():
    problem = small_problem()
    passed = rule.check_forward_case(lambda p, q, k, v: numpy_attention(p, q, k, v), problem)
    refused = rule.check_forward_case(lambda *a: (_ for _ in ()).throw(ValueError("no")), problem)
    summary = rule.forward_summary([passed, refused])
    assert summary.splitlines()[-1] == "1 passed, 0 failed, 1 refused, of 2 cases"
    assert summary.splitlines()[0].startswith("REFUSED ") and summary.splitlines()[0].endswith(": no")
