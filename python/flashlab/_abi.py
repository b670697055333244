"""The kernels' C ABI (kernels/include/flashlab.h) loaded with ctypes: the one place in the package
that declares it.

Every declaration below is written once, as the C text of the header (`FUNCTIONS`, `PROBLEM_FIELDS`),
and the ctypes types are derived from that text. python/tests/test_abi.py compiles the same text
against the real header (a function-pointer assignment per function and a static assertion per
struct field offset), so a declaration that drifts from the header fails the tests; at load time
the library's flashlab_abi_version() must equal ABI_VERSION, so a library of another ABI is never
called through these declarations.

Torch-free: pointers are ints and strides are tuples of three ints (batch, row, head), in elements.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import threading

# FLASHLAB_ABI_VERSION of the header these declarations are written for.
ABI_VERSION = 3

OK, ERROR, REFUSED = 0, 1, 2
DTYPE_CODES = {"fp16": 1, "bf16": 2}
GENERATION_CODES = {"fa1": 1, "fa2": 2, "fa3": 3}

LIBRARY_NAME = "libflashlab_kernels_c.so"
# Where the package build installs the library (python/kernels/CMakeLists.txt), beside this file.
PACKAGED_LIBRARY = pathlib.Path(__file__).resolve().parent / "lib" / LIBRARY_NAME
LIBRARY_ENVIRONMENT_VARIABLE = "FLASHLAB_KERNELS_LIBRARY"

# typedef struct FlashlabProblem {...}: (C type, field name), in the header's order.
PROBLEM_FIELDS = [
    ("int", "dtype"), ("int", "batch"), ("int", "heads_q"), ("int", "heads_kv"), ("int", "seqlen_q"),
    ("int", "seqlen_k"), ("int", "head_dim"), ("double", "softmax_scale"), ("int", "causal"), ("int", "alignment"),
    ("int", "window_left"), ("int", "window_right"), ("const int*", "cu_seqlens_q_host"),
    ("const int*", "cu_seqlens_k_host"), ("const int*", "cu_seqlens_q_device"), ("const int*", "cu_seqlens_k_device"),
]

# typedef struct FlashlabKvCache {...}, likewise.
KV_CACHE_FIELDS = [
    ("void*", "k_cache"), ("const int64_t*", "k_cache_strides"), ("void*", "v_cache"),
    ("const int64_t*", "v_cache_strides"), ("const int*", "block_table"), ("int", "max_pages_per_sequence"),
    ("int", "num_pages"), ("int", "page_size"), ("const int*", "cache_seqlens"), ("void*", "k_new"),
    ("const int64_t*", "k_new_strides"), ("void*", "v_new"), ("const int64_t*", "v_new_strides"), ("int", "seqlen_new"),
    ("const int*", "host_cache_seqlens"), ("const int*", "host_block_table"),
]

_TENSOR = ["void*", "const int64_t*"]  # data, strides
# name -> (return type, parameter types), in the header's order.
FUNCTIONS = {
    "flashlab_abi_version": ("int", []),
    "flashlab_last_error": ("const char*", []),
    "flashlab_generation_built": ("int", ["int"]),
    "flashlab_forward": ("int", ["int", "const FlashlabProblem*"] + _TENSOR * 4 + ["float*", "const int64_t*", "void*"]),
    "flashlab_fa3_forward_steps": (
        "int", ["int", "int", "int", "const FlashlabProblem*"] + _TENSOR * 4 + ["float*", "const int64_t*", "void*"]),
    "flashlab_sm90_gemm_bf16": ("int", ["const void*", "const void*", "void*", "int", "int", "int", "void*"]),
    "flashlab_backward": (
        "int", ["int", "const FlashlabProblem*", "int"] + _TENSOR * 4 + ["float*", "const int64_t*"] + _TENSOR * 4
        + ["void*"]),
    "flashlab_decode": (
        "int", ["const FlashlabProblem*", "const FlashlabKvCache*", "int"] + _TENSOR * 2
        + ["float*", "const int64_t*", "void*", "int64_t", "int", "void*"]),
    "flashlab_decode_workspace_bytes": ("int", ["const FlashlabProblem*", "const FlashlabKvCache*", "int", "int64_t*"]),
}


class FlashlabProblem(ctypes.Structure):
    pass


class FlashlabKvCache(ctypes.Structure):
    pass


_CTYPES = {
    "int": ctypes.c_int, "double": ctypes.c_double, "const char*": ctypes.c_char_p, "void*": ctypes.c_void_p,
    "const void*": ctypes.c_void_p, "float*": ctypes.c_void_p, "const int*": ctypes.c_void_p,
    "const int64_t*": ctypes.POINTER(ctypes.c_int64), "const FlashlabProblem*": ctypes.POINTER(FlashlabProblem),
    "int64_t": ctypes.c_int64, "int64_t*": ctypes.POINTER(ctypes.c_int64),
    "const FlashlabKvCache*": ctypes.POINTER(FlashlabKvCache),
}
FlashlabProblem._fields_ = [(name, _CTYPES[c_type]) for c_type, name in PROBLEM_FIELDS]
FlashlabKvCache._fields_ = [(name, _CTYPES[c_type]) for c_type, name in KV_CACHE_FIELDS]


class KernelRefused(ValueError):
    """A kernel refused its input (FLASHLAB_REFUSED); the message is the kernel's own, naming the
    input and the allowed range. Nothing was launched."""


class KernelError(RuntimeError):
    """A CUDA error (no device, out of memory, a failed launch) or an internal one (FLASHLAB_ERROR)."""


class KernelsUnavailable(RuntimeError):
    """This installation has no kernel library (built without CUDA), or it cannot be loaded."""


def strides(values) -> ctypes.Array:
    """Three strides in elements (batch, row, head) as the ABI takes them."""
    values = tuple(int(x) for x in values)
    if len(values) != 3:
        raise ValueError(f"strides = {values}; allowed: three strides (batch, row, head)")
    return (ctypes.c_int64 * 3)(*values)


class KernelLibrary:
    """One loaded libflashlab_kernels_c.so, checked to have this package's ABI version."""

    def __init__(self, path):
        self.path = str(path)
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as error:
            raise KernelsUnavailable(f"cannot load the kernel library {self.path}: {error}") from error
        for name, (result, parameters) in FUNCTIONS.items():
            function = getattr(self._lib, name, None)
            if function is None:
                raise KernelsUnavailable(f"{self.path} has no {name}; it is not a FlashLab kernel library of "
                                         f"ABI version {ABI_VERSION}")
            function.restype = _CTYPES[result]
            function.argtypes = [_CTYPES[p] for p in parameters]
        version = self._lib.flashlab_abi_version()
        if version != ABI_VERSION:
            raise KernelsUnavailable(f"{self.path} has ABI version {version}, this package speaks version "
                                     f"{ABI_VERSION}; rebuild the package and the library from one source tree")

    def abi_version(self) -> int:
        return self._lib.flashlab_abi_version()

    def last_error(self) -> str:
        return (self._lib.flashlab_last_error() or b"").decode(errors="replace")

    def generation_built(self, generation: int) -> bool:
        built = self._lib.flashlab_generation_built(generation)
        if built < 0:
            raise KernelRefused(self.last_error())
        return built == 1

    def _check(self, status: int) -> None:
        if status == OK:
            return
        if status == REFUSED:
            raise KernelRefused(self.last_error())
        raise KernelError(self.last_error())

    def forward(self, generation, problem, q, k, v, o, lse, stream):
        """generation 1-3; q, k, v, o, lse each (data pointer, strides); stream: a cudaStream_t as int."""
        self._check(self._lib.flashlab_forward(generation, ctypes.byref(problem), *_pairs(q, k, v, o, lse),
                                               ctypes.c_void_p(stream)))

    def fa3_forward_steps(self, steps, problem, q, k, v, o, lse, stream):
        """The FA3 forward with the ablation's steps (ping_pong, intra_warpgroup_overlap, persistent)."""
        self._check(self._lib.flashlab_fa3_forward_steps(*steps, ctypes.byref(problem), *_pairs(q, k, v, o, lse),
                                                         ctypes.c_void_p(stream)))

    def sm90_gemm_bf16(self, a, b, c, m, n, k, stream):
        """C [m, n] = A [m, k] B [n, k]^T on the Hopper rung's GEMM; a, b, c data pointers."""
        self._check(self._lib.flashlab_sm90_gemm_bf16(a, b, c, m, n, k, ctypes.c_void_p(stream)))

    def backward(self, generation, problem, deterministic, q, k, v, o, lse, d_o, dq, dk, dv, stream):
        """The backward of `generation` (2 FA2, 3 FA3); each tensor (data pointer, strides)."""
        self._check(self._lib.flashlab_backward(generation, ctypes.byref(problem), int(deterministic),
                                                *_pairs(q, k, v, o, lse, d_o, dq, dk, dv), ctypes.c_void_p(stream)))


    def decode(self, problem, cache, num_splits, q, o, lse, workspace, workspace_bytes, stream_only, stream):
        """Decoding against a KV cache (a FlashlabKvCache); q, o, lse each (data pointer, strides);
        workspace a device pointer (0: allocated by the call)."""
        self._check(self._lib.flashlab_decode(ctypes.byref(problem), ctypes.byref(cache), int(num_splits),
                                              *_pairs(q, o, lse), ctypes.c_void_p(workspace),
                                              ctypes.c_int64(workspace_bytes), int(stream_only), ctypes.c_void_p(stream)))

    def decode_workspace_bytes(self, problem, cache, num_splits) -> int:
        bytes_needed = ctypes.c_int64(0)
        self._check(self._lib.flashlab_decode_workspace_bytes(ctypes.byref(problem), ctypes.byref(cache),
                                                              int(num_splits), ctypes.byref(bytes_needed)))
        return bytes_needed.value


