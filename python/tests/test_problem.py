"""flashlab.sim.problem: the C++ Problem with its validation, and HeadProblem's mask rules."""
import math
import subprocess
import sys

import pytest

from flashlab import sim


def test_defaults_follow_the_query_side():
    p = sim.problem(seqlen_q=300, head_dim=48, heads_q=8)
    assert (p.seqlen_k, p.heads_kv, p.value_dim(), p.dtype) == (300, 8, 48, "fp32")
    assert p.scale() == pytest.approx(1 / math.sqrt(48))
    assert p.total_rows_q() == 300


def test_varlen_batch_from_lengths():
    p = sim.problem(head_dim=16, seqlens_q=[3, 5], seqlens_k=[4, 7])
    assert p.varlen() and p.batch == 2
    assert list(p.cu_seqlens_q) == [0, 3, 8] and list(p.cu_seqlens_k) == [0, 4, 11]
    assert (p.seqlen_q, p.seqlen_k) == (5, 7)  # the longest sequences
    assert (p.head(1, 0).seqlen_q, p.head(1, 0).seqlen_k) == (5, 7)


def test_causal_alignment_of_a_head():
    # 3 queries, 5 keys: bottom-right aligns query i with key i + 2, top-left with key i.
    bottom = sim.problem(seqlen_q=3, seqlen_k=5, head_dim=8, causal=True).head(0, 0)
    assert bottom.diagonal_offset() == 2
    assert [bottom.key_visible(0, j) for j in range(5)] == [True, True, True, False, False]
    assert bottom.visible_key_range(0, 3) == (0, 5)
    top = sim.problem(seqlen_q=3, seqlen_k=5, head_dim=8, causal=True, alignment="top_left").head(0, 0)
    assert [top.key_visible(0, j) for j in range(5)] == [True, False, False, False, False]
    assert top.coverage(0, 1, 1, 5) == sim.BlockCoverage.empty
    assert top.coverage(2, 3, 0, 3) == sim.BlockCoverage.full
    assert top.coverage(0, 3, 0, 3) == sim.BlockCoverage.partial


def test_sliding_window():
    head = sim.problem(seqlen_q=10, head_dim=8, window_left=2, window_right=1).head(0, 0)
    assert [j for j in range(10) if head.key_visible(5, j)] == [3, 4, 5, 6]


@pytest.mark.parametrize("fields, message", [
    (dict(seqlen_q=0), "seqlen_q = 0 is out of range; allowed: [1, 1073741824]"),
    (dict(seqlen_q=2**40), "seqlen_q = 1099511627776 is out of range; allowed: [1, 1073741824]"),
    (dict(seqlen_q="long"), "seqlen_q = 'long'; allowed: an integer in [1, 1073741824]"),
    (dict(head_dim=0), "head_dim = 0 is out of range; allowed: [1, 65536]"),
    (dict(heads_q=4, heads_kv=3), "heads_q = 4 is not a multiple of heads_kv = 3; allowed: heads_kv divides heads_q"),
    (dict(heads_q=2, heads_kv=4), "heads_kv = 4 is out of range; allowed: [1, 2]"),
    (dict(dtype="fp8"), "dtype 'fp8' is unknown; allowed: fp32, fp16, bf16"),
    (dict(alignment="left"), "alignment 'left' is unknown; allowed: top_left, bottom_right"),
    (dict(dropout_p=1.0), "dropout probability = 1.000000; allowed: [0, 1)"),
    (dict(softcap=-1.0), "softcap = -1.000000; allowed: finite, >= 0 (0 = off)"),
    (dict(window_left=-2), "window_left = -2 is out of range; allowed: [-1, 1024]"),
    (dict(heads_q=2, alibi_slopes=[0.5]), "alibi_slopes has 1 entries; allowed: 0 or heads_q = 2"),
    (dict(seqlens_q=[3, 0], seqlens_k=[3, 3]), "varlen: a sequence of length 0; allowed: >= 1"),
    (dict(seqlens_q=[3, 2**33], seqlens_k=[3, 3]), "seqlens_q[1] = 8589934592 is out of range; allowed: [1, 1073741824]"),
    (dict(seqlens_q=[3], seqlens_k=None), "seqlens_q and seqlens_k: allowed: both"),
    (dict(seqlen_q=64, block_mask=(32, 32, [[1]])), "block_sparsity.row_blocks = 1 is out of range; allowed: [2, "),
])
def test_bad_input_names_the_input_and_its_range(fields, message):
    with pytest.raises(ValueError) as error:
        sim.problem(**fields)
    assert message in str(error.value)


def test_head_indices_are_checked():
    p = sim.problem(seqlen_q=3, head_dim=8, heads_q=2)
    with pytest.raises(ValueError, match=r"head_index = 2 is out of range; allowed: \[0, 1\]"):
        p.head(0, 2)
    with pytest.raises(ValueError, match=r"row = 3 is out of range; allowed: \[0, 2\]"):
        p.head(0, 0).key_visible(3, 0)


def test_a_problem_changed_after_construction_is_checked_again():
    p = sim.problem(seqlen_q=64, head_dim=16)
    p.heads_kv = 2  # more KV heads than query heads
    with pytest.raises(ValueError, match=r"heads_kv = 2 is out of range; allowed: \[1, 1\]"):
        sim.run("fa2", p, sram="16K")


def test_a_head_keeps_its_own_block_mask_when_the_problem_changes():
    # Blocks of 32 over 64 x 64: the upper right block dropped. A head taken before the mask
    # shrinks to one block must still answer from the 2 x 2 mask it was made with.
    p = sim.problem(seqlen_q=64, head_dim=16, block_mask=(32, 32, [[1, 0], [1, 1]]))
    head = p.head(0, 0)
    p.seqlen_q = p.seqlen_k = 32
    p.row_blocks = p.col_blocks = 1
    p.block_keep = [1]
    assert head.key_visible(63, 63)
    assert not head.key_visible(0, 63)
    assert head.coverage(0, 32, 32, 64) == sim.BlockCoverage.empty


def test_numbers_stay_in_messages_when_torch_is_loaded_first():
    # A toolchain that links libstdc++ into the extension statically must keep that copy's symbols
    # local: mixed with the shared one torch loads, numbers vanish from formatted messages.
    pytest.importorskip("torch")
    script = ("import torch\n"
              "from flashlab import sim\n"
              "try:\n"
              "    sim.problem(head_dim=0)\n"
              "except ValueError as error:\n"
              "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "head_dim = 0 is out of range; allowed: [1, 65536]" in result.stdout
