"""The GPU tests of flashlab.ops: marked gpu, skipped where torch, a CUDA device or the package's
kernel library is missing. Run them with `pytest -m gpu python/tests`."""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and the package's kernel library")


def _skip_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    from flashlab import _abi
    if not _abi.available():
        return "this flashlab was built without the CUDA kernels"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    for item in items:
        if "gpu" in item.keywords and reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
