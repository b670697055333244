"""Lab 06: FlashAttention-2's forward as a CUDA kernel (notebooks/labs/06_gpu_kernel).

The submission (attention.cu) is CUDA C++: the kernel, one thread block per (query block, head,
batch), K and V through shared memory a key block at a time, the online softmax in registers; the
student writes the loop over key blocks, the online-softmax update and the causal mask's edge, and
deletes each part's LAB06_TODO marker.

Grading. nvcc (on the PATH, or in $CUDA_HOME/bin) compiles the file together with the harness
(lab06_harness.cu, which includes it) into a shared library, for this machine's GPU or, where
there is none, for sm_80, to check that it compiles. On a GPU the worker loads the library and
the reference-test library (flashlab._core.testing: the C++ rule itself) checks the kernel: fresh
inputs per case, O and LSE poisoned on the device, the fp64 oracle, at most 2x the naive
same-precision error, fully masked rows exactly O = 0 and LSE = -inf, a second run bitwise equal;
on odd shapes ((1, 1), (113, 203), (239, 1), ...), both causal alignments, head dims 64 and 128,
fp16 and bf16, MHA, GQA and MQA. Without a GPU those checks are NOT RUN: 0 points, never a pass.
A failing check gets the hint for the mistake that fits: the grader probes the kernel on inputs of
its own (keys past the end of K and V set to NaN or to zeros; scores that only fall or only rise
along the keys) to tell a block that overruns the sequence, a missing rescale and an early
normalisation apart.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ._framework import Check, Failure, Lab, NotRun, scratch_folder

HARNESS = Path(__file__).with_name("lab06_harness.cu")
SUBMISSION = "attention.cu"
ARCH_WITHOUT_GPU = "sm_80"  # compile-only where there is no GPU: one architecture, quick
NVCC_FLAGS = ["-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC"]
COMPILE_TIME_LIMIT = 600  # seconds; the grader's time limit usually ends it first
TODO_PARTS = {1: "the loop over key blocks", 2: "the online-softmax update", 3: "the causal mask's edge"}
# The harness's statuses (lab06_harness.cu) and its poison byte.
OK, REFUSED, CUDA_ERROR, WROTE_OUTSIDE = 0, 1, 2, 3
POISON = 0xFF

# ------------------------------------------------------------------------------------------------
# Hints for the usual mistakes.

COMPILE_HINT = ("fix the first error first (attention.cu(LINE): error: ...); keep the given parts' names and "
                "signatures (AttentionProblem, ForwardArgs, attention_forward), the grader's harness calls them")
TODO_HINT = "write the part each TODO marks, then delete its LAB06_TODO line"
RESCALE_HINT = ("when the running max rises from m to m_new, the sums so far were taken against m: multiply l and "
                "every o[c] by exp(m - m_new) before adding the block's p_j and p_j v_j (Algorithm 1, line 10)")
NORMALISE_HINT = ("O is divided by l too early: inside the loop only rescale and add (o = o * exp(m - m_new) + "
                  "sum_j p_j v_j); the division by l comes once, after the last key block (line 12, given)")
OVERRUN_HINT = ("a key block overruns the sequence: the last block holds keys_in_block = min(kBlockN, seqlen_k - "
                "key_start) keys; loading or scoring kBlockN keys there reads past the end of K and V")
MASK_HINT = ("a causal mask off by one: query i sees keys j <= i + (seqlen_k - seqlen_q) with the bottom-right "
             "alignment and j <= i with the top-left one (last_visible_key), and the loop over key blocks stops "
             "after the last key the block's last row sees")
MASKED_ROW_NAN_HINT = ("a row that sees no key yet has m = -inf: exp(s - m_new) with m_new = -inf is NaN; skip the "
                       "update while the row's max is still -inf")
RACE_HINT = ("two runs on the same inputs differ: a race on shared memory. __syncthreads() before a key block's "
             "load (threads may still read the previous K_j, V_j) and after it (before anyone reads the new one)")
GENERAL_HINT = ("per key block: s = score_block(...); m_new = max(m, max_j s[j]); l and o times exp(m - m_new); "
                "p_j = exp(s[j] - m_new); l += p_j; o += p_j v_j; m = m_new")
LARGE_SCORES_HINT = ("with scores in the hundreds, exp(s) overflows (exp(89) is inf in fp32): exponentiate only "
                     "s[j] - m_new, never a raw score, and rescale with exp(m - m_new) <= 1")
GROWTH_HINT = RESCALE_HINT
REFUSED_HINT = "attention_forward (given) launches head dims 64 and 128 with heads_q a multiple of heads_kv: keep it"
CUDA_ERROR_HINT = ("the kernel failed on the device: an access outside the tensors or shared memory (an index past "
                   "kBlockM, kBlockN or head_dim?); run it under compute-sanitizer to find the line")
WROTE_OUTSIDE_HINT = "store O and LSE only for rows query < seqlen_q, and only head_dim columns"


# ------------------------------------------------------------------------------------------------
# Finding nvcc and the GPU, compiling, loading.

def find_nvcc() -> Optional[str]:
    """nvcc on the PATH, else $CUDA_HOME/bin/nvcc, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME")
    if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
        return str(Path(home) / "bin" / "nvcc")
    return None


