#!/usr/bin/env python3
"""scripts/compare_bench.py without a GPU: on rows whose variants ran at chosen multiples of the
base's TFLOP/s, its summary gives back their geometric means and ranges, by pass, head dim and band
of seqlens (--split-at); it refuses bad input with exit 2 and one line on stderr."""
import json
import pathlib
import tempfile

from script_checks import expect_refusals, run_script

# Variant "a" at 1.1x then 0.9x the base at d 64 (geometric mean sqrt(0.99) = 0.995), 1.2x at
# 2048 and 8192 (over all four, (1.1 x 0.9 x 1.2 x 1.2)^(1/4) = 1.0927); "b" 1.0x everywhere but at
# 8192, where it was not timed.
SPEEDUPS = {256: (1.1, 1.0), 1024: (0.9, 1.0), 2048: (1.2, 1.0), 8192: (1.2, None)}


def rows():
    made = []
    for seqlen, (a, b) in SPEEDUPS.items():
        bwd = {"fa3": 400.0, "fa3@a": 400.0 * a, "sdpa_cudnn": 380.0}
        if b is not None:
            bwd["fa3@b"] = 400.0 * b
        made.append({"head_dim": 64, "causal": False, "seqlen": seqlen, "batch": 16384 // seqlen, "heads": 32,
                     "fwd": {}, "bwd": bwd})
    return made


def main():
    with tempfile.TemporaryDirectory() as folder:
        work = pathlib.Path(folder)
        result = work / "compare.json"
        result.write_text(json.dumps({"rows": rows()}))
        banded = run_script("compare_bench.py", str(result), "--split-at", "2048")
        one_band = run_script("compare_bench.py", str(result))
        for name, run, wanted in (
                ("--split-at 2048", banded, ["| bwd | 64 | 256, 1k | 0.995 (0.900-1.100) | 1.000 (1.000-1.000) |",
                                             "| bwd | 64 | 2k, 8k | 1.200 (1.200-1.200) | 1.000 (1.000-1.000) |"]),
                ("one band", one_band, ["| bwd | 64 | 256, 1k, 2k, 8k | 1.093 (0.900-1.200) | 1.000 (1.000-1.000) |"])):
            assert run.returncode == 0, (name, run.returncode, run.stderr)
            summary = run.stdout[run.stdout.index("geometric mean"):]
            got = [line for line in summary.splitlines() if line.startswith("| bwd")]
            assert got == wanted, (name, got, wanted)
        assert "| bwd | 64 | no | 1024 | 400 | 1.053 | 360 | 0.900 | 0.947 | 400 | 1.000 | 1.053 |" in one_band.stdout, \
            one_band.stdout

        not_json = work / "text.json"
        not_json.write_text("rows")
        no_pass = work / "no_pass.json"
        no_pass.write_text(json.dumps({"rows": [{k: v for k, v in r.items() if k != "fwd"} for r in rows()]}))
        no_variants = work / "plain.json"
        no_variants.write_text(json.dumps({"rows": [dict(r, bwd={"fa3": 1.0}) for r in rows()]}))
        cases = [
            ([str(work / "missing.json")], "missing.json: cannot read it"),
            ([str(not_json)], "text.json: not a bench_kernels.py JSON"),
            ([str(no_pass)], "no_pass.json: not a bench_kernels.py JSON (rows with fwd, bwd"),
            ([str(no_variants)], "no fa2@NAME or fa3@NAME variants"),
            ([str(result), "--split-at", "1"], "--split-at 1 is outside [2, 1048576]"),
        ]
        expect_refusals("compare_bench.py", [], cases, work, kept=set(work.iterdir()))
    print("compare_bench.py: the summary's geometric means and ranges as made, in one band and in two")


if __name__ == "__main__":
    main()
