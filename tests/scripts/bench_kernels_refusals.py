#!/usr/bin/env python3
"""scripts/bench_kernels.py refuses bad arguments before it imports PyTorch or touches a GPU: exit 2,
one line on stderr naming the input and what is allowed, nothing on stdout, no output file written."""
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_kernels.py"


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
            (["--fa1-max-seqlen", "-1"], "--fa1-max-seqlen -1 is outside [0, 1048576]"),
            (["--seqlens", "2048", "0"], "--seqlens 0 is outside [1, 1048576]"),
            (["--head-dims", "100"], "--head-dims 100: give a multiple of 8 in [8, 256] dividing --hidden 2048"),
            (["--head-dims", "264"], "--head-dims 264: give a multiple of 8 in [8, 256] dividing --hidden 2048"),
            (["--head-dims", "128", "--hidden", "320"], "--head-dims 128: give a multiple of 8 in [8, 256] dividing --hidden 320"),
            (["--deterministic"], "--deterministic times the backward's deterministic mode"),
            (["--variant", "candidate"], "--variant candidate: give NAME=PATH"),
            (["--variant", "a@b=" + str(library)], "without '@'"),
            (["--variant", f"c={library}", "--variant", f"c={library}"], "each NAME new"),
            (["--variant", "c=" + str(out / "missing.so")], "no file"),
            (["--lib", str(out / "missing.so")], "--lib"),
        ]
        failures = 0
        for extra, text in cases:
            result = subprocess.run([sys.executable, str(SCRIPT), *files, *extra], capture_output=True, text=True)
            lines = result.stderr.strip().splitlines()
            if result.returncode != 2 or result.stdout or len(lines) != 1 or text not in lines[0]:
                print(f"FAILED: {extra}: exit {result.returncode}, stdout {result.stdout!r}, stderr {result.stderr!r}")
                failures += 1
        missing = ["--json", str(out / "no" / "r.json"), "--markdown", str(out / "r.md")]
        result = subprocess.run([sys.executable, str(SCRIPT), *missing], capture_output=True, text=True)
        if result.returncode != 2 or "--json" not in result.stderr or "no folder" not in result.stderr:
            print(f"FAILED: --json in a missing folder: exit {result.returncode}, stderr {result.stderr!r}")
            failures += 1
        written = sorted(p.name for p in out.iterdir() if p != library)
        if written:
            print(f"FAILED: files written: {written}")
            failures += 1
    if failures:
        sys.exit(1)
    print(f"bench_kernels.py: {len(cases) + 1} refusals, each exit 2 with one line naming its input")


if __name__ == "__main__":
    main()
