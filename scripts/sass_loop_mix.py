#!/usr/bin/env python3
"""The instruction mix of a kernel's main loop, from its SASS.

The loop is the smallest backward branch range of the function that holds every HGMMA (the
consumer's query-block loop of the FA3 backward, masked path included), so the count is static:
each instruction once, whatever branch a block takes. Usage:

    cuobjdump -sass build/device/kernels/CMakeFiles/flashlab_rung_03_fa3_sm90.dir/03_fa3_sm90/\\
        backward_instances/d128.cu.o | python3 scripts/sass_loop_mix.py --function 'fa3_backward_kernel.*bfloat16'

One line per matching function: its instruction count, the loop's, and the loop's opcodes by count.
"""
import argparse
import collections
import re
import sys


def functions(sass):
    """(name, [(address, instruction)]) for each function of a cuobjdump -sass listing."""
    for block in re.split(r"\n\s+Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        body = [(int(a, 16), s.strip()) for a, s in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", block)]
        yield name, body


def main_loop(body):
    """The smallest [target, branch] range of a backward branch that holds every HGMMA."""
    index = {address: i for i, (address, _) in enumerate(body)}
    total = sum("HGMMA" in s for _, s in body)
    best = None
    for i, (address, s) in enumerate(body):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)\s*$", s)
        if not m or total == 0:
            continue
        target = int(m.group(1), 16)
        if target >= address or target not in index:
            continue
        region = body[index[target]:i + 1]
        if sum("HGMMA" in x for _, x in region) == total and (best is None or len(region) < len(best)):
            best = region
    return best or []


def opcode(instruction):
    """`@!P0 SYNCS.ARRIVE.TRANS64 RZ, ...` -> `SYNCS`: the mnemonic without predicate and suffixes."""
    words = instruction.split()
    if not words:
        return ""
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("listing", nargs="?", help="cuobjdump -sass output (default: standard input)")
    parser.add_argument("--function", default="fa3_backward_kernel", help="regex on the mangled function name")
    args = parser.parse_args()
    sass = open(args.listing).read() if args.listing else sys.stdin.read()
    pattern = re.compile(args.function)
    found = False
    for name, body in functions(sass):
        if not pattern.search(name):
            continue
        found = True
        loop = main_loop(body)
        mix = collections.Counter(opcode(s) for _, s in loop)
        print(f"{name}: {len(body)} instructions, main loop {len(loop)}: "
              + " ".join(f"{op} {n}" for op, n in mix.most_common()))
    if not found:
        print(f"sass_loop_mix: no function matches --function '{args.function}'", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