@dataclass
class Device:
    available: bool
    reason: str = ""   # why not, when not available
    name: str = ""
    arch: str = ""     # "sm_90"


def probe_device() -> Device:
    """The first CUDA device, through the driver (libcuda), without the runtime."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return Device(False, "no GPU (no CUDA driver here: libcuda.so.1 not found)")
    status = driver.cuInit(0)
    if status != 0:
        names = {100: "no CUDA device", 34: "the driver is a stub", 35: "the driver is older than the toolkit"}
        return Device(False, f"no GPU (the CUDA driver's cuInit reports {names.get(status, f'error {status}')})")
    count = ctypes.c_int(0)
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return Device(False, "no GPU (the CUDA driver lists no device)")
    device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    name = ctypes.create_string_buffer(256)
    driver.cuDeviceGet(ctypes.byref(device), 0)
    driver.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    driver.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # ... _MINOR
    driver.cuDeviceGetName(name, 256, device)
    return Device(True, name=name.value.decode(errors="replace"), arch=f"sm_{major.value}{minor.value}")


def todo_markers(source: str) -> list:
    """The parts still marked LAB06_TODO(n) in code (comments and the #define left aside)."""
    code = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))
    return sorted({int(n) for n in re.findall(r"\bLAB06_TODO\s*\(\s*(\d+)\s*\)", code)})


def compile_errors(output: str, lines: int = 12) -> str:
    """The first errors in nvcc's output, each with the lines that show where (warnings left out),
    and how many there were."""
    blocks, block = [], None
    for line in output.splitlines():
        if not line.strip():
            continue
        if line[0].isspace() and block is not None:
            block.append(line)
            continue
        block = [line]
        blocks.append(block)
    errors = [b for b in blocks if re.search(r"\berror:|\bfatal\b", b[0], re.I)]
    shown = [line for b in (errors or blocks) for line in b][:lines]
    count = len(errors)
    return "\n".join(shown) + (f"\n... {count} errors in all" if count > 1 else "")


