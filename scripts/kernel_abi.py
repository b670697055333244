"""The kernels' C ABI for the benchmark scripts: flashlab._abi of the installed package, else this
checkout's python/flashlab/_abi.py (plain Python over ctypes, loadable without the package's
compiled core)."""
import importlib.util
import pathlib


def load():
    try:
        from flashlab import _abi  # noqa: PLC0415
        return _abi
    except ImportError:
        path = pathlib.Path(__file__).resolve().parents[1] / "python" / "flashlab" / "_abi.py"
        spec = importlib.util.spec_from_file_location("flashlab_abi", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
