"""The ``fedbuff`` run through Flower's Message API: every node kept busy, the global
model updated every ``buffer-size`` updates, the next update chosen by the clock's ordering
(``strategies.fedbuff.VirtualClock``); buffering, staleness, the step and the records are
one code path for both.

* ``virtual`` (a simulation: the devices' time orders the updates): one exchange is
  ``Fleet.send_and_receive`` (Flower's ``Grid.send_and_receive``); the clock waits for every
  reply in flight before it takes the next update anyway.
* ``arrival`` (a deployment: the wall clock orders them): works go out with
  ``Grid.push_messages``, and ``Grid.pull_messages`` is polled for the replies in flight;
  each update is taken as its reply arrives and its node is sent the newest model at once.
  A work with no reply ``round-timeout-s`` after it was pushed drops its node; so does an
  error reply, such as the SuperLink's own for a node that stopped sending heartbeats.
  Nobody waits for a dropped node: each update is taken as it arrives. When the run stops,
  the works still in flight are named in the summary (``record_stop``).

Fleet-shared profiling runs once, before the first work, as one synchronous exchange over
Flower. On the devices' time (``virtual``) each kind's nodes start as soon as their kind's
LUT is merged (the sum over its exchanges of its slowest node's slices), from the newest
version at that time: a kind profiled fast trains while a slow kind still profiles, and
nobody waits for the fleet's slowest kind. So the profiled minibatches are not averaged
into a version 0 that the fast kinds could not have had: each node's profiled steps (it
continues from its own, ``SharedProfiling.per_node``) are one update of its own, from
version 0, ending with its slices, buffered and applied like any other. A node whose own
slices end before its kind's LUT is merged trains in that gap instead of waiting idle, at
the fastest feasible cell of its kind's first slices ended by then, its own included
(``SharedExchange.train_while_waiting``); those steps end its profiled update. On the wall
clock (``arrival``) the exchange is a real barrier: every node starts when it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fl_client.contract import NodeRow, SettingsError, TrainReport
from fl_server.async_records import AsyncRecorder, update_row
from strategies.fedbuff import DeviceCost, Step, UpdateBudget, VirtualClock, Work, apply_buffer
from strategies.power_aware import PowerAwareFedAvg

log = logging.getLogger(__name__)

Evaluate = Callable[[int, ArrayRecord], dict[str, float]]


def to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in arrays.items()}


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


@dataclass
class WallClock:
    """The host's clock for ``arrival``: now (s), a sleep, and the poll interval (s)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    poll_s: float = 0.1


