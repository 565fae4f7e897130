"""Which members of a ``serve --group`` hold which partitions: the group leader's decision, pure.

``assign_owners(subscriptions, partitions, copies)`` gives every partition to exactly
``k = min(copies, members)`` distinct members and obeys, in this order of priority:

1. **balanced**: the members' loads (partitions held) differ by at most one;
2. **sticky**: as many (member, partition) pairs of the last generation as any balanced assignment
   can keep are kept (``held``), so a rebalance moves as little state as it can: a member that joins
   takes only its share, from the others' surplus; a member that leaves hands on its own (plus one
   swap per partition whose only survivors with room already hold it);
3. **warm**: a pair that must be new goes, where a balanced, sticky assignment allows, to a member
   whose DuckDB file already has rows for the partition (``stored``: less to catch up);
4. **deterministic**: the same subscriptions give the same map, whatever their order.

It is a minimum-cost flow (source -> member -> partition -> sink): a member's arc carries its floor
share ``S // n`` of the ``S = partitions * k`` slots, at most ``S % n`` members take one slot more
through a shared "extra" node, each partition takes ``k``, and a (member, partition) arc costs 0 when
the member held it, ``W - 1`` when it has rows for it and ``W`` otherwise (``W = S + 1``, so one more
kept pair always outweighs every warm preference together). It starts from a greedy flow of the
cheapest pairs (optimal for its size: every pair in it costs the least any pair costs) and completes it
primal-dual: a Dijkstra sets node potentials, then Dinic's blocking flow augments every shortest path
at once. With three cost classes that is a handful of phases: well under a millisecond for 6
partitions, ~0.2 s for a member joining 1,000 partitions over 20 members on a loaded 2-core machine.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from throughline.core.owner_map import GroupMember, MemberSubscription, OwnerMap

#: Copies of each partition when no member asks for a number (and there are at least two members).
DEFAULT_COPIES = 2


def agreed_copies(subscriptions: Mapping[str, MemberSubscription]) -> int:
    """The ``K`` of the group: the largest ``copies`` any member asks for, else ``DEFAULT_COPIES``.

    The largest wins so that the map does not depend on which member leads, and so that raising
    ``--copies`` takes effect with the first member restarted with it (lowering it, with the last).
    """
    asked = [s.copies for s in subscriptions.values() if s.copies is not None]
    return max(asked) if asked else DEFAULT_COPIES


def assign_owners(
    subscriptions: Mapping[str, MemberSubscription], partitions: int, copies: int | None = None
) -> OwnerMap:
    """The owner map of ``partitions`` partitions over the members ``subscriptions`` names (by Kafka
    member id), each partition held by ``min(copies, members)`` of them (``copies=None``:
    ``agreed_copies``). Held and stored partitions outside ``0 .. partitions - 1`` are ignored."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 0:
        raise ValueError(f"partitions must be an integer >= 0, got {partitions!r}")
    wanted = agreed_copies(subscriptions) if copies is None else copies
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise ValueError(f"copies must be an integer >= 1, got {wanted!r}")
    members = tuple(sorted(GroupMember(url=s.url, member_id=m) for m, s in subscriptions.items()))
    n = len(members)
    k = min(wanted, n)
    if n == 0 or partitions == 0:
        return OwnerMap(partitions=partitions, copies=k, members=members, owners=((),) * partitions)
    held = [subscriptions[m.member_id].held for m in members]
    stored = [subscriptions[m.member_id].stored for m in members]
    slots = partitions * k
    weight = slots + 1

    def cost(member: int, partition: int) -> int:
        if partition in held[member]:
            return 0
        return weight - 1 if partition in stored[member] else weight

    rows = _min_cost_owners(n, partitions, k, cost)
    return OwnerMap(partitions=partitions, copies=k, members=members, owners=rows)


