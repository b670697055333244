#!/usr/bin/env python3
"""scripts/bench_kernels.py refuses bad arguments before it imports PyTorch or touches a GPU: exit 2,
one line on stderr naming the input and what is allowed, nothing on stdout, no output file written."""
import pathlib
import tempfile

from script_checks import expect_refusals


def main():
    with tempfile.TemporaryDirectory() as folder:
        out = pathlib.Path(folder)
        library = out / "lib.so"
        library.write_bytes(b"")
        files = ["--json", str(out / "r.json"), "--markdown", str(out / "r.md")]
        cases = [
            (["--tokens", "0"], "--tokens 0 is outside [1, 16777216]"),
            (["--hidden", "4"], "--hidden 4 is outside [8, 65536]"),
            (["--rounds", "0"], "--rounds 0 is outside [1, 100]"),
            (["--rounds", "101"], "--rounds 101 is outside [1, 100]"),
            (["--order", "shuffled"], "--order shuffled: give one of rotated, balanced"),
            (["--fa1-max-seqlen", "-1"], "--fa1-max-seqlen -1 is outside [0, 1048576]"),
            (["--seqlens", "2048", "0"], "--seqlens 0 is outside [1, 1048576]"),
            (["--head-dims", "100"], "--head-dims 100: give a multiple of 8 in [8, 256] dividing --hidden 2048"),
            (["--head-dims", "264"], "--head-dims 264: give a multiple of 8 in [8, 256] dividing --hidden 2048"),
            (["--head-dims", "128", "--hidden", "320"], "--head-dims 128: give a multiple of 8 in [8, 256] dividing --hidden 320"),
            (["--deterministic"], "--deterministic times the backward's deterministic mode"),
            (["--variant", "candidate"], "--variant candidate: give NAME=PATH"),
            (["--variant", f"a@b={library}"], "without '@'"),
            (["--variant", f"c={library}", "--variant", f"c={library}"], "each NAME new"),
            (["--variant", f"c={out / 'missing.so'}"], "no file"),
            (["--lib", str(out / "missing.so")], "--lib"),
            (["--json", str(out / "no" / "r.json")], "no folder"),
        ]
        expect_refusals("bench_kernels.py", files, cases, out, kept=(library,))


if __name__ == "__main__":
    main()