@dataclass
class AsyncRun:
    """One ``fedbuff`` run's state: the strategy (its fleet, TRAIN configs and LUTs), the
    clock, the global versions still needed as bases, and the rows of the next version."""

    strategy: PowerAwareFedAvg
    grid: Grid
    clock: VirtualClock
    rec: AsyncRecorder
    timeout_s: float
    versions: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    rows: list[NodeRow] = field(default_factory=list)
    shared: dict[int, tuple[float, float]] = field(default_factory=dict)
    wall: WallClock = field(default_factory=WallClock)
    wall_t0_s: float = 0.0  # the wall clock at the run's start
    flight: dict[str, tuple[Work, float]] = field(default_factory=dict)  # id -> work, deadline
    #: nodes not started yet (``virtual``): (virtual start, node name, node id), in order
    deferred: list[tuple[float, str, int]] = field(default_factory=list)
    #: node -> its trained updates applied so far (``UpdateBudget``; profiled ones not)
    trained: dict[int, int] = field(default_factory=dict)

    def message(self, work: Work) -> Message:
        """The TRAIN message of ``work``: its base version's arrays and the node's config,
        its work number standing for the round (the node profiles in its first)."""
        cfg = self.strategy.node_config(work.number, work.node_id)
        content = RecordDict(
            {
                "arrays": to_record(self.versions[work.base_version]),
                "config": ConfigRecord(cfg.to_config()),
            }
        )
        return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=work.node_id)

    def send(self, works: list[Work]) -> None:
        """Send ``works``: by the clock's ordering, and exchanged at once (``virtual``) or
        pushed (``arrival``, see ``push``)."""
        if not works:
            return
        if self.clock.ordering == "arrival":
            self.push(works)
        else:
            self.exchange(works)

    def next_step(self) -> Step | None:
        """The next update taken (None: no node has work left): ``virtual``, once every
        reply is in (``exchange`` waited for them) and every node that starts before it
        has been sent its first work; ``arrival``, the next reply pulled."""
        if self.clock.ordering == "arrival" and not self.clock.has_pending:
            self.pull_one()
        while self.deferred:
            next_end = self.clock.next_key
            if next_end is not None and self.deferred[0][0] >= next_end:
                break
            start_s = self.deferred[0][0]  # every node that starts then, in one exchange
            starting = [n for t, _, n in self.deferred if t == start_s]
            self.deferred = [d for d in self.deferred if d[0] != start_s]
            self.send([self.clock.dispatch(n, start_s) for n in starting])
        return self.clock.step()

    def exchange(self, works: list[Work]) -> None:
        """Send ``works`` and feed every reply to the clock; a node without a reply, or with
        an error or a malformed report, is dropped with its reason in the next version."""
        fleet = self.strategy.fleet
        messages = [self.message(w) for w in works]
        replies = fleet.send_and_receive(self.grid, messages, self.timeout_s)
        by_node = {w.node_id: w for w in works}
        for msg in fleet.ordered(replies):
            node_id = fleet.node_of(msg)
            work = by_node.pop(node_id, None)
            if work is None:
                continue
            self.feed(work, msg)
        for _, work in sorted(by_node.items()):
            self.fail(work, "no reply (timeout)")

    def push(self, works: list[Work]) -> None:
        """Push ``works`` (``Grid.push_messages``); each is in flight until its reply is
        pulled or ``timeout_s`` has passed. A message the SuperLink did not take drops its
        node."""
        messages = [self.message(w) for w in works]
        pushed = list(self.grid.push_messages(messages))
        if len(pushed) != len(messages):  # a grid that leaves out what it did not take
            taken = {str(i) for i in pushed if i}
            pushed = [
                m.metadata.message_id if m.metadata.message_id in taken else "" for m in messages
            ]
        deadline = self.wall.now() + self.timeout_s
        for work, msg_id in zip(works, pushed, strict=True):
            if msg_id:
                self.flight[str(msg_id)] = (work, deadline)
            else:
                self.fail(work, "not taken by the SuperLink")

    def pull_one(self) -> None:
        """Poll ``Grid.pull_messages`` until an update is in (replies fed to the clock in the
        order pulled) or no work is in flight; a work past its deadline, or an error reply,
        drops its node."""
        while self.flight:
            replies = list(self.grid.pull_messages(list(self.flight)))
            now_s = self.wall.now()
            for msg in replies:
                item = self.flight.pop(msg.metadata.reply_to_message_id, None)
                if item is not None:
                    self.feed(item[0], msg, now_s - self.wall_t0_s)
            for msg_id, (work, deadline) in list(self.flight.items()):
                if now_s >= deadline:
                    del self.flight[msg_id]
                    self.fail(work, "no reply (timeout)")
            if self.clock.has_pending:
                return
            self.wall.sleep(self.wall.poll_s)

    def feed(self, work: Work, msg: Message, wall_s: float | None = None) -> None:
        if msg.has_error():
            self.fail(work, str(msg.error.reason))
            return
        try:
            report = TrainReport.from_metrics(dict(msg.content["metrics"]))
        except (ValueError, TypeError) as err:
            self.fail(work, str(err))
            return
        arrays = to_numpy(msg.content.array_records["arrays"])
        cost = DeviceCost(
            time_s=report.train_time_s + report.profile_time_s,
            energy_j=report.train_energy_j + report.profile_energy_j,
            profile_time_s=report.profile_time_s,
            profile_energy_j=report.profile_energy_j,
            idle_power_w=report.idle_power_w,
        )
        self.clock.arrive(work.node_id, cost, report.num_examples, (arrays, report), wall_s)
        if self.strategy.shared is not None:
            self.strategy.shared.distrust_library_lut(work.number, work.node_id, report)

    def fail(self, work: Work, reason: str) -> None:
        self.clock.drop(work.node_id)
        log.warning("node %d dropped from the run: %s", work.node_id, reason)
        shared = self.shared.pop(work.node_id, (0.0, 0.0))  # its slices, if not counted yet
        fleet = self.strategy.fleet
        self.rows.append(fleet.failed_row(work.number, work.node_id, reason, shared))

    def apply(self, step: Step) -> ArrayRecord:
        """The new global version from ``step.applied``; its rows for the recorder."""
        current = self.versions[self.clock.version - 1]
        updates = [
            (a.update.payload[0], self.versions[a.update.work.base_version], a.weight)
            for a in step.applied
        ]
        new = apply_buffer(current, updates, step.scale)
        self.versions[self.clock.version] = new
        for a in step.applied:
            self.rec.record_update(a.update, a)
            node_id, report = a.update.node_id, a.update.payload[1]
            if report is None:  # fleet-shared profiling: its cost goes in the first work's row
                continue
            self.trained[node_id] = self.trained.get(node_id, 0) + 1
            row = self.strategy.fleet.failed_row(a.update.work.number, node_id, "")
            shared = self.shared.pop(node_id, (0.0, 0.0))
            self.rows.append(update_row(row, report, shared))
        for v in list(self.versions):  # keep the bases still in use and the newest
            if v != self.clock.version and v not in self.clock.bases_in_use():
                del self.versions[v]
        return to_record(new)


