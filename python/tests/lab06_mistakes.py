"""Lab 06's planted mistakes: each is the reference solution (notebooks/labs/solutions/06_gpu_kernel/
attention.cu) with one text replaced, (old, new). test_grade.py compiles each (CPU); gpu/test_grade_lab06.py
grades each on the GPU and holds it to the checks it must lose and the hint meant for it."""

from pathlib import Path

SOLUTION = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / "solutions" / "06_gpu_kernel" / "attention.cu"
SKELETON = SOLUTION.parents[2] / "06_gpu_kernel" / "attention.cu"

PLANTED = {
    # O is not multiplied by exp(m - m_new) when the running max rises (l still is).
    "no_rescale": ("#pragma unroll\n  for (int c = 0; c < kHeadDim; ++c) o[c] *= rescale;\n", ""),
    # The diagonal left out: each query sees one key too few under a causal mask.
    "causal_off_by_one": ("return min(p.seqlen_k - 1, query + offset);",
                          "return min(p.seqlen_k - 1, query + offset - 1);"),
    # O divided by l after every key block, and again at the end.
    "normalise_in_loop": ("  m = m_new;\n}", "#pragma unroll\n  for (int c = 0; c < kHeadDim; ++c) o[c] /= l;\n"
                          "  m = m_new;\n}"),
    # The last key block taken as kBlockN keys: it reads (and scores) keys past seqlen_k.
    "overrun": ("const int keys_in_block = min(kBlockN, p.seqlen_k - key_start);",
                "const int keys_in_block = kBlockN;"),
}

# Not mistakes a rubric scores, but what the grader's limits are for.
NEVER_ENDS = ("for (int key_start = 0; key_start < key_end; key_start += kBlockN) {",
              "for (int key_start = 0; key_start < key_end; key_start += 0) {")
HOARDS_HOST_MEMORY = ("  const AttentionProblem& p = args.problem;\n  if (p.head_dim != 64",
                      "  static std::vector<std::vector<char>> hoard;\n"
                      "  for (;;) hoard.emplace_back(std::size_t(1) << 28, 1);\n"
                      "  const AttentionProblem& p = args.problem;\n  if (p.head_dim != 64")
SYNTAX_ERROR = ("  const float m_new = fmaxf(m, block_max);", "  const float m_new = fmaxf(m, block_max)")


def write(directory, replacement=None) -> Path:
    """directory/attention.cu: the solution with `replacement` (old, new) made, or as it is."""
    text = SOLUTION.read_text()
    if replacement is not None:
        old, new = replacement
        assert text.count(old) == 1, f"the solution no longer has {old!r}"
        text = text.replace(old, new)
        if "std::vector" in new:
            text = text.replace("#include <cstdint>\n", "#include <cstdint>\n#include <vector>\n", 1)
    path = Path(directory) / "attention.cu"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