class _Flow:
    """A residual graph for min-cost flow: arcs as parallel lists; arc ``a ^ 1`` is arc ``a`` reversed."""

    def __init__(self, nodes: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(nodes)]
        self.to: list[int] = []
        self.cap: list[int] = []
        self.cost: list[int] = []

    def arc(self, u: int, v: int, cap: int, cost: int) -> int:
        a = len(self.to)
        self.to += [v, u]
        self.cap += [cap, 0]
        self.cost += [cost, -cost]
        self.adj[u].append(a)
        self.adj[v].append(a + 1)
        return a

    def push(self, a: int, amount: int) -> None:
        self.cap[a] -= amount
        self.cap[a ^ 1] += amount

    def distances(self, potential: list[int], source: int, sink: int) -> list[int | None]:
        """Dijkstra over the residual arcs with reduced costs, stopping once the sink is settled."""
        adj, to, cap, arc_cost = self.adj, self.to, self.cap, self.cost
        dist: list[int | None] = [None] * len(self.adj)
        dist[source] = 0
        heap = [(0, source)]
        done = [False] * len(self.adj)
        while heap:
            d, u = heapq.heappop(heap)
            if done[u]:
                continue
            done[u] = True
            if u == sink:
                break
            base = d + potential[u]
            for a in adj[u]:
                if cap[a] > 0:
                    v = to[a]
                    nd = base + arc_cost[a] - potential[v]
                    known = dist[v]
                    if known is None or nd < known:
                        dist[v] = nd
                        heapq.heappush(heap, (nd, v))
        return dist

    def blocking_flows(self, potential: list[int], source: int, sink: int) -> int:
        """Augment unit paths of zero reduced cost until none is left (Dinic's levels and arc pointers)."""
        adj, to, cap, arc_cost = self.adj, self.to, self.cap, self.cost
        nodes = len(adj)
        pushed = 0

        def admissible(u: int, a: int) -> bool:
            return cap[a] > 0 and arc_cost[a] + potential[u] - potential[to[a]] == 0

        while True:
            level = [-1] * nodes
            level[source] = 0
            queue = [source]
            for u in queue:
                for a in adj[u]:
                    v = to[a]
                    if level[v] < 0 and admissible(u, a):
                        level[v] = level[u] + 1
                        queue.append(v)
            if level[sink] < 0:
                return pushed
            pointer = [0] * nodes
            while True:
                # One unit path along strictly increasing levels, backing off dead ends.
                path: list[int] = []
                u = source
                while u != sink:
                    arcs = adj[u]
                    while pointer[u] < len(arcs):
                        a = arcs[pointer[u]]
                        if level[to[a]] == level[u] + 1 and admissible(u, a):
                            break
                        pointer[u] += 1
                    if pointer[u] == len(arcs):
                        if u == source:
                            break
                        level[u] = -1  # a dead end for the rest of this phase
                        a = path.pop()
                        u = to[a ^ 1]
                        pointer[u] += 1
                        continue
                    a = arcs[pointer[u]]
                    path.append(a)
                    u = to[a]
                if u != sink:
                    break
                for a in path:
                    cap[a] -= 1
                    cap[a ^ 1] += 1
                pushed += 1


def _min_cost_owners(n: int, partitions: int, k: int, cost: Callable[[int, int], int]) -> tuple[tuple[int, ...], ...]:
    slots = partitions * k
    floor, extras = divmod(slots, n)
    # Nodes: 0 source, 1 extra, 2 sink, then members, then partitions.
    source, extra, sink = 0, 1, 2
    member_node = [3 + m for m in range(n)]
    partition_node = [3 + n + p for p in range(partitions)]
    graph = _Flow(3 + n + partitions)
    pair_costs = [[cost(m, p) for p in range(partitions)] for m in range(n)]
    # Every full flow uses exactly ``slots`` (member, partition) arcs, so shifting all their costs by
    # the cheapest one keeps the optimum and makes the greedy start a zero-cost (hence optimal) flow.
    cheapest = min(min(row) for row in pair_costs)
    floor_arc = [graph.arc(source, member_node[m], floor, 0) for m in range(n)]
    extra_in = graph.arc(source, extra, extras, 0)
    extra_arc = [graph.arc(extra, member_node[m], 1, 0) for m in range(n)]
    pair_arc = [
        [graph.arc(member_node[m], partition_node[p], 1, pair_costs[m][p] - cheapest) for p in range(partitions)]
        for m in range(n)
    ]
    sink_arc = [graph.arc(partition_node[p], sink, k, 0) for p in range(partitions)]

    # Greedy start from the cheapest pairs, the least-loaded member first (ties by member order).
    load = [0] * n
    filled = [0] * partitions
    extras_left = extras
    for p in range(partitions):
        for m in sorted(range(n), key=lambda m: (load[m], m)):
            if filled[p] == k:
                break
            if pair_costs[m][p] != cheapest:
                continue
            if load[m] < floor:
                graph.push(floor_arc[m], 1)
            elif load[m] == floor and extras_left and graph.cap[extra_arc[m]]:
                graph.push(extra_in, 1)
                graph.push(extra_arc[m], 1)
                extras_left -= 1
            else:
                continue
            graph.push(pair_arc[m][p], 1)
            graph.push(sink_arc[p], 1)
            load[m] += 1
            filled[p] += 1
    flow = sum(filled)

    # Primal-dual: a Dijkstra sets the potentials (reduced costs stay >= 0), then a blocking flow of
    # Dinic's on the arcs whose reduced cost is 0 augments every shortest path at once; with so few
    # cost classes a rebalance takes a handful of phases.
    nodes = len(graph.adj)
    potential = [0] * nodes
    while flow < slots:
        dist = graph.distances(potential, source, sink)
        limit = dist[sink]
        if limit is None:  # pragma: no cover - a balanced assignment always exists (k <= n)
            raise AssertionError("no balanced assignment found")
        for v in range(nodes):
            # Nodes settled after the sink keep their reduced costs non-negative with the sink's distance.
            d = dist[v]
            potential[v] += limit if d is None or d > limit else d
        flow += graph.blocking_flows(potential, source, sink)

    return tuple(tuple(m for m in range(n) if graph.cap[pair_arc[m][p]] == 0) for p in range(partitions))
