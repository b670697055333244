"""FlashLab from Python: the attention problem, the IO simulator (flashlab.sim) and, where they
were built, the GPU kernels. The C++ core is the extension flashlab._core."""
from . import _core

__version__ = _core.__version__
