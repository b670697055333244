#!/usr/bin/env python3
"""The benchmarks' interleaved rounds (scripts/interleaved_rounds.py) and
scripts/backward_kernel_times.py's use of them, without a GPU: the order of each round (rotated by
one a round, or the balanced Williams design, checked by counting positions and predecessors), the medians over the rounds (of an even count the upper middle value; a kernel
missing from a round counted 0), the summary's ratios to ours, and the calls' timelines after the
L2 flush (grouped by flush, medians op by op), against values worked out by hand."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import backward_kernel_times as times  # noqa: E402  (imports no GPU module at load)
import interleaved_rounds  # noqa: E402


def main():
    failures = []

    def expect(what, got, wanted):
        if got != wanted:
            failures.append(f"{what}: got {got!r}, wanted {wanted!r}")

    expect("median of 3", interleaved_rounds.median([9.0, 1.0, 4.0]), 4.0)
    expect("median of 4", interleaved_rounds.median([9.0, 1.0, 4.0, 2.0]), 4.0)  # 1 2 4 9: the upper middle
    expect("round 4 of 3 names", interleaved_rounds.rotated(["a", "b", "c"], 4), ["b", "c", "a"])
    expect("a round of no names", interleaved_rounds.rotated([], 2), [])  # the forward under --backward-only

    # The balanced order, checked by counting: over its n rounds (2n for odd n) each name takes
    # each position equally often and follows each other name equally often within a round.
    for n in range(1, 8):
        names = [chr(ord("a") + i) for i in range(n)]
        rows = n if n % 2 == 0 else 2 * n
        orders = [interleaved_rounds.balanced(names, r) for r in range(rows)]
        positions = {(name, order.index(name)) for order in orders for name in names}
        expect(f"balanced, {n} names: permutations", all(sorted(order) == names for order in orders), True)
        expect(f"balanced, {n} names: every position", len(positions), n * n)
        pairs = [(order[i], order[i + 1]) for order in orders for i in range(n - 1)]
        expect(f"balanced, {n} names: every predecessor once (twice if odd)",
               sorted(set(pairs)) == sorted((x, y) for x in names for y in names if x != y) and
               all(pairs.count(pair) == rows // n for pair in set(pairs)), True)
        expect(f"balanced, {n} names: repeats after {rows} rounds", interleaved_rounds.balanced(names, rows + 1), orders[1 % rows])
    expect("balanced, 4 names", [''.join(interleaved_rounds.balanced(list("abcd"), r)) for r in range(4)],
           ["abdc", "bcad", "cdba", "dacb"])  # 0 1 3 2 shifted by the round
    expect("no names", interleaved_rounds.balanced([], 3), [])
    expect("the rule by name", interleaved_rounds.in_order(["a", "b", "c"], 1, "rotated"), ["b", "c", "a"])
    try:
        interleaved_rounds.in_order(["a"], 0, "shuffled")
        failures.append("an unknown order was taken")
    except ValueError:
        pass

    calls = []
    walls = {"a": [10.0, 30.0, 20.0, 40.0], "b": [5.0, 5.0, 9.0, 1.0], "c": [7.0, 8.0, 9.0, 10.0]}
    kernels = {"a": [{"main": 5.0, "small": 1.0}, {"main": 7.0}, {"main": 6.0, "small": 3.0}, {"main": 100.0, "small": 2.0}],
               "b": [{"k": 1.0}] * 4, "c": [{"k": 2.0}] * 4}
    seen = {"a": 0, "b": 0, "c": 0}

    def measure(name):
        calls.append(name)
        index = seen[name]
        seen[name] += 1
        return walls[name][index], kernels[name][index]

    result = times.interleaved_medians(["a", "b", "c"], 4, measure)
    expect("call order", "".join(calls), "abc" + "bca" + "cab" + "abc")
    expect("a's wall", result["a"][0], 30.0)  # 10 20 30 40
    expect("a's walls", result["a"][1], [10.0, 30.0, 20.0, 40.0])
    expect("a's kernels", result["a"][2], {"main": 7.0, "small": 2.0})  # main 5 6 7 100; small 0 1 2 3
    expect("a's kernel order", list(result["a"][2]), ["main", "small"])
    expect("b's wall", result["b"][0], 5.0)  # 1 5 5 9
    expect("one round", times.interleaved_medians(["x"], 1, lambda name: (3.0, {"k": 2.0})), {"x": (3.0, [3.0], {"k": 2.0})})
    balanced_calls = []
    times.interleaved_medians(["a", "b", "c"], 2, lambda name: balanced_calls.append(name) or (1.0, {}), "balanced")
    expect("balanced call order", "".join(balanced_calls), "abc" + "bca")

    rows = [{"head_dim": 128, "causal": False, "seqlen": 2048, "impl": impl, "wall_us": wall,
             "kernels_us": {"main": main, "small": 20.0}, "kernels_sum_us": main + 20.0}
            for impl, wall, main in (("fa3", 200.0, 160.0), ("fa4", 190.0, 150.0))]
    lines = times.summary(rows)
    expect("summary, ours", lines[2], "| 128 | none | 2048 | fa3 | 200.0 | 160.0 | 20.0 | 1.000 | 1.000 |")
    expect("summary, fa4", lines[3], "| 128 | none | 2048 | fa4 | 190.0 | 150.0 | 20.0 | 0.950 | 0.938 |")

    # Two calls after flushes, records out of order, one record before the first flush (left out).
    flush = "at::vectorized_elementwise_kernel bitwise_not"
    events = [("main", 110.0, 150.0), ("early", 0.0, 5.0), (flush, 10.0, 100.0), ("pre", 103.0, 108.0),
              (flush, 200.0, 300.0), ("pre", 301.0, 306.0), ("main", 305.0, 346.0), ("post", 350.0, 352.0)]
    got = times.call_timelines(events)
    expect("two calls", got, [[("pre", 3.0, 5.0), ("main", 10.0, 40.0)],
                              [("pre", 1.0, 5.0), ("main", 5.0, 41.0), ("post", 50.0, 2.0)]])
    expect("no flush", times.call_timelines([("main", 1.0, 2.0)]), [])
    calls_ops = [[("pre", 3.0, 5.0), ("main", 10.0, 40.0)], [("pre", 1.0, 5.0), ("main", 5.0, 41.0)],
                 [("pre", 2.0, 4.0), ("main", 9.0, 42.0)], [("pre", 1.0, 1.0), ("other", 2.0, 1.0)], []]
    timeline = times.median_timeline(calls_ops)
    # The three calls of pre, main: pre starts 3 1 2 (median 2), lasts 5 5 4 (5), gap 3 1 2 (2);
    # main starts 10 5 9 (9), lasts 40 41 42 (41), gap 10-8=2, 5-6=-1, 9-6=3 (2); spans 50 46 51 (50).
    expect("median timeline", timeline, {"span_us": 50.0, "calls": 3, "ops": [
        {"name": "pre", "start_us": 2.0, "duration_us": 5.0, "gap_us": 2.0},
        {"name": "main", "start_us": 9.0, "duration_us": 41.0, "gap_us": 2.0}]})
    expect("nothing launched", times.median_timeline([[], []]), None)
    expect("the round of median span", times.median_round([{"span_us": 3.0}, None, {"span_us": 1.0}, {"span_us": 2.0}]),
           {"span_us": 2.0})
    span_rows = [{"head_dim": 128, "causal": True, "seqlen": 2048, "impl": impl,
                  "timeline": {"span_us": span, "calls": 3, "ops": [{"duration_us": d, "gap_us": g} for d, g in ops]}}
                 for impl, span, ops in (("fa3", 100.0, ((60.0, 2.0), (30.0, 3.5))), ("fa4", 95.0, ((90.0, -1.5),)))]
    span_lines = times.span_summary(span_rows + [{"head_dim": 64, "causal": False, "seqlen": 2048, "impl": "x"}])
    expect("span summary rows", len(span_lines), 4)
    # Before and between the ops: the sum of their median gaps (2 + 3.5; -1.5), not span - ops.
    expect("span, ours", span_lines[2], "| 128 | causal | 2048 | fa3 | 100.0 | 90.0 | 5.5 | 1.000 |")
    expect("span, fa4", span_lines[3], "| 128 | causal | 2048 | fa4 | 95.0 | 90.0 | -1.5 | 0.950 |")
    expect("ops_us", times.ops_us(span_rows[0]["timeline"]), (90.0, 5.5))

    for failure in failures:
        print("FAILED:", failure)
    if failures:
        sys.exit(1)
    print("interleaved rounds: the order, the medians, backward_kernel_times.py's summary and timelines as worked out by hand")


if __name__ == "__main__":
    main()