class Submission:
    """A lab 06 submission as the checks see it: its source, the TODOs still marked, the compile's
    outcome, the device, and (on a GPU) the library it was built into."""

    def __init__(self, path):
        self.path = Path(path)
        self.source = self.path.read_text(errors="replace")
        self.todos = todo_markers(self.source)
        self.device = probe_device()
        self.nvcc = find_nvcc()
        self.arch = self.device.arch if self.device.available else ARCH_WITHOUT_GPU
        self.compile_error = None  # (message, hint) when it did not compile
        self.compile_seconds = 0.0
        self.library = None
        self.runtime_problem = ""  # why the kernel cannot run although there is a GPU, when it cannot
        self._diagnosis = None
        self.build_dir = Path(scratch_folder())
        self._compile()
        if self.compile_error is None and self.device.available:
            self._load()

    def _compile(self):
        if self.nvcc is None:
            home = os.environ.get("CUDA_HOME")
            self.compile_error = ("nvcc not found: not on the PATH, and " +
                                  (f"not in CUDA_HOME/bin ({home})" if home else "CUDA_HOME is not set"),
                                  "install the CUDA toolkit, or put its bin/ on the PATH or set CUDA_HOME")
            return
        build = self.build_dir
        shutil.copyfile(self.path, build / SUBMISSION)
        shutil.copyfile(HARNESS, build / HARNESS.name)
        self.library_path = build / "lab06.so"
        command = [self.nvcc, *NVCC_FLAGS, f"-arch={self.arch}", "-o", str(self.library_path), HARNESS.name]
        start = time.monotonic()
        try:
            done = subprocess.run(command, cwd=build, capture_output=True, text=True, timeout=COMPILE_TIME_LIMIT)
        except subprocess.TimeoutExpired:
            self.compile_error = (f"nvcc did not finish in {COMPILE_TIME_LIMIT} s", COMPILE_HINT)
            return
        self.compile_seconds = time.monotonic() - start
        output = done.stdout + done.stderr
        if done.returncode != 0 and re.search(r"[Uu]nsupported gpu architecture|not defined for option 'gpu-arch", output):
            self.compile_error = (f"this nvcc cannot compile for the GPU here ({self.arch}, {self.device.name})",
                                  "grade on a GPU this CUDA toolkit supports, or with a toolkit that supports this GPU")
        elif done.returncode != 0:
            self.compile_error = (f"nvcc -arch={self.arch} failed (exit status {done.returncode}):\n"
                                  + compile_errors(output), COMPILE_HINT)

    def _load(self):
        try:
            self.library = ctypes.CDLL(str(self.library_path))
        except OSError as error:
            self.runtime_problem = f"the compiled library does not load ({error})"
            return
        self.library.lab06_device_count.restype = ctypes.c_int
        self.library.lab06_device_count.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.library.lab06_forward.restype = ctypes.c_int
        self.library.lab06_forward.argtypes = ([ctypes.c_int] * 7 + [ctypes.c_double, ctypes.c_int, ctypes.c_int]
                                               + [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.c_char_p, ctypes.c_int])
        message = ctypes.create_string_buffer(512)
        if self.library.lab06_device_count(message, 512) < 1:
            self.runtime_problem = ("the CUDA runtime cannot use the GPU ("
                                    + (message.value.decode(errors="replace") or "it sees no device") + ")")

    def require_run(self):
        """Before a GPU check: NotRun without a GPU; a Failure when there is nothing to run."""
        if not self.device.available:
            raise NotRun(f"not run: {self.device.reason}")
        if self.runtime_problem:
            raise NotRun(f"not run: {self.runtime_problem}")
        if self.compile_error is not None:
            raise Failure("not run: attention.cu did not compile (see the first check)", self.compile_error[1])
        if self.todos:
            raise Failure(not_written_message(self.todos), TODO_HINT)

    def forward(self, fields: dict, q, k, v, guard_byte: int = POISON):
        """One run of the kernel through the harness: q, k, v float32 [rows, heads, dim] (values of
        the dtype); returns O [rows, heads, dim] and LSE [rows, heads] as float32."""
        import numpy as np
        bf16 = fields["dtype"] == "bf16"
        bits = [_to_bits(np.asarray(a, dtype=np.float32), bf16) for a in (q, k, v)]
        o = np.empty(bits[0].shape, dtype=np.uint16)
        lse = np.empty(bits[0].shape[:2], dtype=np.float32)
        message = ctypes.create_string_buffer(1024)
        status = self.library.lab06_forward(
            int(bf16), fields["batch"], fields["heads_q"], fields["heads_kv"], fields["seqlen_q"], fields["seqlen_k"],
            fields["head_dim"], fields["softmax_scale"], int(fields["causal"]), int(fields["bottom_right"]),
            bits[0].ctypes.data, bits[1].ctypes.data, bits[2].ctypes.data, o.ctypes.data, lse.ctypes.data,
            guard_byte, message, 1024)
        text = message.value.decode(errors="replace")
        if status == REFUSED:
            raise ValueError(f"attention_forward refused it: {text}")  # the library records a refusal
        if status == WROTE_OUTSIDE:
            raise KernelFailure(text, WROTE_OUTSIDE_HINT)
        if status != OK:
            raise KernelFailure(text, CUDA_ERROR_HINT)
        return _from_bits(o, bf16), lse

    def diagnosis(self) -> dict:
        """What the probes say about the kernel (computed once, when a check first fails)."""
        if self._diagnosis is None:
            self._diagnosis = _diagnose(self)
        return self._diagnosis


