"""List scheduling on nodes: the one greedy placement engine every policy shares.

Given an option per task and a priority order, :func:`list_schedule` runs an
event-driven simulation: whenever GPUs free up (or a task is released), it
starts the highest-priority waiting task that fits now, on the node(s) that
fit it most tightly (best fit, to keep whole nodes free for wide tasks), and
repeats. With ``strict=True`` it is first come, first served: a task never
starts before one that precedes it in the order (no back-filling).

:func:`replay_schedule` carries a plan on instead, as the runtime's
dispatcher executes it: each task on its planned nodes, in its place in each
node's order, as soon as those nodes have its GPUs free.

Waiting tasks are bucketed by their demand (GPUs per node, node count), so a
decision costs O(number of distinct demands), not O(waiting tasks); this keeps
1000-task clusters fast.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from ray_saturn.errors import InfeasibleError
from ray_saturn.solver.problem import Option, Problem, Schedule

__all__ = ["list_schedule", "pick_nodes", "replay_schedule", "serial_schedule", "whole_node_schedule"]

_EPS = 1e-9


def pick_nodes(free: list[int], per_node: int, k: int) -> tuple[int, ...] | None:
    """The ``k`` nodes with the least free GPUs that still hold ``per_node`` each, or None."""
    if k == 1:
        best = -1
        best_free = math.inf
        for i, f in enumerate(free):
            if per_node <= f < best_free:
                best, best_free = i, f
                if f == per_node:
                    break
        return None if best < 0 else (best,)
    fits = [(f, i) for i, f in enumerate(free) if f >= per_node]
    if len(fits) < k:
        return None
    fits.sort()
    return tuple(sorted(i for _, i in fits[:k]))


def list_schedule(
    problem: Problem,
    choice: Sequence[int],
    order: Sequence[int],
    *,
    strict: bool = False,
    durations: Sequence[float] | None = None,
) -> Schedule:
    """Place every task with its chosen option, in priority ``order``.

    ``durations`` overrides the options' durations (the CP-SAT model uses
    rounded ones). Running tasks kept in place start at 0 on their nodes.
    A problem with device shares or GPU types is placed on devices by
    :func:`~ray_saturn.solver.packing.pack_schedule`.
    """
    if problem.packing:
        from ray_saturn.solver.packing import pack_schedule

        return pack_schedule(problem, choice, order, strict=strict, durations=durations)
    dur, opts, free, events, start, nodes, seq = _begin(problem, choice, order, durations)

    rank = {t: r for r, t in enumerate(order)}
    waiting = [t for t in order if opts[t].pinned_nodes is None]
    release = problem.release
    # Tasks not yet released wait in a heap by release time.
    unreleased = [(float(release[t]), rank[t], t) for t in waiting if release[t] > _EPS]
    heapq.heapify(unreleased)
    buckets: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def push(t: int) -> None:
        heapq.heappush(buckets.setdefault((opts[t].per_node, opts[t].k), []), (rank[t], t))

    for t in waiting:
        if release[t] <= _EPS:
            push(t)
    strict_queue = list(waiting)  # for strict mode: the global order
    head = 0
    left = len(waiting)
    now = 0.0
    while left:
        if strict:
            while head < len(strict_queue):
                t = strict_queue[head]
                if release[t] > now + _EPS:
                    break
                sel = pick_nodes(free, opts[t].per_node, opts[t].k)
                if sel is None:
                    break
                _place(t, sel, now, opts, dur, free, start, nodes, events, seq)
                seq += 1
                head += 1
                left -= 1
        else:
            while True:
                best = None
                for (q, k), heap in buckets.items():
                    fits = (k == 1 and max(free) >= q) or (k > 1 and sum(f >= q for f in free) >= k)
                    if heap and (best is None or heap[0][0] < best[0]) and fits:
                        best = (heap[0][0], q, k)
                if best is None:
                    break
                _, t = heapq.heappop(buckets[(best[1], best[2])])
                sel = pick_nodes(free, opts[t].per_node, opts[t].k)
                assert sel is not None
                _place(t, sel, now, opts, dur, free, start, nodes, events, seq)
                seq += 1
                left -= 1
        if not left:
            break
        nxt = events[0][0] if events else math.inf
        if unreleased:
            nxt = min(nxt, unreleased[0][0])
        if math.isinf(nxt):
            stuck = [problem.tasks[t] for t in waiting if not nodes[t]][:3]
            raise InfeasibleError(f"task(s) {', '.join(stuck)} can never start: no node set fits them")
        now = max(now, nxt)
        _free_finished(events, free, now)
        while unreleased and unreleased[0][0] <= now + _EPS:
            _, _, t = heapq.heappop(unreleased)
            push(t)
    return Schedule(list(choice), start, nodes, dur)


def replay_schedule(
    problem: Problem,
    choice: Sequence[int],
    order: Sequence[int],
    nodes_of: Sequence[tuple[int, ...] | None],
) -> Schedule:
    """Carry a plan on with the problem's durations (the dispatcher's semantics).

    Each task runs on ``nodes_of[t]`` (``None``: the best-fitting nodes free
    when its turn comes) and starts as soon as they have its GPUs free and
    every task before it in ``order`` on any of those nodes has started.
    Running tasks kept in place start at 0 on their nodes. Replaying a valid
    schedule's own nodes and start order never ends a task later than that
    schedule did.
    """
    if problem.packing:
        from ray_saturn.solver.packing import pack_schedule

        return pack_schedule(problem, choice, order, nodes_of=nodes_of)
    dur, opts, free, events, start, nodes, seq = _begin(problem, choice, order, None)
    release = problem.release
    queue = [t for t in order if opts[t].pinned_nodes is None]
    floating = sum(nodes_of[t] is None for t in queue)
    all_nodes = problem.num_nodes
    now = 0.0
    while queue:
        blocked: set[int] = set()
        rest = []
        for idx, t in enumerate(queue):
            if not floating and len(blocked) == all_nodes:
                rest.extend(queue[idx:])  # every node waits on an earlier task
                break
            opt, ns = opts[t], nodes_of[t]
            if ns is not None and not blocked.isdisjoint(ns):
                blocked.update(ns)
                rest.append(t)
                continue
            sel = None
            if release[t] <= now + _EPS:
                if ns is None:
                    sel = pick_nodes(free, opt.per_node, opt.k)
                elif all(free[i] >= opt.per_node for i in ns):
                    sel = ns
            if sel is None:
                if ns is not None:
                    blocked.update(ns)
                rest.append(t)
                continue
            _place(t, sel, now, opts, dur, free, start, nodes, events, seq)
            seq += 1
            floating -= ns is None
        queue = rest
        if not queue:
            break
        later = [float(release[t]) for t in queue if release[t] > now + _EPS]
        nxt = min(events[0][0] if events else math.inf, min(later, default=math.inf))
        if math.isinf(nxt):
            stuck = ", ".join(problem.tasks[t] for t in queue[:3])
            raise InfeasibleError(f"task(s) {stuck} can never start on their planned nodes")
        now = max(now, nxt)
        _free_finished(events, free, now)
    return Schedule(list(choice), start, nodes, dur)


def whole_node_schedule(problem: Problem, choice: Sequence[int], order: Sequence[int]) -> Schedule:
    """First come, first served on whole nodes: each task, in ``order``, holds every GPU of its nodes.

    A task starts when it is released, no earlier than the task before it, on
    the ``k`` wholly free nodes with the fewest GPUs that hold its GPUs per
    node; it keeps all their GPUs until it ends, whatever it uses. Running
    tasks kept in place start at 0 on their nodes (a node is whole again once
    they end).
    """
    if problem.packing:
        from ray_saturn.solver.packing import pack_schedule

        return pack_schedule(problem, choice, order, strict=True, whole_node=True)
    dur, opts, free, events, start, nodes, seq = _begin(problem, choice, order, None)
    caps = [int(c) for c in problem.node_gpus]
    now = 0.0
    for t in order:
        opt = opts[t]
        if opt.pinned_nodes is not None:
            continue
        now = max(now, float(problem.release[t]))
        while True:
            _free_finished(events, free, now)
            whole = [f if f == caps[i] else 0 for i, f in enumerate(free)]
            sel = pick_nodes(whole, opt.per_node, opt.k)
            if sel is not None:
                break
            if not events:
                raise InfeasibleError(f"task {problem.tasks[t]} can never start: no {opt.k} whole node(s) hold it")
            now = max(now, events[0][0])
        start[t] = now
        nodes[t] = sel
        for i in sel:
            free[i] = 0
            heapq.heappush(events, (now + dur[t], seq, (i,), caps[i]))
            seq += 1
    return Schedule(list(choice), start, nodes, dur)


class _Begin(NamedTuple):
    """The state list and replay scheduling start from at time 0."""

    dur: list[float]
    opts: list[Option]
    free: list[int]  # free GPUs per node
    events: list[tuple[float, int, tuple[int, ...], int]]  # heap of (time, seq, nodes, GPUs per node) freed then
    start: list[float]
    nodes: list[tuple[int, ...]]
    seq: int  # the next event number


def _begin(problem: Problem, choice: Sequence[int], order: Sequence[int], durations: Sequence[float] | None) -> _Begin:
    """Unavailable nodes held until they come back, running tasks kept in place placed at 0."""
    n = problem.num_tasks
    if sorted(order) != list(range(n)):
        raise ValueError("order must be a permutation of the task indices")
    dur = list(durations) if durations is not None else problem.durations(list(choice))
    opts = [problem.options[t][choice[t]] for t in range(n)]
    caps = [int(c) for c in problem.node_gpus]
    free = list(caps)
    events: list[tuple[float, int, tuple[int, ...], int]] = []
    seq = 0
    for i, avail in enumerate(problem.node_avail):
        if avail > 0:
            free[i] = 0
            events.append((float(avail), seq, (i,), caps[i]))
            seq += 1
    start = [0.0] * n
    nodes: list[tuple[int, ...]] = [()] * n
    for t, opt in enumerate(opts):
        if opt.pinned_nodes is not None:
            _place(t, opt.pinned_nodes, 0.0, opts, dur, free, start, nodes, events, seq)
            seq += 1
    heapq.heapify(events)
    return _Begin(dur, opts, free, events, start, nodes, seq)


def _free_finished(events, free, now: float) -> None:
    """Give back the GPUs of every event (a task's end, a node becoming available) due by ``now``."""
    while events and events[0][0] <= now + _EPS:
        _, _, ns, q = heapq.heappop(events)
        for i in ns:
            free[i] += q


def _place(t, sel, now, opts, dur, free, start, nodes, events, seq) -> None:
    start[t] = now
    nodes[t] = sel
    q = opts[t].per_node
    for i in sel:
        free[i] -= q
    heapq.heappush(events, (now + dur[t], seq, sel, q))


class _NodeProfile:
    """GPUs in use on one node over time: usage[i] holds on [times[i], times[i+1])."""

    __slots__ = ("cap", "times", "usage")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.times = [0.0]
        self.usage = [0]

    def earliest(self, release: float, dur: float, q: int, give_up_after: float = math.inf) -> float:
        """Earliest t >= release with usage <= cap - q throughout [t, t + dur)
        (``inf`` as soon as it is known to be later than ``give_up_after``)."""
        times, usage, limit = self.times, self.usage, self.cap - q
        n = len(times)
        i = bisect_right(times, release) - 1
        t = release
        while True:
            # Check segments overlapping [t, t + dur).
            j = i
            end = t + dur
            ok = True
            while j < n and times[j] < end - _EPS:
                if usage[j] > limit:
                    ok = False
                    break
                j += 1
            if ok:
                return t
            # Segment j violates: restart after it.
            if j + 1 >= n:
                return math.inf  # the last segment is unbounded and full: cannot happen for valid q
            t = times[j + 1]
            if t > give_up_after:
                return math.inf
            i = j + 1

    def first_fit(self, start: float, dur: float, q: int, give_up_after: float = math.inf) -> float:
        """The least t in ``{start}`` and the later segment boundaries with ``fits(t, dur, q)``
        (``inf`` as soon as it is known to be later than ``give_up_after``).

        Between ``start`` and the returned time no real t fits either: every t
        there overlaps a segment that is too full (see ``serial_schedule``).
        """
        times, usage, limit = self.times, self.usage, self.cap - q
        n = len(times)
        t = start
        while True:
            i = bisect_right(times, t + _EPS) - 1
            end = t + dur
            while i < n and times[i] < end - _EPS:
                if usage[i] > limit:
                    break
                i += 1
            else:
                return t
            if i + 1 >= n:
                return math.inf
            t = times[i + 1]
            if t > give_up_after:
                return math.inf

    def fits(self, t: float, dur: float, q: int) -> bool:
        times, usage, limit = self.times, self.usage, self.cap - q
        i = bisect_right(times, t + _EPS) - 1
        end = t + dur
        while i < len(times) and times[i] < end - _EPS:
            if usage[i] > limit:
                return False
            i += 1
        return True

    def used_at(self, t: float) -> int:
        return self.usage[bisect_right(self.times, t + _EPS) - 1]

    def _split(self, t: float) -> int:
        i = bisect_right(self.times, t) - 1
        if abs(self.times[i] - t) <= _EPS:
            return i
        self.times.insert(i + 1, t)
        self.usage.insert(i + 1, self.usage[i])
        return i + 1

    def add(self, t: float, dur: float, q: int) -> None:
        a = self._split(t)
        b = self._split(t + dur)
        for i in range(a, b):
            self.usage[i] += q


def serial_schedule(
    problem: Problem,
    choice: Sequence[int],
    order: Sequence[int],
    *,
    durations: Sequence[float] | None = None,
) -> Schedule:
    """Serial schedule generation: each task, in ``order``, at its earliest feasible start.

    Unlike :func:`list_schedule` this reserves capacity for every task already
    placed, so a wide task is never starved by narrow ones that start after
    it in priority (conservative back-filling). Node choice: earliest start,
    then the node(s) with the most GPUs already in use then (best fit).
    """
    if problem.packing:
        from ray_saturn.solver.packing import pack_schedule

        return pack_schedule(problem, choice, order, durations=durations)
    n = problem.num_tasks
    dur = list(durations) if durations is not None else problem.durations(list(choice))
    opts = [problem.options[t][choice[t]] for t in range(n)]
    profiles = _Profiles(problem.node_gpus)
    fresh = _FreshNodes(problem.node_gpus)
    for i, avail in enumerate(problem.node_avail):
        if avail > 0:
            profiles[i].add(0.0, float(avail), int(problem.node_gpus[i]))
            fresh.touch(i)
    start = [0.0] * n
    nodes: list[tuple[int, ...]] = [()] * n
    for t, opt in enumerate(opts):
        if opt.pinned_nodes is not None:
            nodes[t] = opt.pinned_nodes
            for i in opt.pinned_nodes:
                profiles[i].add(0.0, dur[t], opt.per_node)
                fresh.touch(i)
    for t in order:
        opt = opts[t]
        if opt.pinned_nodes is not None:
            continue
        q, k, d, r = opt.per_node, opt.k, dur[t], float(problem.release[t])
        eligible = fresh.eligible(q, k)
        if k == 1:
            best = None
            for i in eligible:
                # A node that cannot start before the best start so far cannot win: stop its scan.
                s = profiles[i].earliest(r, d, q, best[0] if best is not None else math.inf)
                if math.isinf(s):
                    continue
                key = (s, -profiles[i].used_at(s), i)
                if best is None or key < best:
                    best = key
            if best is None:
                raise InfeasibleError(f"task {problem.tasks[t]} can never start: no node holds {q} GPUs")
            s, _, i = best
            sel = (i,)
        else:
            found = _first_k_fit(profiles, eligible, r, d, q, k)
            if found is None:
                raise InfeasibleError(f"task {problem.tasks[t]} can never start: no {k} nodes hold {q} GPUs each")
            s, sel = found
        start[t] = s
        nodes[t] = sel
        for i in sel:
            profiles[i].add(s, d, q)
            fresh.touch(i)
    return Schedule(list(choice), start, nodes, dur)


class _Profiles(dict):
    """Each node's :class:`_NodeProfile`, made when first asked for (most nodes of a large
    cluster are never looked at: see :class:`_FreshNodes`)."""

    def __init__(self, node_gpus: Sequence[int]) -> None:
        super().__init__()
        self._gpus = node_gpus

    def __missing__(self, i: int) -> _NodeProfile:
        p = self[i] = _NodeProfile(int(self._gpus[i]))
        return p


class _FreshNodes:
    """The nodes :func:`serial_schedule` may consider for a task, without scanning every node.

    A node nothing was placed on yet (*fresh*) is like every other fresh node
    of its size: empty at every time, so it fits any task it is large enough
    for at the task's release, with nothing in use. Of those, the node choice
    (earliest start, then most GPUs in use, then the lowest index) can only
    pick the lowest-indexed ``k`` of each size. So the candidates are the
    touched nodes large enough, plus the first ``k`` fresh nodes of each large
    enough size: the same choice as scanning all nodes, at a cost that does
    not grow with idle nodes (a cluster of 100,000 nodes).
    """

    __slots__ = ("_by_size", "_caps", "_next", "_touched")

    def __init__(self, node_gpus: Sequence[int]) -> None:
        self._caps = [int(c) for c in node_gpus]
        self._by_size: dict[int, list[int]] = {}
        for i, c in enumerate(self._caps):
            self._by_size.setdefault(c, []).append(i)
        self._next = dict.fromkeys(self._by_size, 0)  # fresh nodes of a size before this are touched
        self._touched: set[int] = set()

    def touch(self, i: int) -> None:
        self._touched.add(i)

    def eligible(self, q: int, k: int) -> list[int]:
        out = [i for i in self._touched if self._caps[i] >= q]
        for cap, idx in self._by_size.items():
            if cap < q:
                continue
            j = self._next[cap]
            while j < len(idx) and idx[j] in self._touched:
                j += 1
            self._next[cap] = j
            taken = 0
            for i in idx[j:]:
                if taken == k:
                    break
                if i not in self._touched:
                    out.append(i)
                    taken += 1
        out.sort()
        return out


def _first_k_fit(profiles, eligible, r: float, d: float, q: int, k: int,
                 give_up_after: float = math.inf) -> tuple[float, tuple[int, ...]] | None:
    """The earliest start s >= r (r or a segment boundary) at which ``k`` eligible nodes fit
    [s, s + d) with ``q`` GPUs each, and the ``k`` of them with the most GPUs in use then.

    Same answer as trying every boundary after r in order, but it jumps: with
    ``e_i`` the first time node i fits at or after s, no time before the k-th
    smallest ``e_i`` has k fitting nodes, so the search moves straight there
    and re-asks only the nodes that fitted earlier. Returns None if never, or
    as soon as s is known to be later than ``give_up_after`` (a caller's
    incumbent: a node that fits only later cannot be one of the k either).
    """
    s = r
    e = {i: profiles[i].first_fit(s, d, q, give_up_after) for i in eligible}
    while True:
        if len(e) < k:
            return None
        kth = sorted(e.values())[k - 1]
        if math.isinf(kth):
            return None
        if kth <= s:
            break
        s = kth
        for i, ei in e.items():
            if ei < s:
                e[i] = profiles[i].first_fit(s, d, q, give_up_after)
    fit = [i for i in eligible if profiles[i].fits(s, d, q)]
    if len(fit) < k:  # pragma: no cover - only at floating-point ties; fall back to the plain scan
        cands = sorted({s} | {x for i in eligible for x in profiles[i].times if x > s})
        for c in cands:
            fit = [i for i in eligible if profiles[i].fits(c, d, q)]
            if len(fit) >= k:
                s = c
                break
        else:
            return None
    fit.sort(key=lambda i: (-profiles[i].used_at(s), i))
    return s, tuple(sorted(fit[:k]))
