"""Buffered asynchronous aggregation (FedBuff) on a virtual clock: the scheduling core and
the arithmetic, pure code (no Flower, no torch), fed with the nodes' replies.

``aggregation = "fedbuff"`` has no rounds. Every node always has work: a node is sent the
newest global model, trains it (its own Eq. 4 choice under its cap), and its update is
buffered; every ``buffer-size`` (K) updates the server applies the buffer to the global
model as one new *version*; the node whose update was just taken gets the newest model
right away.

**Device time orders it** (``VirtualClock``). In a simulation the host's wall clock says
nothing about the devices: each node has a virtual clock, and a work sent at virtual time
t ends at t + the device time the node reports for it (training plus any profiling). The
server takes updates in order of their virtual end (ties: the node sent its first work
first), never in the host's arrival order, so a run does not depend on the host's load
and two runs with the same seed give the same records. The scheme is conservative and
exact: the server waits until every sent work has replied (wall time costs nothing in a
simulation), then takes the earliest update; the node it came from is sent its next work
starting at that virtual time, and since that work cannot end before now, the server waits
for its reply before it takes the next update.

**Or the wall clock** (``ordering = "arrival"``, a deployment). On real devices the replies
come in the devices' own order: the server takes each update as its reply arrives, with no
wait for the others, and the node is sent the newest model at once. Virtual start and end
stay each node's device time (a node's next work starts at its last one's end); a version's
virtual time is the latest end taken so far. Only the choice of the next update differs:
buffering, staleness and the step are the same code.

**The step** (``apply_buffer``). An update is applied as a delta against the version it
started from: global += Σ w_i (local_i − base_i) / Σ w_i, with w_i = samples_i × s(τ_i),
τ_i = the current version − the update's base version (its staleness) and s one of
``STALENESS_FORMS`` (``staleness_weight``). This is FedBuff's server step with a server
learning rate of 1; with every τ = 0 and one base it is FedAvg exactly. ``buffer-step =
"fleet"`` shortens it to the buffer's samples over a whole round's (``fleet_weight``): each
update moves the model by its share of the fleet, whatever its staleness, which only weighs
the buffer's updates against each other.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from fl_client.settings_table import BUFFER_STEPS, RATE_WEIGHTS, STALENESS_FORMS
from strategies.weighted_mean import weighted_mean

Arrays = Mapping[str, npt.NDArray[Any]]

#: Which update is taken next: ``virtual`` (the earliest device-time end, once every work in
#: flight has replied: a simulation) or ``arrival`` (the next reply to arrive: a deployment)
ORDERINGS = ("virtual", "arrival")


def staleness_weight(form: str, staleness: int) -> float:
    """s(τ): ``inverse-sqrt`` 1/√(1+τ), ``inverse`` 1/(1+τ), ``constant`` 1; a ValueError
    naming ``staleness-weight`` for another form, or for τ < 0."""
    if staleness < 0:
        raise ValueError(f"staleness: must be ≥ 0, got {staleness}")
    if form == "inverse-sqrt":
        return 1.0 / math.sqrt(1.0 + staleness)
    if form == "inverse":
        return 1.0 / (1.0 + staleness)
    if form == "constant":
        return 1.0
    raise ValueError(
        f"staleness-weight: unknown form {form!r}; allowed: {', '.join(STALENESS_FORMS)}"
    )


def apply_buffer(
    global_arrays: Arrays, updates: Sequence[tuple[Arrays, Arrays, float]], scale: float = 1.0
) -> dict[str, npt.NDArray[Any]]:
    """The new global arrays: ``global_arrays`` + ``scale`` × the ``weight``-mean of
    (local − base) over ``updates`` (each ``(local, base, weight)``), array by array, each
    in its own dtype (an integer array rounded). The weighted mean is
    ``strategies.weighted_mean``'s, of the deltas in float64."""
    if not 0.0 < scale <= 1.0:
        raise ValueError(f"scale: must be in (0, 1], got {scale}")
    if not updates:
        raise ValueError("updates: the buffer is empty")
    names = list(global_arrays)
    deltas = [
        [np.asarray(local[k], np.float64) - np.asarray(base[k], np.float64) for k in names]
        for local, base, _ in updates
    ]
    weights = [w for _, _, w in updates]
    out: dict[str, npt.NDArray[Any]] = {}
    for i, k in enumerate(names):
        step = weighted_mean([d[i] for d in deltas], weights)
        if scale != 1.0:
            step = step * scale
        old = np.asarray(global_arrays[k])
        new = old.astype(np.float64) + step
        if not np.issubdtype(old.dtype, np.floating):
            new = np.rint(new)
        out[k] = new.astype(old.dtype, copy=False)
    return out


