"""Fleet-shared profiling over Flower: the exchanges ``strategies.shared_profiling`` plans,
sent to the fleet's nodes, their profiled updates aggregated with the run's
``aggregation``, and the kinds' LUTs kept for the run and in the LUT library."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fl_client.contract import CellsReport, ProfileRequest, TrainConfig, TrainReport
from fl_client.lut import LUT, KindKey
from fl_client.lut_plan import BF
from strategies.aggregation import aggregate_round
from strategies.fleet import Fleet
from strategies.shared_profiling import (
    KindProfile,
    SharedOptions,
    exchanges,
    kinds_of,
    waiting_cell,
)

log = logging.getLogger(__name__)

#: The message type of a profiling exchange (``fl_client.client_app``'s handler)
PROFILE = "train.profile"


class KindLibrary(Protocol):
    """Where one LUT per kind is kept across runs (``fl_server.lut_library.LUTLibrary``)."""

    def get(self, kind: KindKey) -> LUT | None: ...

    def put(self, lut: LUT, source: str) -> Any: ...

    def set_aside(self, kind: KindKey, reason: str) -> str: ...


@dataclass(frozen=True)
class SharedProfiling:
    """The settings of fleet-shared profiling (a run's ``SharedExchange`` runs it).

    ``library`` gets and keeps one LUT per kind across runs; ``input_shape`` is the model's
    sample shape; ``steps_train`` keeps the profiled minibatches' updates; ``per_node``
    keeps them per node (``FleetLUTs.trained``: each node continues from its own profiled
    arrays, nothing is averaged) for a run that buffers them as updates (fedbuff);
    ``waiting`` is what such a node does until its kind's LUT is merged (``while-waiting``).
    """

    library: KindLibrary
    input_shape: tuple[int, ...]
    options: SharedOptions = field(default_factory=SharedOptions)
    steps_train: bool = False
    warmup_steps: int = 1
    steps: int = 3
    per_node: bool = False
    #: ``while-waiting``: ``train`` (``SharedExchange.train_while_waiting``) or ``idle``
    waiting: str = "train"


@dataclass(frozen=True)
class Waited:
    """What a node trained while it waited for its kind's LUT: from ``start_s`` (device
    time since the profiling began), ``time_s`` and ``energy_j`` of steps at ``cell``."""

    start_s: float
    time_s: float
    energy_j: float
    cell: BF
    steps: int

    @property
    def end_s(self) -> float:
        return self.start_s + self.time_s


@dataclass
class FleetLUTs:
    """The kinds' LUTs a run keeps, how each was made, and this round's profiling cost."""

    kind_luts: dict[KindKey, LUT] = field(default_factory=dict)
    kind_of: dict[int, KindKey] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)  # per kind: how its LUT was made
    #: node -> (s, J) of its slices this round
    cost: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: this round's sum over its exchanges of the slowest node's time
    round_s: float = 0.0
    #: per kind, this round's sum over its exchanges of its slowest node's time: when the
    #: kind's LUT is merged, on the devices' time (a fedbuff run starts its nodes then)
    kind_s: dict[KindKey, float] = field(default_factory=dict)
    #: ``SharedProfiling.per_node``: node -> its profiled arrays and the examples they saw
    trained: dict[int, tuple[ArrayRecord, float]] = field(default_factory=dict)
    #: ``SharedProfiling.per_node``: node -> the cells of its first slice, as it measured them
    first_slice: dict[int, CellsReport] = field(default_factory=dict)
    #: node -> what it trained while it waited for its kind's LUT (``train_while_waiting``)
    waiting_train: dict[int, Waited] = field(default_factory=dict)
    #: this round's warnings (the first exchange whose aggregation fell back to FedAvg)
    warnings: list[str] = field(default_factory=list)

    def lut_of(self, node_id: int) -> LUT | None:
        """The LUT of ``node_id``'s kind (None: none yet)."""
        kind = self.kind_of.get(node_id)
        return None if kind is None else self.kind_luts.get(kind)

    def lut_json(self, node_id: int) -> str | None:
        """The LUT of ``node_id``'s kind as JSON (None: none yet)."""
        lut = self.lut_of(node_id)
        return None if lut is None else lut.to_json()


