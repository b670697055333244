#!/usr/bin/env python3
"""scripts/backward_kernel_times.py refuses bad arguments before it imports PyTorch or touches a
GPU: exit 2, one line on stderr naming the input, nothing on stdout, no output file written."""
import pathlib
import tempfile

from script_checks import expect_refusals


def main():
    with tempfile.TemporaryDirectory() as folder:
        out = pathlib.Path(folder)
        files = ["--lib", "lib.so", "--json", str(out / "r.json"), "--markdown", str(out / "r.md")]
        cases = [
            (["--tokens", "0"], "--tokens 0 is outside [1, 16777216]"),
            (["--hidden", "32"], "--hidden 32 is outside [64, 65536]"),
            (["--calls", "0"], "--calls 0 is outside [1, 1000]"),
            (["--rounds", "0"], "--rounds 0 is outside [1, 100]"),
            (["--order", "shuffled"], "--order shuffled: give one of rotated, balanced"),
            (["--seqlens", "2048", "-1"], "--seqlens -1 is outside [1, 1048576]"),
            (["--head-dims", "96"], "--head-dims 96: give 64, 128 or 256"),
            (["--head-dims", "256", "--hidden", "320"], "--head-dims 256: give 64, 128 or 256, dividing --hidden 320"),
            (["--json", str(out / "no" / "r.json")], "no folder"),
        ]
        expect_refusals("backward_kernel_times.py", files, cases, out)


if __name__ == "__main__":
    main()