def start(run: AsyncRun, arrays: ArrayRecord) -> int:
    """Fleet-shared profiling (once, a synchronous exchange) and every node's first work:
    ``virtual``, each when its kind's LUT is merged (``AsyncRun.deferred``, sent by
    ``next_step``); ``arrival``, all when the exchange ends. Returns the number of profiled
    updates buffered."""
    strategy, clock = run.strategy, run.clock
    arrays = strategy.shared_phase(run.grid, arrays, 1, run.timeout_s)
    if clock.ordering == "virtual" and strategy.shared is not None:
        strategy.shared.train_while_waiting(run.grid, 1, run.timeout_s)
    luts = strategy.luts
    run.shared = dict(luts.cost)
    run.versions[0] = to_numpy(arrays)
    fleet = strategy.fleet
    by_name = sorted(fleet.nodes, key=lambda n: (fleet.nodes[n].node_name, n))  # ties: by name
    for node_id in by_name:  # the clock's ties: by name, as the first works
        if node_id not in run.shared:
            continue
        time_s, energy_j = run.shared[node_id]
        cost = DeviceCost(time_s, energy_j, time_s, energy_j)
        profiled = luts.trained.get(node_id)
        if profiled is None:  # its slices trained nothing
            clock.add_busy(node_id, 0.0, cost)
            continue
        w = luts.waiting_train.get(node_id)
        waited = None if w is None else (w.start_s, DeviceCost(w.time_s, w.energy_j))
        payload = (to_numpy(profiled[0]), None)
        clock.add_profiled(node_id, cost, profiled[1], payload, waited)
    profiled_updates = sum(1 for n in by_name if n in run.shared and n in luts.trained)
    if clock.ordering == "arrival":
        run.send([clock.dispatch(n, luts.round_s) for n in by_name])
        return profiled_updates
    kind_s = {
        n: luts.kind_s.get(luts.kind_of[n], 0.0) if n in luts.kind_of else 0.0 for n in by_name
    }
    # a node that trained while it waited starts when both its kind's LUT and its steps are done
    own_s = {n: run.shared.get(n, (0.0, 0.0))[0] for n in by_name}
    own_s.update({n: w.end_s for n, w in luts.waiting_train.items() if n in own_s})
    run.deferred = sorted((max(kind_s[n], own_s[n]), fleet.nodes[n].node_name, n) for n in by_name)
    return profiled_updates


def run_fedbuff(
    run: AsyncRun, initial: ArrayRecord, budget: UpdateBudget, evaluate_fn: Evaluate
) -> ArrayRecord:
    """The ``fedbuff`` run (see the module docstring) until its ``budget`` is spent or the
    version that reaches the target accuracy by the run's target rule
    (``AsyncRecorder.version_to_target``); returns the final global arrays. Each version is
    evaluated and recorded (``AsyncRecorder``); so is each update it applied. The profiled
    updates come on top of the budget's updates, as a synchronous run's profiling step is
    no round of its ``num-rounds``."""
    fleet, clock, rec = run.strategy.fleet, run.clock, run.rec
    if clock.buffer_size > len(fleet.nodes):
        raise SettingsError(
            f"buffer-size: {clock.buffer_size}, but {len(fleet.nodes)} nodes answered the "
            f"QUERY; give buffer-size at most {len(fleet.nodes)}"
        )
    rec.start(clock, fleet.names, {n: fleet.failed_row(1, n, "") for n in fleet.nodes})
    run.wall_t0_s = run.wall.now()
    evaluate_fn(0, initial)
    profiled = start(run, initial)
    budget = replace(budget, versions=budget.versions + -(-profiled // clock.buffer_size))

    def spent() -> bool:
        live = [n for n in fleet.nodes if n not in clock.gone]
        return budget.spent(clock.version, run.trained, live)

    arrays = to_record(run.versions[0])
    while not spent():
        step = run.next_step()
        if step is None:  # every node dropped out
            log.warning("fedbuff: no node has work left; the run ends at version %d", clock.version)
            break
        if step.applied:
            arrays = run.apply(step)
            metrics = evaluate_fn(clock.version, arrays)
            rec.record_version(run.rows, metrics)
            run.rows = []
            if rec.version_to_target() is not None:
                log.info("target accuracy reached at version %d", clock.version)
                break
            if spent():
                break
        if step.update.work.number > 0:  # a profiled update's node starts as its kind does
            run.send([clock.dispatch(step.update.node_id, step.update.end_s)])
    record_stop(run)
    return arrays


def record_stop(run: AsyncRun) -> None:
    """What the run leaves when it stops: the updates buffered (and, ordered by
    ``arrival``, those whose replies arrived before the stop) as never applied, and the
    works still in flight (a deployment does not wait for them). Ordered by ``virtual``,
    the replies not taken yet end after the stop in device time: they are left out."""
    clock = run.clock
    for update in clock.buffer:  # taken, never applied: the run stopped first
        run.rec.record_update(update, None)
    if clock.ordering == "arrival":  # in before the stop on the wall clock
        for update in clock.drain():
            run.rec.record_update(update, None)
    run.rec.in_flight_at_end = list(clock.in_flight)  # sent, neither replied nor dropped
