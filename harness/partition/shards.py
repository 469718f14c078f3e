"""How a parameter-server run's flat parameter buffer is cut over its servers (the run's
`placement`: harness/spec/aggregators.py PLACEMENTS), in element offsets: what each
server holds, receives and sends every step. Pure arithmetic on the tensors' sizes, so
that the servers (harness/exchange/placement.py) and the simulator's placements
(analysis/advice/advisor.py) cut alike."""

from __future__ import annotations

Segments = list[tuple[int, int]]  # [lo, hi) pieces of the flat buffer


def balanced_cuts(sizes: list[int], servers: int) -> list[tuple[int, int]]:
    """Per server, the [first, last) parameter indices of its contiguous shard: the cuts on
    parameter boundaries that make the largest shard smallest (its elements are what the
    busiest server receives and sends every step), every server at least one parameter."""
    if servers > len(sizes):
        raise ValueError(f"{servers} servers for {len(sizes)} parameters: every server "
                         "needs at least one parameter")

    def greedy(capacity: int) -> list[int]:
        """Cut points of the fewest shards of at most `capacity` elements each."""
        cuts, load = [], 0
        for i, size in enumerate(sizes):
            if load and load + size > capacity:
                cuts.append(i)
                load = 0
            load += size
        return cuts

    low, high = max(sizes), sum(sizes)
    while low < high:  # the smallest capacity that needs no more than `servers` shards
        middle = (low + high) // 2
        if len(greedy(middle)) + 1 <= servers:
            high = middle
        else:
            low = middle + 1
    cuts = greedy(low)
    # fewer shards than servers: split off single parameters (no shard grows)
    spare = [i for i in range(1, len(sizes)) if i not in cuts]
    cuts = sorted(cuts + spare[: servers - 1 - len(cuts)])
    bounds = [0, *cuts, len(sizes)]
    return list(zip(bounds, bounds[1:], strict=False))


def offsets(sizes: list[int]) -> list[int]:
    out = [0]
    for size in sizes:
        out.append(out[-1] + size)
    return out


def segments(policy: str, sizes: list[int], servers: int, tail_start: int | None = None
             ) -> list[Segments]:
    """Per parameter server, its pieces of the flat buffer (the last server that holds
    parameters also takes the loss slot, one element past them). `tail_start`: under
    fc-on-server, the index of the first tensor of the tail, which no shard holds."""
    total = sum(sizes)
    at = offsets(sizes)
    placed = sizes if tail_start is None else sizes[:tail_start]
    if policy == "data-parallel":
        if servers > len(placed):
            raise ValueError(f"{servers} servers for {len(placed)} tensors: every server "
                             "needs at least one")
        out: list[Segments] = [[] for _ in range(servers)]
        for i in range(len(placed)):
            out[i % servers].append((at[i], at[i + 1]))
    else:
        holders = servers - 1 if policy == "fc-on-server" and servers > 1 else servers
        out = [[(at[a], at[b])] for a, b in balanced_cuts(placed, holders)]
        out += [[] for _ in range(servers - holders)]
    last = max(k for k, pieces in enumerate(out) if pieces)
    out[last].append((total, total + 1))
    return out


def busiest_share(policy: str, sizes: list[int], servers: int) -> float:
    """The largest share of the parameters' elements one server holds under `policy`
    (data-parallel or sharded): the share the busiest server receives and sends every
    step, 1 / servers at best."""
    total = sum(sizes)
    held = [sum(hi - lo for lo, hi in pieces if hi <= total)
            for pieces in segments(policy, sizes, servers)]
    return max(held) / total