@dataclass(frozen=True)
class SharedExchange:
    """Fleet-shared profiling as a run runs it: the ``setup``, the run's kinds' LUTs
    (``luts``), the fleet whose nodes measure them, the TRAIN template (model, B and r,
    lr-ref, b-ref), and the run's ``aggregation`` of the profiled updates with the metric
    that weighs a node in it."""

    setup: SharedProfiling
    luts: FleetLUTs
    fleet: Fleet
    template: TrainConfig
    aggregation: str = "fedavg"
    weight_key: str = "num-examples"

    def run_phase(
        self, grid: Grid, arrays: ArrayRecord, server_round: int, timeout_s: float
    ) -> ArrayRecord:
        """Fleet-shared profiling before ``server_round``'s training, for every kind of the
        fleet that has no LUT yet (none in the library either): the seed exchange, then the
        confirm exchanges (``exchanges``); returns the global arrays (moved by the profiled
        steps when they train). Each node's B is what fits its memory."""
        setup, luts, fleet = self.setup, self.luts, self.fleet
        luts.cost, luts.round_s, luts.kind_s, luts.warnings = {}, 0.0, {}, []
        luts.trained, luts.first_slice, luts.waiting_train = {}, {}, {}
        batch_sizes = {n: fleet.batch_sizes_of(n)[0] for n in fleet.nodes}
        kinds = kinds_of(fleet.nodes, batch_sizes, self.template.model, setup.input_shape)
        luts.kind_of = {n: k for k, prof in kinds.items() for n in prof.nodes}
        todo = {k: p for k, p in kinds.items() if k not in luts.kind_luts}
        for kind in list(todo):
            known = setup.library.get(kind)
            if known is not None:
                luts.kind_luts[kind] = known
                luts.log.append({"kind": kind.label, "source": "library"})
                del todo[kind]
        if not todo:
            return arrays
        r_by_b = dict(zip(self.template.batch_sizes, self.template.r, strict=True))
        r_of = {k: [r_by_b[b] for b in k.batch_sizes] for k in todo}
        step = _Step(grid, server_round, timeout_s)
        for requests in exchanges(todo, r_of, setup.options):
            arrays = self._exchange(step, arrays, requests, todo)
        self._store_kinds(todo)
        return arrays

    def _exchange(
        self,
        step: _Step,
        arrays: ArrayRecord,
        requests: dict[int, list[BF]],
        kinds: dict[KindKey, KindProfile],
    ) -> ArrayRecord:
        """One synchronous profiling exchange: send each node its cells, merge the replies
        into their kinds, account the slowest node's time, aggregate the trained arrays."""
        if not requests:
            return arrays
        setup, luts, fleet, template = self.setup, self.luts, self.fleet, self.template
        messages = []
        for node_id, cells in sorted(requests.items()):
            req = ProfileRequest(
                server_round=step.server_round,
                model=template.model,
                batch_sizes=luts.kind_of[node_id].batch_sizes,
                cells_b=tuple(b for b, _ in cells),
                cells_knob_value=tuple(f for _, f in cells),
                lr_ref=template.lr_ref,
                b_ref=template.b_ref,
                steps_train=setup.steps_train,
                warmup_steps=setup.warmup_steps,
                steps=setup.steps,
            )
            own = luts.trained.get(node_id) if setup.per_node else None
            start = arrays if own is None else own[0]
            content = RecordDict({"arrays": start, "config": ConfigRecord(req.to_config())})
            messages.append(Message(content, message_type=PROFILE, dst_node_id=node_id))
        slowest_s, trained = 0.0, []
        kind_slowest: dict[KindKey, float] = {}
        replies = fleet.send_and_receive(step.grid, messages, step.timeout_s)
        # by node name, as in aggregate_train: the average's float sums then run in one
        # order, so a run's weights do not depend on which reply came first
        for reply in fleet.ordered(replies):
            node_id = fleet.node_of(reply)
            if reply.has_error():
                log.warning(
                    "shared profiling: node %s failed its slice: %s", node_id, reply.error.reason
                )
                continue
            report = CellsReport.from_metrics(dict(reply.content["metrics"]))
            kinds[luts.kind_of[node_id]].add(report)
            t, e = luts.cost.get(node_id, (0.0, 0.0))
            luts.cost[node_id] = (t + report.profile_time_s, e + report.profile_energy_j)
            slowest_s = max(slowest_s, report.profile_time_s)
            kind = luts.kind_of[node_id]
            kind_slowest[kind] = max(kind_slowest.get(kind, 0.0), report.profile_time_s)
            if setup.per_node:
                luts.first_slice.setdefault(node_id, report)
            if report.num_examples > 0:
                trained.append(reply.content)
                if setup.per_node:
                    seen = luts.trained.get(node_id, (arrays, 0.0))[1]
                    luts.trained[node_id] = (
                        reply.content.array_records["arrays"],
                        seen + report.num_examples,
                    )
        luts.round_s += slowest_s
        for kind, kind_s in kind_slowest.items():
            luts.kind_s[kind] = luts.kind_s.get(kind, 0.0) + kind_s
        if not trained or setup.per_node:
            return arrays
        new, warning = aggregate_round(
            self.aggregation, arrays, trained, self.weight_key, step.server_round
        )
        if warning and not luts.warnings:  # once a round: each exchange would say the same
            log.warning("shared profiling: %s", warning)
            luts.warnings.append(f"shared profiling: {warning}")
        return new

    def train_while_waiting(self, grid: Grid, server_round: int, timeout_s: float) -> None:
        """``fedbuff`` on the devices' time (``SharedProfiling.per_node`` with
        ``steps_train``): a node whose own slices end before its kind's LUT is merged
        (``FleetLUTs.kind_s``) trains in that gap instead of waiting idle, from its own
        profiled arrays, for as many steps as fit (``shared_profiling.waiting_cell``), at
        the fastest cell feasible under its caps that it knows of when it starts: from the
        end of its slices, those of its own first slice and of every other first slice of
        its kind that ended by then; if none is feasible, from the end of the next such
        slice that brings one (``_waiting_plan``; before that it waits).

        One exchange after the profiling, sent as a profiling request (no warm-up, the steps
        kept). What it cost goes to ``FleetLUTs.waiting_train``; its steps continue the
        node's profiled update (``FleetLUTs.trained``). The kind's LUT is not touched. A
        node that fails it keeps its profiled update as it was."""
        setup, luts, fleet, template = self.setup, self.luts, self.fleet, self.template
        if not (setup.per_node and setup.steps_train and setup.waiting == "train"):
            return
        messages, plans = [], {}
        for node_id in sorted(luts.trained):
            plan = self._waiting_plan(node_id)
            if plan is None:
                continue
            start_s, (b, f), steps = plan
            kind = luts.kind_of[node_id]
            req = ProfileRequest(
                server_round=server_round,
                model=template.model,
                batch_sizes=kind.batch_sizes,
                cells_b=(b,),
                cells_knob_value=(f,),
                lr_ref=template.lr_ref,
                b_ref=template.b_ref,
                steps_train=True,
                warmup_steps=0,
                steps=steps,
            )
            content = RecordDict(
                {"arrays": luts.trained[node_id][0], "config": ConfigRecord(req.to_config())}
            )
            messages.append(Message(content, message_type=PROFILE, dst_node_id=node_id))
            plans[node_id] = plan
        if not messages:
            return
        replies = fleet.send_and_receive(grid, messages, timeout_s)
        for reply in fleet.ordered(replies):
            node_id = fleet.node_of(reply)
            if node_id not in plans:
                continue
            if reply.has_error():
                log.warning(
                    "shared profiling: node %s failed to train while it waited: %s",
                    node_id,
                    reply.error.reason,
                )
                continue
            report = CellsReport.from_metrics(dict(reply.content["metrics"]))
            start_s, cell, steps = plans[node_id]
            luts.waiting_train[node_id] = Waited(
                start_s, report.profile_time_s, report.profile_energy_j, cell, steps
            )
            seen = luts.trained[node_id][1]
            luts.trained[node_id] = (
                reply.content.array_records["arrays"],
                seen + report.num_examples,
            )

    def _waiting_plan(self, node_id: int) -> tuple[float, BF, int] | None:
        """When ``node_id`` starts training while it waits, at which cell, how many steps
        (``train_while_waiting``): at the first moment, from the end of its own slices, at
        which a cell of its kind's first exchange known by then (its own slice, and each
        other node's once that slice has ended) is feasible for it. None: no gap, no
        feasible cell, or no step fits."""
        luts, fleet = self.luts, self.fleet
        kind = luts.kind_of.get(node_id)
        if kind is None or node_id not in luts.first_slice or node_id not in fleet.nodes:
            return None
        d = fleet.nodes[node_id]
        limits = [cap.with_margin(d.cap_margin) for cap in d.all_caps()]
        k = self.setup.options.peak_sigma_k
        merged_s, own_s = luts.kind_s.get(kind, 0.0), luts.cost.get(node_id, (0.0, 0.0))[0]
        # the kind's first slices by when they ended (each exchange starts at 0 for its nodes)
        slices = sorted(
            (report.profile_time_s, n, report)
            for n, report in luts.first_slice.items()
            if luts.kind_of.get(n) == kind
        )
        for start_s in sorted({own_s} | {end for end, _, _ in slices if end > own_s}):
            known = [
                cell
                for end, n, report in slices
                if end <= start_s or n == node_id
                for cell in report.measurements()
            ]
            plan = waiting_cell(known, limits, merged_s - start_s, k)
            if plan is not None:
                return start_s, plan[0], plan[1]
        return None

    def _store_kinds(self, kinds: dict[KindKey, KindProfile]) -> None:
        """Each kind's merged LUT: kept for the run and in the library."""
        luts = self.luts
        for kind, prof in kinds.items():
            cost = [luts.cost.get(n, (0.0, 0.0)) for n in prof.nodes]
            lut = prof.lut(sum(c[0] for c in cost), sum(c[1] for c in cost))
            entry: dict[str, Any] = {"kind": kind.label, "nodes": len(prof.nodes)}
            if lut is None:
                entry["source"] = "none: no cell measured; its nodes profile their own"
            else:
                luts.kind_luts[kind] = lut
                entry.update(source="fleet-shared", cells=lut.cells_profiled)
                try:
                    self.setup.library.put(lut, "fleet-shared")
                except OSError as err:
                    entry["library"] = f"not saved: {err}"
                    _not_saved(kind, err, "make the library folder writable to keep it")
                except ValueError as err:  # the library refuses the kind's names
                    entry["library"] = f"not saved: {err}"
                    _not_saved(
                        kind,
                        err,
                        "the library refuses the kind's device kind, backend or model name "
                        "as a file name; a writable folder would not help",
                    )
            luts.log.append(entry)

    def distrust_library_lut(self, server_round: int, node_id: int, report: TrainReport) -> None:
        """A node whose round disagreed with its kind's LUT (its peak beyond the promise,
        its LUT set aside, or its check of the kind's cell re-profiled) while that LUT came
        from the library: the library copy is set aside and the run drops it, so the next
        round profiles the kind again (and its new LUT replaces the library's), and no fresh
        node of the kind, in this run or a later one, trusts the wrong numbers."""
        if not (report.lut_set_aside or report.kind_reprofiled):
            return
        luts = self.luts
        kind = luts.kind_of.get(node_id)
        entry = next(
            (e for e in luts.log if kind is not None and e.get("kind") == kind.label), None
        )
        if kind is None or entry is None or entry.get("source") != "library":
            return
        what = "peaked over its LUT's promise" if report.lut_set_aside else "re-profiled"
        reason = f"node {node_id} {what} in round {server_round}"
        kept = self.setup.library.set_aside(kind, reason)
        entry.update(source="library, set aside", **{"set-aside": f"{reason}; {kept}"})
        luts.kind_luts.pop(kind, None)


def _not_saved(kind: KindKey, err: Exception, why: str) -> None:
    log.warning(
        "LUT library: could not save the LUT of %s (%s); this run uses it, a later run "
        "profiles the kind again; %s",
        kind.label,
        err,
        why,
    )


@dataclass(frozen=True)
class _Step:
    """One shared phase's grid, round and how long an exchange waits for its replies."""

    grid: Grid
    server_round: int
    timeout_s: float
