"""The benchmarks' interleaved rounds (bench_kernels.py, bench_decode.py, backward_kernel_times.py),
without a GPU: the order of each round and the median over the rounds. The H200's clock follows
its power draw, so an implementation timed in a fixed position reads differently from the same
kernels timed first (docs/kernels.md); rotating the order each round leaves no position fixed."""


def rotated(names, round_index):
    """The names in round `round_index`'s order: each round starts one name later than the one before."""
    if not names:  # nothing timed (e.g. the forward under --backward-only)
        return []
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def median(values):
    """The middle value; of an even count, the upper of the two middle ones (a value that was measured)."""
    return sorted(values)[len(values) // 2]