class KernelFailure(Exception):
    """The kernel failed on the device, or wrote outside its outputs; carries its hint."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def not_written_message(todos) -> str:
    parts = ", ".join(f"TODO {n} ({TODO_PARTS.get(n, 'a part of the skeleton')})" for n in todos)
    return f"not written yet: {parts} still marked by LAB06_TODO in {SUBMISSION}"


def load(path) -> Submission:
    return Submission(path)


# ------------------------------------------------------------------------------------------------
# 16-bit values: numpy has fp16; bf16 is the upper half of an fp32, rounded to nearest even.

def _to_bits(values, bf16: bool):
    import numpy as np
    values = np.ascontiguousarray(values, dtype=np.float32)
    if not bf16:
        return values.astype(np.float16).view(np.uint16)
    words = values.view(np.uint32).astype(np.uint64)
    return ((words + 0x7FFF + ((words >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bits(bits, bf16: bool):
    import numpy as np
    if not bf16:
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _round(values, dtype: str):
    """float32 values rounded to fp16 or bf16."""
    return _from_bits(_to_bits(values, dtype == "bf16"), dtype == "bf16")


# ------------------------------------------------------------------------------------------------
# The probes behind the hints (inputs of the grader's own; a diagnosis, not a score).

def _fields(seqlen_q, seqlen_k, head_dim=64, dtype="fp16", batch=1, heads_q=1, heads_kv=1, causal=False,
            bottom_right=True):
    return dict(dtype=dtype, batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                head_dim=head_dim, softmax_scale=1 / math.sqrt(head_dim), causal=causal, bottom_right=bottom_right)


def _random_inputs(fields, rng):
    rows_q, rows_k = fields["batch"] * fields["seqlen_q"], fields["batch"] * fields["seqlen_k"]
    shape = lambda rows, heads: (rows, heads, fields["head_dim"])  # noqa: E731
    return (_round(rng.standard_normal(shape(rows_q, fields["heads_q"])), fields["dtype"]),
            _round(rng.standard_normal(shape(rows_k, fields["heads_kv"])), fields["dtype"]),
            _round(rng.standard_normal(shape(rows_k, fields["heads_kv"])), fields["dtype"]))


def reads_past_the_keys(submission, fields, rng) -> bool:
    """Whether O or LSE change when the memory past the end of K and V holds zeros instead of NaN."""
    import numpy as np
    q, k, v = _random_inputs(fields, rng)
    o_nan, lse_nan = submission.forward(fields, q, k, v, guard_byte=POISON)
    o_zero, lse_zero = submission.forward(fields, q, k, v, guard_byte=0)
    return not (np.array_equal(o_nan.view(np.uint32), o_zero.view(np.uint32))
                and np.array_equal(lse_nan.view(np.uint32), lse_zero.view(np.uint32)))


def _monotone_scores_probe(submission, rising: bool, rng):
    """One query, 100 keys (four key blocks) whose scores fall (the max never moves after the first
    block) or rise (it moves every block) from 4 to -4; whether O and LSE are right."""
    import numpy as np
    fields = _fields(1, 100)
    d, scale = fields["head_dim"], fields["softmax_scale"]
    q = _round(rng.standard_normal((1, 1, d)), "fp16")
    targets = np.linspace(-4, 4, 100) if rising else np.linspace(4, -4, 100)
    k = _round(targets[:, None, None] * q / (scale * float(np.sum(q * q))), "fp16")
    v = _round(rng.standard_normal((100, 1, d)), "fp16")
    o, lse = submission.forward(fields, q, k, v)
    s = scale * (k[:, 0, :].astype(np.float64) @ q[0, 0].astype(np.float64))
    p = np.exp(s - s.max())
    expected_o = p @ v[:, 0, :].astype(np.float64) / p.sum()
    expected_lse = s.max() + np.log(p.sum())
    o_right = bool(np.all(np.abs(o[0, 0] - expected_o) <= 2e-2))
    lse_right = bool(abs(float(lse[0, 0]) - expected_lse) <= 1e-3)
    return o_right, lse_right


def _diagnose(submission) -> dict:
    import numpy as np
    rng = np.random.default_rng()
    found = {"reads_past_the_keys": False, "no_rescale": False, "normalised_early": False}
    try:
        found["reads_past_the_keys"] = reads_past_the_keys(submission, _fields(37, 45, heads_q=2), rng)
        falling_o, falling_lse = _monotone_scores_probe(submission, False, rng)
        rising_o, _ = _monotone_scores_probe(submission, True, rng)
    except (KernelFailure, ValueError):
        return found
    found["no_rescale"] = falling_o and not rising_o  # O wrong only where the max moves
    found["normalised_early"] = not falling_o and falling_lse  # O wrong although m and l are right
    return found


# ------------------------------------------------------------------------------------------------
# The checks.

def _problem(seqlen_q, seqlen_k, head_dim=64, dtype="bf16", batch=1, heads_q=2, heads_kv=2, causal=False,
             alignment="bottom_right"):
    from flashlab import sim
    return sim.problem(seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype, batch=batch,
                       heads_q=heads_q, heads_kv=heads_kv, causal=causal, alignment=alignment)


def _implementation(submission):
    """The kernel as the reference-test library calls an implementation: numpy in, (o, lse) out."""
    import numpy as np
    from flashlab import _core

    def run(problem, q, k, v):
        fields = _core.testing.problem_fields(problem)
        o, lse = submission.forward(fields, q, k, v)
        return o, np.ascontiguousarray(lse.reshape(lse.shape[0], lse.shape[1], 1))
    return run


def _hint_for(submission, report: str, own_hint: str) -> str:
    """The hint for a failed case: from its report and the probes, else the check's own."""
    if "a second run on the same inputs differs" in report:
        return RACE_HINT
    found = submission.diagnosis()
    if found["reads_past_the_keys"]:
        return OVERRUN_HINT
    if found["no_rescale"]:
        return RESCALE_HINT
    if found["normalised_early"]:
        return NORMALISE_HINT
    masked = re.search(r"fully masked rows not exactly[^\n]*max \|O\| (\S+)", report)
    if masked and masked.group(1).lower() == "nan":
        return MASKED_ROW_NAN_HINT
    return own_hint


