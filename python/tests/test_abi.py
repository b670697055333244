"""The package's declarations of the C ABI (flashlab/_abi.py) against kernels/include/flashlab.h,
and the loader's guards. CPU only; needs a C compiler, and the header of the source tree."""
import ctypes
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from flashlab import _abi

HEADER = pathlib.Path(__file__).resolve().parents[2] / "kernels" / "include" / "flashlab.h"
COMPILER = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")

needs_header = pytest.mark.skipif(not HEADER.exists(), reason=f"{HEADER} not found (not a source tree)")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C compiler")


def compile_c(source: str, tmp_path, *flags):
    path = tmp_path / "check.c"
    path.write_text(source)
    return subprocess.run([COMPILER, "-std=c11", "-Wall", "-Werror", f"-I{HEADER.parent}", *flags, str(path)],
                          capture_output=True, text=True, cwd=tmp_path)


def declarations_as_c() -> str:
    """Every declaration of _abi.py as C the compiler checks against the header."""
    lines = ["#include <stddef.h>", "#include <stdint.h>", '#include "flashlab.h"',
             f"_Static_assert(FLASHLAB_ABI_VERSION == {_abi.ABI_VERSION}, \"ABI_VERSION\");",
             f"_Static_assert(sizeof(FlashlabProblem) == {ctypes.sizeof(_abi.FlashlabProblem)}, \"sizeof\");"]
    lines.append(f"_Static_assert(sizeof(FlashlabKvCache) == {ctypes.sizeof(_abi.FlashlabKvCache)}, \"sizeof\");")
    for struct, fields, ctype in (("FlashlabProblem", _abi.PROBLEM_FIELDS, _abi.FlashlabProblem),
                                  ("FlashlabKvCache", _abi.KV_CACHE_FIELDS, _abi.FlashlabKvCache)):
        for c_type, name in fields:
            offset = getattr(ctype, name).offset
            lines.append(f"_Static_assert(offsetof({struct}, {name}) == {offset}, \"offset of {name}\");")
            lines.append(f"_Static_assert(_Generic((({struct}*)0)->{name}, {c_type}: 1, default: 0), "
                         f"\"type of {name}\");")
    for name, (result, parameters) in _abi.FUNCTIONS.items():
        lines.append(f"{result} (*check_{name})({', '.join(parameters) or 'void'}) = {name};")
    return "\n".join(lines) + "\n"


@needs_header
def test_every_function_of_the_header_is_declared():
    text = HEADER.read_text().replace("\n", " ")
    in_header = set(re.findall(r"FLASHLAB_API [^;(]*\b(flashlab_[a-z0-9_]+) *\(", text))
    assert in_header == set(_abi.FUNCTIONS)


@needs_header
@needs_compiler
def test_declarations_compile_against_the_header(tmp_path):
    result = compile_c(declarations_as_c(), tmp_path, "-c", "-o", "check.o")
    assert result.returncode == 0, result.stderr


@needs_header
@needs_compiler
def test_a_drifted_declaration_fails_to_compile(tmp_path):
    # The check itself: one parameter type changed, and the compiler says no.
    drifted = declarations_as_c().replace("int (*check_flashlab_backward)(int, const FlashlabProblem*, int,",
                                          "int (*check_flashlab_backward)(int, const FlashlabProblem*, double,")
    assert drifted != declarations_as_c()
    assert compile_c(drifted, tmp_path, "-c", "-o", "check.o").returncode != 0


