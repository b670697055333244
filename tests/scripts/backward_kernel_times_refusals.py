#!/usr/bin/env python3
"""scripts/backward_kernel_times.py refuses bad arguments before it imports PyTorch or touches a
GPU: exit 2, one line on stderr naming the input, nothing on stdout, no output file written."""
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "backward_kernel_times.py"


def main():
    with tempfile.TemporaryDirectory() as folder:
        out = pathlib.Path(folder)
        files = ["--lib", "lib.so", "--json", str(out / "r.json"), "--markdown", str(out / "r.md")]
        cases = [
            (["--tokens", "0"], "--tokens 0 is outside [1, 16777216]"),
            (["--hidden", "32"], "--hidden 32 is outside [64, 65536]"),
            (["--calls", "0"], "--calls 0 is outside [1, 1000]"),
            (["--rounds", "0"], "--rounds 0 is outside [1, 100]"),
            (["--seqlens", "2048", "-1"], "--seqlens -1 is outside [1, 1048576]"),
            (["--head-dims", "96"], "--head-dims 96: give 64, 128 or 256"),
            (["--head-dims", "256", "--hidden", "320"], "--head-dims 256: give 64, 128 or 256, dividing --hidden 320"),
        ]
        failures = 0
        for extra, text in cases:
            result = subprocess.run([sys.executable, str(SCRIPT), *files, *extra], capture_output=True, text=True)
            lines = result.stderr.strip().splitlines()
            if result.returncode != 2 or result.stdout or len(lines) != 1 or text not in lines[0]:
                print(f"FAILED: {extra}: exit {result.returncode}, stdout {result.stdout!r}, stderr {result.stderr!r}")
                failures += 1
        missing = ["--lib", "lib.so", "--json", str(out / "no" / "r.json"), "--markdown", str(out / "r.md")]
        result = subprocess.run([sys.executable, str(SCRIPT), *missing], capture_output=True, text=True)
        if result.returncode != 2 or "--json" not in result.stderr or "no folder" not in result.stderr:
            print(f"FAILED: --json in a missing folder: exit {result.returncode}, stderr {result.stderr!r}")
            failures += 1
        if any(out.iterdir()):
            print(f"FAILED: files written: {sorted(p.name for p in out.iterdir())}")
            failures += 1
    if failures:
        sys.exit(1)
    print(f"backward_kernel_times.py: {len(cases) + 1} refusals, each exit 2 with one line naming its input")


if __name__ == "__main__":
    main()