def _pairs(*tensors):
    arguments = []
    for data, tensor_strides in tensors:
        arguments += [ctypes.c_void_p(data), strides(tensor_strides)]
    return arguments


def make_problem(*, dtype, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, softmax_scale=0.0, causal=False,
                 bottom_right=True, window=(-1, -1), cu_seqlens_host=None, cu_seqlens_device=None):
    """A FlashlabProblem. cu_seqlens_host: (q, k) ctypes int arrays, kept alive by the caller;
    cu_seqlens_device: (q, k) device pointers."""
    problem = FlashlabProblem()
    problem.dtype = DTYPE_CODES[dtype]
    problem.batch, problem.heads_q, problem.heads_kv = batch, heads_q, heads_kv
    problem.seqlen_q, problem.seqlen_k, problem.head_dim = seqlen_q, seqlen_k, head_dim
    problem.softmax_scale = softmax_scale
    problem.causal, problem.alignment = int(causal), int(bottom_right)
    problem.window_left, problem.window_right = window
    if cu_seqlens_host is not None:
        problem.cu_seqlens_q_host = ctypes.addressof(cu_seqlens_host[0])
        problem.cu_seqlens_k_host = ctypes.addressof(cu_seqlens_host[1])
    if cu_seqlens_device is not None:
        problem.cu_seqlens_q_device, problem.cu_seqlens_k_device = cu_seqlens_device
    return problem


