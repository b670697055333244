"""The GPU tests: marked gpu, skipped where torch, a CUDA device or the package's kernel library is
missing (own_kernels: a test that builds its kernels itself with nvcc and needs no kernel library,
only a device and nvcc). Run them with `pytest -m gpu python/tests`."""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and the package's kernel library")
    config.addinivalue_line("markers", "own_kernels: a gpu test that compiles its kernels with nvcc (no kernel library)")


def _skip_reason(own_kernels):
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if own_kernels:
        from flashlab.grade import lab06_gpu_kernel
        return None if lab06_gpu_kernel.find_nvcc() else "nvcc is not on the PATH or in CUDA_HOME"
    from flashlab import _abi
    if not _abi.available():
        return "this flashlab was built without the CUDA kernels"
    return None


def pytest_collection_modifyitems(config, items):
    reasons = {}
    for item in items:
        if "gpu" not in item.keywords:
            continue
        own = "own_kernels" in item.keywords
        if own not in reasons:
            reasons[own] = _skip_reason(own)
        if reasons[own] is not None:
            item.add_marker(pytest.mark.skip(reason=reasons[own]))