def stub_library(tmp_path, version=_abi.ABI_VERSION, status=_abi.REFUSED, message="stub: dtype = 7; allowed: 1, 2",
                 omit=()):
    """A shared library with the ABI's symbols: every entry returns `status` and sets `message`."""
    body = ["#include <stdint.h>", "typedef struct FlashlabProblem FlashlabProblem;",
            "typedef struct FlashlabKvCache FlashlabKvCache;",
            f'static const char* message = "{message}";', "const char* flashlab_last_error(void) { return message; }",
            f"int flashlab_abi_version(void) {{ return {version}; }}"]
    for name, (result, parameters) in _abi.FUNCTIONS.items():
        if name in ("flashlab_last_error", "flashlab_abi_version") or name in omit:
            continue
        arguments = ", ".join(f"{p} a{i}" for i, p in enumerate(parameters)) or "void"
        body.append(f"{result} {name}({arguments}) {{ return {status if name != 'flashlab_generation_built' else 0}; }}")
    source = tmp_path / "stub.c"
    source.write_text("\n".join(body) + "\n")
    library = tmp_path / "libstub.so"
    subprocess.run([COMPILER, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


@needs_compiler
def test_a_library_of_another_abi_version_is_not_called(tmp_path):
    with pytest.raises(_abi.KernelsUnavailable, match=f"ABI version {_abi.ABI_VERSION + 1}, this package speaks "
                                                      f"version {_abi.ABI_VERSION}"):
        _abi.KernelLibrary(stub_library(tmp_path, version=_abi.ABI_VERSION + 1))


@needs_compiler
def test_a_library_without_an_entry_is_refused_by_name(tmp_path):
    with pytest.raises(_abi.KernelsUnavailable, match="has no flashlab_backward"):
        _abi.KernelLibrary(stub_library(tmp_path, omit=("flashlab_backward",)))


@needs_compiler
def test_status_codes_raise_with_the_library_message(tmp_path):
    refusing = _abi.KernelLibrary(stub_library(tmp_path))
    problem = _abi.make_problem(dtype="bf16", batch=1, heads_q=1, heads_kv=1, seqlen_q=1, seqlen_k=1, head_dim=64)
    tensor = (0x1000, (64, 64, 64))
    with pytest.raises(_abi.KernelRefused, match=r"^stub: dtype = 7; allowed: 1, 2$"):
        refusing.forward(2, problem, tensor, tensor, tensor, tensor, tensor, 0)
    (tmp_path / "error").mkdir()
    failing = _abi.KernelLibrary(stub_library(tmp_path / "error", status=_abi.ERROR, message="cudaMalloc failed"))
    with pytest.raises(_abi.KernelError, match="cudaMalloc failed"):
        failing.backward(2, problem, False, *[tensor] * 9, 0)
    assert issubclass(_abi.KernelRefused, ValueError)


def test_no_library_says_how_to_get_one(monkeypatch):
    monkeypatch.delenv(_abi.LIBRARY_ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setattr(_abi, "PACKAGED_LIBRARY", pathlib.Path("/nonexistent") / _abi.LIBRARY_NAME)
    monkeypatch.setattr(_abi, "_library", None)
    assert not _abi.available()
    with pytest.raises(_abi.KernelsUnavailable, match="built without the CUDA kernels"):
        _abi.library()


def test_strides_are_three():
    with pytest.raises(ValueError, match=r"strides = \(1, 2\); allowed: three strides"):
        _abi.strides((1, 2))


def built_library():
    path = os.environ.get(_abi.LIBRARY_ENVIRONMENT_VARIABLE)
    if path:
        return pathlib.Path(path)
    return _abi.PACKAGED_LIBRARY if _abi.PACKAGED_LIBRARY.exists() else None


@pytest.mark.skipif(built_library() is None, reason="no kernel library in this installation (built without CUDA)")
def test_the_built_library_refuses_without_a_device():
    library = _abi.KernelLibrary(built_library())
    assert library.abi_version() == _abi.ABI_VERSION
    assert library.generation_built(2)
    with pytest.raises(_abi.KernelRefused, match="generation = 4"):
        library.generation_built(4)
    problem = _abi.make_problem(dtype="bf16", batch=1, heads_q=4, heads_kv=3, seqlen_q=8, seqlen_k=8, head_dim=64)
    tensor = (1 << 44, (8 * 4 * 64, 4 * 64, 64))
    with pytest.raises(_abi.KernelRefused, match="heads_q = 4 is not a multiple of heads_kv = 3"):
        library.forward(2, problem, tensor, tensor, tensor, (2 << 44, (8 * 4 * 64, 4 * 64, 64)), (3 << 44, (32, 1, 8)),
                        0)
