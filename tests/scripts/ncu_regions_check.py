#!/usr/bin/env python3
"""scripts/ncu_regions.py on a hand-written per-instruction page in Nsight Compute's CSV shape:
the samples of one kernel summed over address ranges (offsets from its first instruction), the
instructions per pass, the reasons with the unnamed rest as "other", only the rarely executed
instructions from a gzipped page, the opcodes executed most, and every refusal (exit 2,
one line on stderr, no table)."""
import gzip
import pathlib
import tempfile

from script_checks import expect_refusal, run_script

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"stall_wait","stall_mio","stall_wait (Not Issued)"\n')


def run(*args):
    return run_script("ncu_regions.py", *args)


def main():
    with tempfile.TemporaryDirectory() as folder:
        page = pathlib.Path(folder) / "page.csv"
        page.write_text('"Kernel Name","preprocess"\n' + HEADER + '"0x1000","EXIT","99","4","99","0","0"\n'
                        '"Kernel Name","main_kernel"\n' + HEADER +
                        '"0x7f0000000100","LDS","10","8","6","2","6"\n'       # offset 0x00
                        '"0x7f0000000110","MUFU.EX2","30","8","10","15","9"\n'  # offset 0x10
                        '"0x7f0000000120","HGMMA","40","4","0","0","0"\n'      # offset 0x20: no named reason
                        '"0x7f0000000130","BRA","20","4","20","0","0"\n')      # offset 0x30, past the ranges
        result = run(str(page), "--kernel", "main", "--bounds", "0", "20", "30", "--names", "first", "--passes", "4")
        assert result.returncode == 0, result.stderr
        rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
        assert "100 stall samples in all" in result.stdout, result.stdout  # the main kernel's, not the preprocess's
        assert rows[2] == "| first | 00000-00020 | 40 | 40.0 % | 4 | mio 17, wait 16, other 7 |", rows
        assert rows[3] == "| 00020-00030 | 00020-00030 | 40 | 40.0 % | 1 | other 40 |", rows

        # Only the instructions executed at most 4 times (the HGMMA and the BRA), from a gzipped page;
        # the share stays of all the kernel's samples.
        zipped = pathlib.Path(folder) / "page.csv.gz"
        zipped.write_bytes(gzip.compress(page.read_bytes()))
        result = run(str(zipped), "--kernel", "main", "--bounds", "0", "40", "--max-executions", "4")
        assert result.returncode == 0, result.stderr
        rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
        assert "100 stall samples in all" in result.stdout, result.stdout
        assert rows[2] == "| 00000-00040 | 00000-00040 | 60 | 60.0 % | 8 | other 40, wait 20 |", rows

        # The opcodes executed most over the ranges, the predicate and suffixes dropped (two SHFL
        # rows, one predicated, add up); the BRA lies past the ranges; at most --opcodes rows.
        counted = pathlib.Path(folder) / "counted.csv"
        counted.write_text('"Kernel Name","main_kernel"\n' + HEADER +
                           '"0x7f0000000100","SHFL.IDX PT, R7, R5, R8, 0x1f","1","1500000","0","0","0"\n'
                           '"0x7f0000000110","@!P0 SHFL.IDX PT, R6, R5, R2, 0x1f","1","1000000","0","0","0"\n'
                           '"0x7f0000000120","HGMMA.64x80x16.F32.BF16 R152, gdesc[UR20], RZ","1","3000000","0","0","0"\n'
                           '"0x7f0000000130","LDS.64 R4, [R0+0x20]","1","250000","0","0","0"\n'
                           '"0x7f0000000140","BRA 0x7f0000000100","1","9000000","0","0","0"\n')
        result = run(str(counted), "--kernel", "main", "--bounds", "0", "40", "--opcodes", "2")
        assert result.returncode == 0, result.stderr
        rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
        assert rows[-4:] == ["| opcode | executed warp instructions (millions) |", "| --- | --- |",
                             "| HGMMA | 3.00 |", "| SHFL | 2.50 |"], rows

        expect_refusal(run(str(page), "--kernel", "main", "--bounds", "zz", "30"), "--bounds must be hex offsets")
        expect_refusal(run(str(page), "--kernel", "main", "--bounds", "0", "20", "--opcodes", "-1"),
                       "--opcodes = -1; allowed: 0 or more")
        expect_refusal(run(str(page), "--kernel", "main", "--bounds", "30", "20"), "at least two increasing offsets")
        expect_refusal(run(str(page), "--kernel", "main", "--bounds", "20"), "at least two increasing offsets")
        expect_refusal(run(str(page), "--kernel", "main", "--bounds", "0", "20", "--names", "a", "b"),
                       "allowed: at most one per range (1)")
        expect_refusal(run(str(page), "--kernel", "main", "--bounds", "0", "20", "--passes", "0"),
                       "--passes = 0; allowed: more than 0")
        expect_refusal(run(str(page), "--kernel", "main", "--bounds", "0", "20", "--max-executions", "-1"),
                       "--max-executions = -1; allowed: 0 or more")
        expect_refusal(run(str(page), "--kernel", "nothing", "--bounds", "0", "20"), "no kernel matching 'nothing'")
        expect_refusal(run(str(pathlib.Path(folder) / "missing.csv"), "--kernel", "main", "--bounds", "0", "20"),
                       "missing.csv")
    print("ncu_regions: table and refusals as expected")


if __name__ == "__main__":
    main()