def _report_lines(report: str, lines: int = 4) -> str:
    return "\n".join(report.splitlines()[:lines])


def _cases_check(cases, hint, **options):
    """A check over problems: each through the reference-test library's check_forward_case."""
    def run(submission):
        from flashlab import _core
        submission.require_run()
        for case in cases:
            problem = _problem(**case)
            try:
                result = _core.testing.check_forward_case(_implementation(submission), problem, **options)
            except KernelFailure as failure:
                raise Failure(f"{_core.testing.describe(problem)}: {failure}", failure.hint) from None
            if result.status == "refused":
                raise Failure(_report_lines(result.report), REFUSED_HINT)
            if result.status != "passed":
                raise Failure(_report_lines(result.report), _hint_for(submission, result.report, hint))
    return run


def _compiles(submission):
    if submission.compile_error is not None:
        raise Failure(*submission.compile_error)
    if submission.todos:
        raise Failure(not_written_message(submission.todos), TODO_HINT)
    where = submission.device.name if submission.device.available else f"compile only: {submission.device.reason}"
    return f"compiled for {submission.arch} in {submission.compile_seconds:.1f} s ({where})"


def _stays_inside(submission):
    """The same inputs with NaN or with zeros past the end of K and V give the same O and LSE, and
    nothing is written outside O and LSE (the harness checks the poison around them)."""
    import numpy as np
    submission.require_run()
    rng = np.random.default_rng()
    for fields in (_fields(37, 45, heads_q=2), _fields(113, 203, head_dim=128, dtype="bf16", heads_q=4, heads_kv=2),
                   _fields(239, 1, causal=True), _fields(100, 70, dtype="bf16", causal=True, bottom_right=False)):
        where = (f"seqlen {fields['seqlen_q']} x {fields['seqlen_k']}, d {fields['head_dim']}, {fields['dtype']}, "
                 f"heads {fields['heads_q']}/{fields['heads_kv']}" + (", causal" if fields["causal"] else ""))
        try:
            if reads_past_the_keys(submission, fields, rng):
                raise Failure(f"{where}: O and LSE change when the memory past the end of K and V holds zeros "
                              "instead of NaN: the kernel reads keys past seqlen_k", OVERRUN_HINT)
        except KernelFailure as failure:
            raise Failure(f"{where}: {failure}", failure.hint) from None


