"""The benchmarks' interleaved rounds (bench_kernels.py, bench_decode.py, backward_kernel_times.py),
without a GPU: the order of each round and the median over the rounds. The H200's clock follows
its power draw, so an implementation timed in a fixed position reads differently from the same
kernels timed first (docs/kernels.md); rotating the order each round leaves no position fixed.
Rotation keeps each name's predecessor, though (the one before it in the list), and with it
whatever that predecessor leaves behind (the clock after its power draw); the balanced order also
varies the predecessor."""

ORDERS = ("rotated", "balanced")


def rotated(names, round_index):
    """The names in round `round_index`'s order: each round starts one name later than the one before."""
    if not names:  # nothing timed (e.g. the forward under --backward-only)
        return []
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def balanced(names, round_index):
    """The names in round `round_index`'s order, a Williams design (Williams 1949, a Latin square
    balanced for the first-order carry-over): over n rounds (2n if n is odd) every name takes each
    position equally often and follows every other name equally often within a round. Round r is
    0, 1, n-1, 2, n-2, ... shifted by r (mod n); for odd n, rounds n .. 2n-1 are those reversed."""
    n = len(names)
    if n == 0:
        return []
    first, low, high = [0], 1, n - 1
    while low <= high:
        first.append(low)
        low += 1
        if low <= high:
            first.append(high)
            high -= 1
    rows = n if n % 2 == 0 else 2 * n
    r = round_index % rows
    order = [(a + r % n) % n for a in first]
    return [names[i] for i in (order if r < n else order[::-1])]


def in_order(names, round_index, order):
    """Round `round_index`'s order of `names` by the named rule (ORDERS)."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}; allowed: {', '.join(ORDERS)}")
    return rotated(names, round_index) if order == "rotated" else balanced(names, round_index)


def median(values):
    """The middle value; of an even count, the upper of the two middle ones (a value that was measured)."""
    return sorted(values)[len(values) // 2]
