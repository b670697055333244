#!/usr/bin/env python3
"""Why the warps of two kernels wait, side by side, from Nsight Compute's raw pages.

    ncu -i ours.ncu-rep --page raw --csv > ours.csv
    python3 scripts/ncu_stalls.py ours=ours.csv fa4=fa4.csv [--kernel REGEX] [--top 12]

For each NAME=CSV it takes one kernel (the longest whose name matches --kernel, by
gpu__time_duration.sum) and reads its Warp State Statistics: smsp__average_warps_issue_stalled_
<reason>_per_issue_active, the warps stalled for <reason> per issued instruction, which add up to
the warp cycles per issued instruction. Prints a markdown table of the reasons (largest first in
the first report), with each kernel's issued instructions and duration, so a gap in cycles can be
split into more instructions and more cycles per instruction, and the latter into its reasons.
Where the page has them, the kernel's memory traffic comes first: DRAM bytes read and written, and
the L2's sectors from the SMs (reads, reductions, stores) with the reads' and reductions' misses.
"""
import argparse
import csv
import re
import sys

# To microseconds; Nsight Compute names them in full or short, by version.
DURATION_UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>.+)_per_issue_active(\.ratio)?$")
# To megabytes, by the unit Nsight Compute gives a byte count.
BYTE_UNITS = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "Tbyte": 1e6}
# (row label, metric, unit kind): the traffic rows, in the table's order.
TRAFFIC = [("DRAM read (MB)", "dram__bytes_read.sum", "bytes"),
           ("DRAM written (MB)", "dram__bytes_write.sum", "bytes"),
           ("L2 read sectors (M)", "lts__t_sectors_srcunit_tex_op_read.sum", "sectors"),
           ("L2 read misses (M sectors)", "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum", "sectors"),
           ("L2 reduction sectors (M)", "lts__t_sectors_srcunit_tex_op_red.sum", "sectors"),
           ("L2 reduction misses (M sectors)", "lts__t_sectors_srcunit_tex_op_red_lookup_miss.sum", "sectors"),
           ("L2 store sectors (M)", "lts__t_sectors_srcunit_tex_op_write.sum", "sectors")]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_kernel(path, kernel_pattern):
    """The longest kernel of a raw CSV whose name matches: {"name", "duration" (µs), "instructions", "stalls"}."""
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f)]
    header_index = next((i for i, row in enumerate(rows) if "Kernel Name" in row), None)
    if header_index is None:
        raise ValueError(f"{path}: no header row with 'Kernel Name' (is it `ncu -i REPORT --page raw --csv`?)")
    header = rows[header_index]
    name_column = header.index("Kernel Name")
    # The row under the header names each metric's unit; the duration's depends on its size.
    units = dict(zip(header, rows[header_index + 1])) if header_index + 1 < len(rows) else {}
    to_us = DURATION_UNITS.get(units.get("gpu__time_duration.sum", ""))
    if to_us is None:
        raise ValueError(f"{path}: gpu__time_duration.sum's unit '{units.get('gpu__time_duration.sum', '')}' "
                         f"is none of nsecond (ns), usecond (us), msecond (ms), second (s)")
    records = [dict(zip(header, row)) for row in rows[header_index + 1:]
               if len(row) == len(header) and row[name_column] and number(row[0]) is not None]
    records = [r for r in records if re.search(kernel_pattern, r["Kernel Name"])]
    if not records:
        raise ValueError(f"{path}: no kernel whose name matches '{kernel_pattern}'")
    duration = lambda r: (number(r.get("gpu__time_duration.sum", "")) or 0.0) * to_us
    chosen = max(records, key=duration)
    stalls = {}
    for column, value in chosen.items():
        match = STALL.match(column)
        if match and number(value) is not None:
            stalls[match.group("reason")] = number(value)
    if not stalls:
        raise ValueError(f"{path}: kernel '{chosen['Kernel Name'][:60]}' has no stall metrics (profile with --set full)")
    traffic = {}
    for label, metric, kind in TRAFFIC:
        value = number(chosen.get(metric, ""))
        if value is None:
            continue
        unit = units.get(metric, "")
        if kind == "bytes" and unit not in BYTE_UNITS:
            raise ValueError(f"{path}: {metric}'s unit '{unit}' is none of {', '.join(BYTE_UNITS)}")
        traffic[label] = value * BYTE_UNITS[unit] if kind == "bytes" else value * 1e-6
    return {"name": chosen["Kernel Name"], "duration": duration(chosen),
            "instructions": number(chosen.get("smsp__inst_issued.sum", "")), "stalls": stalls, "traffic": traffic}


def table(kernels, top):
    names = list(kernels)
    first = kernels[names[0]]["stalls"]
    reasons = sorted(set().union(*(k["stalls"] for k in kernels.values())), key=lambda r: -first.get(r, 0.0))
    fmt = lambda x: "-" if x is None else f"{x:.2f}"
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines.append("| kernel | " + " | ".join(kernels[n]["name"][:40] for n in names) + " |")
    lines.append("| duration (µs) | " + " | ".join(f"{kernels[n]['duration']:.1f}" for n in names) + " |")
    lines.append("| issued instructions | " +
                 " | ".join("-" if kernels[n]["instructions"] is None else f"{kernels[n]['instructions']:.4g}" for n in names) + " |")
    for label, _, _ in TRAFFIC:
        if any(label in kernels[n]["traffic"] for n in names):
            lines.append(f"| {label} | " + " | ".join(
                "-" if label not in kernels[n]["traffic"] else f"{kernels[n]['traffic'][label]:.1f}" for n in names) + " |")
    lines.append("| stalled warps per issue, all reasons | " +
                 " | ".join(fmt(sum(kernels[n]["stalls"].values())) for n in names) + " |")
    for reason in reasons[:top]:
        lines.append(f"| {reason} | " + " | ".join(fmt(kernels[n]["stalls"].get(reason)) for n in names) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reports", nargs="+", metavar="NAME=CSV", help="a raw CSV page per kernel to compare")
    parser.add_argument("--kernel", default=".", help="regex the kernel's name must match (default: any)")
    parser.add_argument("--top", type=int, default=12, help="how many reasons to print (default 12)")
    args = parser.parse_args(argv)
    if args.top < 1:
        print(f"ncu_stalls: --top = {args.top}; allowed: 1 or more", file=sys.stderr)
        return 2
    kernels = {}
    for report in args.reports:
        name, separator, path = report.partition("=")
        if not separator or not name or not path:
            print(f"ncu_stalls: '{report}' is not NAME=CSV", file=sys.stderr)
            return 2
        try:
            kernels[name] = read_kernel(path, args.kernel)
        except (OSError, ValueError) as error:
            print(f"ncu_stalls: {error}", file=sys.stderr)
            return 2
    print(table(kernels, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