@dataclass(frozen=True)
class Work:
    """Work sent to a node: the global version it trains from and its virtual start; its
    ``number`` counts the node's works (1: its first, which profiles; 0: its share of
    fleet-shared profiling, ``VirtualClock.add_profiled``)."""

    node_id: int
    base_version: int
    start_s: float
    number: int


@dataclass(frozen=True)
class DeviceCost:
    """What a work cost on the device: its time and energy (profiling included, and of
    them the profiling part), and the node's idle power (NaN: unknown)."""

    time_s: float
    energy_j: float
    profile_time_s: float = 0.0
    profile_energy_j: float = 0.0
    idle_power_w: float = math.nan

    @property
    def train_time_s(self) -> float:
        """The work's device time without its profiling: its training."""
        return self.time_s - self.profile_time_s


@dataclass(frozen=True)
class Update:
    """A finished work: its virtual end, the local samples it weighs by and its device
    cost; ``payload`` is the caller's (the arrays and the report), ``wall_s`` the wall time
    its reply arrived at (None: not recorded, as in a simulation)."""

    work: Work
    end_s: float
    samples: float
    cost: DeviceCost
    payload: Any = field(default=None, compare=False)
    wall_s: float | None = field(default=None, compare=False)

    @property
    def node_id(self) -> int:
        return self.work.node_id


@dataclass(frozen=True)
class Applied:
    """An update as it was applied: its staleness and weight in its version."""

    update: Update
    version: int
    staleness: int
    weight: float
    step_scale: float = 1.0  # the version's step length (``Step.scale``)


@dataclass(frozen=True)
class Step:
    """One update taken, in the clock's order; ``applied`` holds the buffer when it filled
    (the new version ``version`` made at ``update.end_s``), else nothing."""

    update: Update
    version: int
    applied: tuple[Applied, ...] = ()
    scale: float = 1.0  # the step's length, × the buffer's weighted mean (``buffer-step``)


#: a node as the caller keys it (an id in a run, a name in its records)
K = TypeVar("K")


@dataclass(frozen=True)
class UpdateBudget:
    """How long a ``fedbuff`` run may go without reaching its target (``update-budget``):
    ``fleet``, ``versions`` global versions (``num-rounds`` × the fleet's nodes updates,
    whoever sends them); ``each-node``, until every node still in the run has had
    ``rounds`` of its trained updates applied: as long as ``rounds`` synchronous rounds
    take at least, since a round lasts as long as its slowest node. Profiled updates come
    on top of either (``fl_server.async_loop.run_fedbuff``)."""

    form: str
    rounds: int
    versions: int

    def spent(self, version: int, trained: Mapping[K, int], live: Iterable[K]) -> bool:
        """Whether the run stops at global ``version``, with ``trained`` (node -> its
        trained updates applied so far) and ``live`` (the nodes still in the run; once
        spent, it stays spent as updates are added)."""
        if self.form == "fleet":
            return version >= self.versions
        return all(trained.get(n, 0) >= self.rounds for n in live)


@dataclass
class NodeTime:
    """One node's time and energy in an interval of virtual time: busy (training and
    profiling; of it ``profile_*``) and idle."""

    busy_s: float = 0.0
    busy_j: float = 0.0
    profile_s: float = 0.0
    profile_j: float = 0.0
    idle_s: float = 0.0
    idle_j: float = 0.0