ODD_SHAPES = [
    dict(seqlen_q=113, seqlen_k=203, head_dim=64, dtype="bf16", batch=2),
    dict(seqlen_q=239, seqlen_k=1, head_dim=128, dtype="fp16", heads_q=4, heads_kv=2),
    dict(seqlen_q=1, seqlen_k=1, head_dim=64, dtype="fp16", heads_q=4, heads_kv=2, batch=2),
    dict(seqlen_q=128, seqlen_k=217, head_dim=128, dtype="bf16", heads_q=3, heads_kv=1),
    dict(seqlen_q=203, seqlen_k=113, head_dim=128, dtype="fp16"),
]
CAUSAL = [dict(seqlen_q=q, seqlen_k=k, head_dim=d, dtype=t, heads_q=hq, heads_kv=hk, causal=True, alignment=a)
          for (q, k), d, t, (hq, hk) in [((113, 203), 64, "bf16", (2, 2)), ((239, 1), 128, "fp16", (4, 2)),
                                         ((1, 1), 64, "fp16", (2, 2)), ((203, 113), 128, "bf16", (4, 2)),
                                         ((128, 128), 64, "fp16", (3, 1))]
          for a in ("bottom_right", "top_left")]
GROWING_KEYS = [dict(seqlen_q=113, seqlen_k=203, head_dim=64, dtype="bf16"),
                dict(seqlen_q=64, seqlen_k=300, head_dim=128, dtype="fp16", heads_q=4, heads_kv=2)]
LARGE_SCORES = [dict(seqlen_q=113, seqlen_k=203, head_dim=64, dtype="fp16"),
                dict(seqlen_q=128, seqlen_k=217, head_dim=128, dtype="bf16", heads_q=4, heads_kv=2)]

LAB = Lab(
    key="06", folder="06_gpu_kernel", title="FlashAttention-2's forward as a CUDA kernel", submission=SUBMISSION,
    checks=[
        Check("compiles with nvcc, every TODO written", 1, _compiles, COMPILE_HINT),
        Check("correct on odd shapes, no mask (fp16 and bf16, d 64 and 128, MHA, GQA, MQA) [GPU]", 3,
              _cases_check(ODD_SHAPES, GENERAL_HINT), GENERAL_HINT),
        Check("correct under causal masks, bottom-right and top-left [GPU]", 2, _cases_check(CAUSAL, MASK_HINT),
              MASK_HINT),
        Check("rescales when the running max rises (scores growing along the keys) [GPU]", 2,
              _cases_check(GROWING_KEYS, GROWTH_HINT, key_growth=8.0), GROWTH_HINT),
        Check("large scores (Q and K scaled by 30) stay finite and right [GPU]", 1,
              _cases_check(LARGE_SCORES, LARGE_SCORES_HINT, input_scale=30.0), LARGE_SCORES_HINT),
        Check("reads and writes stay inside the tensors (the last key block stops at seqlen_k) [GPU]", 1,
              _stays_inside, OVERRUN_HINT),
    ],
    load=load,
    memory_rule="resident",
    requires="nvcc; the checks marked [GPU] run on a CUDA GPU",
)
