"""What importing the package needs: numpy for flashlab.testing, torch for flashlab.ops alone."""
import os
import subprocess
import sys


def test_import_flashlab_and_testing_needs_no_torch():
    # Run where torch cannot be imported at all: the package core and flashlab.testing import.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import flashlab, flashlab.testing, flashlab._abi\n"
            "print(flashlab.testing.default_grid()[0] is not None)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
    ops_without_torch = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                                        "import flashlab.ops"], capture_output=True, text=True, env=os.environ)
    assert "flashlab.ops runs on PyTorch tensors and needs torch" in ops_without_torch.stderr


def test_flashlab_distributed_says_it_needs_torch():
    result = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                             "import flashlab.distributed"], capture_output=True, text=True, env=os.environ)
    assert "flashlab.distributed runs on PyTorch tensors and needs torch" in result.stderr