class VirtualClock:
    """FedBuff's schedule on the devices' time: which update is taken next, when the buffer
    fills, and each node's busy and idle time (see the module docstring).

    The caller sends what ``dispatch`` returns, feeds each reply to ``arrive`` (or ``drop``
    for a failed one), and calls ``step``: with ``ordering = "virtual"`` once nothing is in
    flight (``waiting`` empty), and updates that end at the same virtual time are taken in
    the order the nodes were first sent work (the caller sends the first works in an order
    of its own: the fleet's names, not Flower's ids, which change from run to run); with
    ``"arrival"`` after any reply, and updates are taken in the order they arrived.
    """

    def __init__(
        self,
        buffer_size: int,
        staleness_form: str,
        ordering: str = "virtual",
        rate_weight: str = "off",
        buffer_step: str = "mean",
    ) -> None:
        if buffer_size < 1:
            raise ValueError(f"buffer-size: must be an integer ≥ 1, got {buffer_size}")
        staleness_weight(staleness_form, 0)  # an unknown form is refused here
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering: unknown {ordering!r}; allowed: {', '.join(ORDERINGS)}")
        if buffer_step not in BUFFER_STEPS:
            raise ValueError(
                f"buffer-step: unknown {buffer_step!r}; allowed: {', '.join(BUFFER_STEPS)}"
            )
        if rate_weight not in RATE_WEIGHTS:
            raise ValueError(
                f"rate-weight: unknown {rate_weight!r}; allowed: {', '.join(RATE_WEIGHTS)}"
            )
        self.buffer_size = buffer_size
        self.staleness_form = staleness_form
        self.rate_weight = rate_weight
        self._train_s: dict[int, float] = {}  # node -> its last update's training time
        self._samples: dict[int, float] = {}  # node -> its last update's samples
        self.buffer_step = buffer_step
        self.ordering = ordering
        self._arrivals = 0  # replies arrived: the order of ``arrival``
        self.version = 0
        self.now_s = 0.0
        self.buffer: list[Update] = []
        self._in_flight: dict[int, Work] = {}
        self._pending: list[tuple[float, int, Update]] = []  # heap: (key, rank, update)
        self._rank: dict[int, int] = {}  # node -> the order of its first work (ties)
        self._works: dict[int, int] = {}  # node -> works sent
        self._busy: dict[int, list[tuple[float, float, DeviceCost]]] = {}  # (start, end, cost)
        self._idle_w: dict[int, float] = {}
        self._gone_at: dict[int, float] = {}  # a dropped node: from when it counts no idle
        self._replied_end: dict[int, float] = {}  # node -> its replied work's end, none sent since
        self._profiled_total = 0.0  # the samples of every profiled update (``add_profiled``)

    @property
    def waiting(self) -> frozenset[int]:
        """Nodes with work sent and no reply yet."""
        return frozenset(self._in_flight)

    @property
    def in_flight(self) -> tuple[Work, ...]:
        """The works sent with no reply yet, by node id."""
        return tuple(self._in_flight[n] for n in sorted(self._in_flight))

    @property
    def has_pending(self) -> bool:
        """Whether a reply has arrived that ``step`` has not taken yet."""
        return bool(self._pending)

    @property
    def next_key(self) -> float | None:
        """The ordering key of the next update ``step`` would take (``virtual``: its device-time
        end); None: no reply is waiting."""
        return self._pending[0][0] if self._pending else None

    @property
    def gone(self) -> frozenset[int]:
        """Nodes dropped from the run (``drop``)."""
        return frozenset(self._gone_at)

    @property
    def nodes(self) -> list[int]:
        """Every node ever sent work, by id."""
        return sorted(self._works)

    def dispatch(self, node_id: int, start_s: float) -> Work:
        """Work for ``node_id`` from the current version, starting at ``start_s``."""
        if node_id in self._in_flight:
            raise ValueError(f"node {node_id}: has work in flight already")
        self._rank.setdefault(node_id, len(self._rank))
        number = self._works.get(node_id, 0) + 1
        self._works[node_id] = number
        self._busy.setdefault(node_id, [])
        self._replied_end.pop(node_id, None)
        work = Work(node_id, self.version, float(start_s), number)
        self._in_flight[node_id] = work
        return work

    def add_busy(self, node_id: int, start_s: float, cost: DeviceCost) -> None:
        """Device time the node spent outside a work, from ``start_s`` (fleet-shared
        profiling before the first)."""
        self._busy.setdefault(node_id, []).append((start_s, start_s + cost.time_s, cost))
        self._works.setdefault(node_id, 0)

    def add_profiled(
        self,
        node_id: int,
        cost: DeviceCost,
        samples: float,
        payload: Any = None,
        waited: tuple[float, DeviceCost] | None = None,
    ) -> Update:
        """The node's fleet-shared profiling (from time 0) as an update that trained: its
        ``Work`` number 0, from version 0. It is buffered and applied like any other; its
        samples (the profiled minibatches') do not count in ``fleet_weight`` or the rate
        weight, which describe the nodes' training works: with the ``fleet`` step it moves
        the model by its share of the whole fleet's profiled samples. ``waited``: the
        training it did while it waited for its kind's LUT, from when and what it cost;
        the update then ends with it, and its cost is both."""
        self._rank.setdefault(node_id, len(self._rank))
        self._works.setdefault(node_id, 0)
        busy = [(0.0, cost.time_s, cost)]
        total = cost
        if waited is not None:
            start_s, extra = waited
            busy.append((start_s, start_s + extra.time_s, extra))
            total = DeviceCost(
                cost.time_s + extra.time_s,
                cost.energy_j + extra.energy_j,
                cost.profile_time_s + extra.profile_time_s,
                cost.profile_energy_j + extra.profile_energy_j,
                cost.idle_power_w,
            )
        end_s = busy[-1][1]
        update = Update(Work(node_id, self.version, 0.0, 0), end_s, samples, total, payload)
        self._profiled_total += samples
        self._arrivals += 1
        key = update.end_s if self.ordering == "virtual" else float(self._arrivals)
        heapq.heappush(self._pending, (key, self._rank[node_id], update))
        self._busy.setdefault(node_id, []).extend(busy)
        if math.isfinite(cost.idle_power_w):
            self._idle_w[node_id] = cost.idle_power_w
        return update

    def arrive(
        self,
        node_id: int,
        cost: DeviceCost,
        samples: float,
        payload: Any = None,
        wall_s: float | None = None,
    ) -> Update:
        """The reply to ``node_id``'s work, arrived at wall time ``wall_s``: it ends
        ``cost.time_s`` of device time after its start."""
        work = self._in_flight.pop(node_id)
        if not (math.isfinite(cost.time_s) and cost.time_s >= 0):
            raise ValueError(f"train-time-s: node {node_id}: not a time ≥ 0: {cost.time_s}")
        update = Update(work, work.start_s + cost.time_s, samples, cost, payload, wall_s)
        self._arrivals += 1
        key = update.end_s if self.ordering == "virtual" else float(self._arrivals)
        heapq.heappush(self._pending, (key, self._rank[node_id], update))
        self._busy[node_id].append((work.start_s, update.end_s, cost))
        self._replied_end[node_id] = update.end_s
        if math.isfinite(cost.idle_power_w):
            self._idle_w[node_id] = cost.idle_power_w
        if cost.train_time_s > 0:
            self._train_s[node_id] = cost.train_time_s
        self._samples[node_id] = samples
        return update

    def drop(self, node_id: int) -> Work:
        """A failed work: the node gets no more work and counts no idle time after its
        start (its board may be off)."""
        work = self._in_flight.pop(node_id)
        self._gone_at[node_id] = work.start_s
        return work

    def step(self) -> Step | None:
        """Take the next update by the clock's ordering (None: none has arrived); when it
        fills the buffer, apply the buffer (the caller does the arithmetic with
        ``Step.applied``) as a new version."""
        if self.ordering == "virtual" and self._in_flight:
            raise RuntimeError(f"nodes {sorted(self._in_flight)} have not replied yet")
        if not self._pending:
            return None
        _, _, update = heapq.heappop(self._pending)
        self.now_s = max(self.now_s, update.end_s)
        self.buffer.append(update)
        if len(self.buffer) < self.buffer_size:
            return Step(update, self.version)
        stale = [self.version - u.work.base_version for u in self.buffer]
        weights = [
            u.samples * staleness_weight(self.staleness_form, s)
            for u, s in zip(self.buffer, stale, strict=True)
        ]
        # the weight of a full step: the buffer's own (``mean``) or the fleet's (``fleet``)
        full = sum(weights) if self.buffer_step == "mean" else self.fleet_weight()
        if self.rate_weight == "device-time":
            weights = [w * f for w, f in zip(weights, self.rate_factors(), strict=True)]
        if self.buffer_step == "fleet" and any(u.work.number == 0 for u in self.buffer):
            weights, full = self._profiled_shares(weights, full)
        moved = sum(weights)
        if self.buffer_step == "fleet":  # staleness weighs updates against each other only
            fresh = [u.samples for u in self.buffer]
            if self.rate_weight == "device-time":
                fresh = [w * f for w, f in zip(fresh, self.rate_factors(), strict=True)]
            if any(u.work.number == 0 for u in self.buffer):
                fresh, _ = self._profiled_shares(fresh, self.fleet_weight())
            moved = sum(fresh)
        scale = min(1.0, moved / full) if full > 0 and moved > 0 else 1.0
        applied = tuple(
            Applied(u, self.version + 1, s, w, scale)
            for u, s, w in zip(self.buffer, stale, weights, strict=True)
        )
        self.version += 1
        self.buffer = []
        return Step(update, self.version, applied, scale)

    def _profiled_shares(self, weights: list[float], full: float) -> tuple[list[float], float]:
        """``fleet``, a buffer with profiled updates: each profiled update's share of a full
        step is its weight over the whole fleet's profiled weight (``add_profiled``), a
        training update's over ``full``; so once every node's profiled update is applied
        the model has moved about as one round of them would. Returns the weights on the
        scale of ``full`` (that of the profiled total while no training work is known)."""
        ref = full if full > 0 else self._profiled_total
        out = [
            w * ref / self._profiled_total if u.work.number == 0 else w
            for u, w in zip(self.buffer, weights, strict=True)
        ]
        return out, ref

    def fleet_weight(self) -> float:
        """``buffer-step = "fleet"``: the weight of a whole round, the nodes in the run times
        their mean samples (of the nodes that have replied so far)."""
        live = [n for n in self._works if n not in self._gone_at]
        known = [self._samples[n] for n in live if n in self._samples]
        return len(live) * sum(known) / len(known) if known else 0.0

    def rate_factors(self) -> list[float]:
        """``rate-weight = "device-time"``: each buffered update's training time over the mean
        of every node's last one (the nodes still in the run). A node that updates k times as
        often as the fleet's mean weighs 1/k as much per update, so over many versions each
        node counts by its samples, as in a round, not by how fast its board is."""
        live = [t for n, t in self._train_s.items() if n not in self._gone_at]
        mean_s = sum(live) / len(live) if live else 0.0
        out = []
        for u in self.buffer:
            train_s = u.cost.train_time_s
            out.append(train_s / mean_s if mean_s > 0 and train_s > 0 else 1.0)
        return out

    def drain(self) -> list[Update]:
        """The replies arrived and not taken yet, in the clock's order, taken out of it
        without buffering them (the run stops)."""
        out = []
        while self._pending:
            out.append(heapq.heappop(self._pending)[2])
        return out

    def bases_in_use(self) -> set[int]:
        """The versions a work in flight, pending or buffered started from (the arrays the
        caller must keep)."""
        works = [*self._in_flight.values(), *(u.work for _, _, u in self._pending)]
        return {w.base_version for w in works} | {u.work.base_version for u in self.buffer}

    def account(self, t0_s: float, t1_s: float) -> dict[int, NodeTime]:
        """Each node's busy time and energy (a work's energy pro rata of its part inside the
        interval) and idle time and energy (at its idle power; none known yet: 0 J) in
        [``t0_s``, ``t1_s``] of virtual time. A node is idle only before its first work:
        a work still in flight counts neither busy nor idle from its start (its device time
        is not known yet), and nor does a node's time after a work that replied while its
        next work is not sent yet (it is sent the next from that end: ``arrival`` takes
        updates while others train, and a reply may wait to be taken)."""
        out: dict[int, NodeTime] = {}
        for node_id in self.nodes:
            t = NodeTime()
            for start, end, cost in self._busy.get(node_id, []):
                inside = max(0.0, min(end, t1_s) - max(start, t0_s))
                share = inside / (end - start) if end > start else 0.0
                t.busy_s += inside
                t.busy_j += cost.energy_j * share
                t.profile_s += cost.profile_time_s * share
                t.profile_j += cost.profile_energy_j * share
            # idle only while it has no work: not from the start of a work still in flight
            # (its time is known once it replies), nor from the end of one that replied
            # (its next starts there), nor from the start of the work it was dropped with
            flying = self._in_flight.get(node_id)
            busy_from = (
                flying.start_s if flying is not None else self._replied_end.get(node_id, math.inf)
            )
            on_until = min(t1_s, self._gone_at.get(node_id, math.inf), busy_from)
            t.idle_s = max(0.0, on_until - t0_s - t.busy_s)
            t.idle_j = t.idle_s * self._idle_w.get(node_id, 0.0)
            out[node_id] = t
        return out