def make_kv_cache(*, k_cache, v_cache, cache_seqlens, block_table=None, page_size=0, num_pages=0,
                  max_pages_per_sequence=0, k_new=None, v_new=None, seqlen_new=0, host_cache_seqlens=None,
                  host_block_table=None):
    """A FlashlabKvCache. k_cache, v_cache, k_new, v_new: (data pointer, strides); cache_seqlens,
    block_table: device pointers; host_*: ctypes int arrays kept alive by the caller, or None.
    The returned structure keeps its stride arrays alive."""
    cache = FlashlabKvCache()
    keep = []
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)):
        if tensor is None:
            continue
        data, tensor_strides = tensor
        array = strides(tensor_strides)
        keep.append(array)
        setattr(cache, name, ctypes.c_void_p(data))
        setattr(cache, name + "_strides", ctypes.cast(array, ctypes.POINTER(ctypes.c_int64)))
    cache.cache_seqlens = cache_seqlens
    cache.block_table = block_table or 0
    cache.page_size, cache.num_pages, cache.max_pages_per_sequence = page_size, num_pages, max_pages_per_sequence
    cache.seqlen_new = seqlen_new
    if host_cache_seqlens is not None:
        cache.host_cache_seqlens = ctypes.addressof(host_cache_seqlens)
        keep.append(host_cache_seqlens)
    if host_block_table is not None:
        cache.host_block_table = ctypes.addressof(host_block_table)
        keep.append(host_block_table)
    cache._keep = keep  # the arrays the structure points into
    return cache


def int_array(values) -> ctypes.Array:
    values = [int(x) for x in values]
    return (ctypes.c_int * len(values))(*values)


_library = None
_library_lock = threading.Lock()


def library_path():
    """The kernel library this package uses: $FLASHLAB_KERNELS_LIBRARY, else the packaged one, else None."""
    override = os.environ.get(LIBRARY_ENVIRONMENT_VARIABLE)
    if override:
        return pathlib.Path(override)
    return PACKAGED_LIBRARY if PACKAGED_LIBRARY.exists() else None


def available() -> bool:
    """Whether this installation has a kernel library (without loading it)."""
    return library_path() is not None


def library() -> KernelLibrary:
    """The package's kernel library, loaded (and version-checked) on first use."""
    global _library
    with _library_lock:
        if _library is None:
            path = library_path()
            if path is None:
                raise KernelsUnavailable(
                    "this flashlab was built without the CUDA kernels (no CUDA compiler when it was built), so "
                    "flashlab.ops can run generation='reference' only; rebuild with nvcc on PATH "
                    f"(pip install . --no-build-isolation), or point {LIBRARY_ENVIRONMENT_VARIABLE} at a "
                    f"{LIBRARY_NAME} built from this source tree")
            _library = KernelLibrary(path)
        return _library
