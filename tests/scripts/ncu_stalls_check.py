#!/usr/bin/env python3
"""scripts/ncu_stalls.py on hand-written raw pages in Nsight Compute's CSV shape: the longest
kernel of each report, its stall reasons side by side in the first report's order, its memory
traffic where the page has it, and every refusal (exit 2, one line on stderr, no table)."""
import pathlib
import tempfile

from script_checks import expect_refusal, run_script

HEADER = ('"ID","Process ID","Kernel Name","gpu__time_duration.sum","smsp__inst_issued.sum",'
          '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
          '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"\n'
          '"","","","nsecond","inst","ratio","ratio"\n')


def run(*args):
    return run_script("ncu_stalls.py", *args)


def main():
    with tempfile.TemporaryDirectory() as folder:
        ours, theirs, empty = (pathlib.Path(folder) / name for name in ("ours.csv", "theirs.csv", "empty.csv"))
        ours.write_text(HEADER + '"0","1","preprocess","1,000","10","0.5","0.1"\n'
                                 '"1","1","main_kernel","2,240,000","453,945,769","2.5","1.1"\n')
        # Nsight Compute picks the duration's unit by its size: milliseconds here.
        theirs.write_text(HEADER.replace('"nsecond"', '"msecond"') + '"7","2","their_main","2.03","408,000,000","1.0","3.3"\n')
        odd_unit = pathlib.Path(folder) / "odd_unit.csv"
        odd_unit.write_text(HEADER.replace('"nsecond"', '"cycle"') + '"7","2","their_main","2.03","408,000,000","1.0","3.3"\n')
        empty.write_text("no header here\n")
        # A page with the traffic metrics (bytes in Gbyte, sectors), beside one without them.
        traffic_header = HEADER.replace('"smsp__inst_issued.sum",', '"smsp__inst_issued.sum","dram__bytes_read.sum",'
                                        '"lts__t_sectors_srcunit_tex_op_red.sum",')
        traffic_header = traffic_header.replace('"nsecond","inst",', '"nsecond","inst","Gbyte","sector",')
        with_traffic = pathlib.Path(folder) / "with_traffic.csv"
        with_traffic.write_text(traffic_header + '"1","1","main_kernel","2,240,000","4","0.874","68,157,440","2.5","1.1"\n')
        bad_bytes = pathlib.Path(folder) / "bad_bytes.csv"
        bad_bytes.write_text(traffic_header.replace('"Gbyte"', '"word"') +
                             '"1","1","main_kernel","2,240,000","4","0.874","68,157,440","2.5","1.1"\n')

        result = run(f"ours={ours}", f"theirs={theirs}")
        assert result.returncode == 0, result.stderr
        rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
        assert rows[0] == "| | ours | theirs |", rows
        assert "| kernel | main_kernel | their_main |" in rows  # the longest kernel, not the preprocess
        assert "| stalled warps per issue, all reasons | 3.60 | 4.30 |" in rows
        assert "| duration (µs) | 2240.0 | 2030.0 |" in rows, rows  # nanoseconds and milliseconds alike
        short_unit = pathlib.Path(folder) / "short_unit.csv"  # newer Nsight Compute: 'ms', not 'msecond'
        short_unit.write_text(HEADER.replace('"nsecond"', '"ms"') + '"7","2","their_main","2.03","408,000,000","1.0","3.3"\n')
        short = run(f"ours={ours}", f"theirs={short_unit}")
        assert short.returncode == 0, short.stderr
        assert "| duration (µs) | 2240.0 | 2030.0 |" in short.stdout, short.stdout
        reasons = [row.split(" | ")[0][2:] for row in rows if row.startswith(("| barrier", "| long_scoreboard"))]
        assert reasons == ["barrier", "long_scoreboard"], reasons  # the first report's order
        assert run(f"ours={ours}", "--top", "1").stdout.count("| long_scoreboard") == 0
        assert "DRAM" not in result.stdout  # no traffic rows where no page has the metrics
        traffic = run(f"ours={with_traffic}", f"theirs={theirs}")
        assert traffic.returncode == 0, traffic.stderr
        assert "| DRAM read (MB) | 874.0 | - |" in traffic.stdout, traffic.stdout  # Gbyte to MB
        assert "| L2 reduction sectors (M) | 68.2 | - |" in traffic.stdout, traffic.stdout
        assert "DRAM written" not in traffic.stdout  # a metric no page has gets no row

        expect_refusal(run(str(ours)), "is not NAME=CSV")
        expect_refusal(run(f"ours={ours}", "--top", "0"), "--top = 0; allowed: 1 or more")
        expect_refusal(run(f"ours={ours}", "--kernel", "nothing"), "no kernel whose name matches 'nothing'")
        expect_refusal(run(f"x={empty}"), "no header row with 'Kernel Name'")
        expect_refusal(run(f"x={odd_unit}"), "unit 'cycle' is none of nsecond (ns), usecond (us), msecond (ms), second (s)")
        expect_refusal(run(f"x={pathlib.Path(folder) / 'missing.csv'}"), "missing.csv")
        expect_refusal(run(f"x={bad_bytes}"), "dram__bytes_read.sum's unit 'word' is none of byte, Kbyte, Mbyte")
    print("ncu_stalls: table and refusals as expected")


if __name__ == "__main__":
    main()
