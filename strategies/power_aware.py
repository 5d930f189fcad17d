"""PowerAwareFedAvg: FedAvg that sends each node r and its settings, and accounts time/energy."""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fl_client.contract import Cap, NodeDescriptor, NodeRow, TrainConfig, TrainReport
from fl_client.lut import LUT, KindKey
from strategies.aggregation import aggregate_round, check_aggregation
from strategies.round_plan import (
    NodeForecast,
    PlanSettings,
    RoundPlan,
    best_round_time_s,
    plan_round,
    round_record,
)
from strategies.shared_profiling import FleetLUTs, SharedProfiling, run_phase

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    """One synchronous round as the strategy saw it: every node's row (its report, or why it
    has none), the deadline sent (the round plan's; None without one) and warnings.
    Accounting (round time, fleet energy, waiting) is done once, by the run recorder
    (``fl_server.results``).
    """

    server_round: int
    nodes: list[NodeRow]
    deadline_s: float | None = None
    warnings: list[str] = field(default_factory=list)
    #: Fleet-shared profiling before this round's training: the sum over its exchanges of
    #: the slowest node's time (each exchange is a synchronous step of its own)
    shared_round_s: float = 0.0

    @property
    def ok_nodes(self) -> list[NodeRow]:
        return [n for n in self.nodes if n.ok]

    def reports(self) -> list[TrainReport]:
        return [n.report for n in self.nodes if n.ok and n.report is not None]


class PowerAwareFedAvg(FedAvg):
    """FedAvg whose clients choose (batch size, GPU frequency) under their own power caps.

    Before the first round the strategy asks every node (QUERY) for its ``NodeDescriptor``:
    device, backend, power cap and the batch sizes that fit its memory. Each TRAIN message
    is built per node (a fresh RecordDict each) from ``template``: the global arrays and a
    ``TrainConfig`` whose B is cut to what fits the node, with ``r`` aligned to it. Weights
    are aggregated with FedAvg; every node's ``TrainReport`` (or why it has none) is kept in
    a ``RoundReport`` per round for the run recorder.

    Parameters
    ----------
    template : TrainConfig
        The run's TRAIN config: method, model, B and Eq. 3's r (aligned with B), lr-ref,
        b-ref, local-epochs (``server_round`` is set per round).
    query_config : dict
        Keys sent in the QUERY message (``model``, ``batch-sizes``).
    on_round : callable, optional
        Called with each ``RoundReport`` and the server-side evaluation of the new global
        model (the results writer).
    fraction_train, min_train_nodes, min_available_nodes : see ``FedAvg``.
    aggregation : str
        ``fedavg`` or ``fednova`` (``strategies.aggregation``).
    """

    def __init__(
        self,
        *,
        template: TrainConfig,
        query_config: dict[str, Any],
        on_round: Callable[[RoundReport, dict[str, float]], object] | None = None,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        aggregation: str = "fedavg",
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=0.0,
            min_train_nodes=min_train_nodes,
            min_available_nodes=min_available_nodes,
        )
        self.template = template
        self.query_config = dict(query_config)
        self.on_round = on_round
        self.fleet: dict[int, NodeDescriptor] = {}  # node_id -> QUERY reply
        self.query_failures: dict[int, str] = {}
        self.rounds: list[RoundReport] = []
        self._sent_to: dict[str, int] = {}  # message id -> node it was sent to
        self.time_calibration: dict[int, float] = {}  # node -> measured / predicted time
        self._deadline_s: float | None = None
        #: Fleet-shared profiling (``strategies.shared_profiling``; None: each node its own)
        self.shared: SharedProfiling | None = None
        self.luts = FleetLUTs()
        #: The round plan (``strategies.round_plan``; None: ``balance = "off"``)
        self.planning: PlanSettings | None = None
        self.plan: RoundPlan | None = None
        self.plan_log: list[dict[str, Any]] = []  # per planned round: deadline, pace, misses
        self._last: dict[int, TrainReport] = {}  # node -> its last report
        self._measured_s: dict[int, float] = {}  # node -> time of a missed deadline
        # Aggregation (strategies/aggregation.py): the mode and the arrays the round sent
        self.aggregation = check_aggregation(aggregation)
        self._sent_arrays: ArrayRecord | None = None

    @property
    def batch_sizes(self) -> list[int]:
        return list(self.template.batch_sizes)

    @property
    def r(self) -> list[float]:
        return list(self.template.r)

    def node_of(self, reply: Message) -> int:
        """The node a reply answers for.

        A reply the SuperLink makes itself (e.g. "Node Unavailable" once a node misses its
        heartbeats) has the SuperLink's id as source: map it back through the message it
        answers, whose id ``send_and_receive`` filled in on the sent message.
        """
        src = reply.metadata.src_node_id
        return self._sent_to.get(reply.metadata.reply_to_message_id, src)

    def send_and_receive(
        self, grid: Grid, messages: list[Message], timeout_s: float
    ) -> list[Message]:
        replies = list(grid.send_and_receive(messages, timeout=timeout_s))
        self._sent_to = {
            m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id
        }
        return replies

    def _row(self, server_round: int, node_id: int, error: str) -> NodeRow:
        """A failed node's row, with its name, device and real cap where the QUERY gave them,
        and its shared-profiling slices of this round (measured even if its TRAIN failed)."""
        desc = self.fleet.get(node_id)
        shared_s, shared_j = self.luts.cost.get(node_id, (0.0, 0.0))
        if desc is None:
            name, device, cap = str(node_id), "?", Cap.NONE
        else:
            name, device, cap = desc.node_name, desc.device, desc.cap_at(server_round)
        return NodeRow(
            server_round,
            node_id,
            name,
            device,
            cap,
            False,
            error=error,
            shared_time_s=shared_s,
            shared_energy_j=shared_j,
        )

    # ----------------------------------------------------------------------------- QUERY
    def query_fleet(self, grid: Grid, timeout_s: float) -> dict[int, NodeDescriptor]:
        """Ask every connected node for its device descriptor and power cap, after waiting
        up to ``timeout_s`` for ``min_available_nodes`` (``min-train-nodes``) to connect.

        Flower's ``sample_nodes`` waits for them forever; a fleet that never gets that large
        (a SuperNode down, a typo in its address) must end the run with the reason instead.
        The wait sleeps in short steps, so Ctrl-C ends it at once.
        """
        need, t0 = self.min_available_nodes, time.monotonic()
        next_note = t0
        while len(node_ids := list(grid.get_node_ids())) < need:
            waited = time.monotonic() - t0
            if waited >= timeout_s:
                raise RuntimeError(
                    f"min-train-nodes: {len(node_ids)} of the {need} nodes it needs connected "
                    f"within round-timeout-s ({timeout_s:g} s); start the missing SuperNodes "
                    "(check their SuperLink address) or lower min-train-nodes"
                )
            if time.monotonic() >= next_note:
                log.info(
                    "waiting for nodes: %d of the %d that min-train-nodes needs have "
                    "connected; giving up in %.0f s (round-timeout-s)",
                    len(node_ids),
                    need,
                    timeout_s - waited,
                )
                next_note += 10.0
            time.sleep(min(0.5, max(0.0, timeout_s - waited)))
        return self._query(grid, node_ids, timeout_s)

    def query_new_nodes(self, grid: Grid, timeout_s: float) -> dict[int, NodeDescriptor]:
        """QUERY the nodes that connected after the run began (a node that fails its QUERY
        is not asked again), so a node joining later trains, with its kind's LUT."""
        new = [
            n for n in grid.get_node_ids() if n not in self.fleet and n not in self.query_failures
        ]
        return self._query(grid, new, timeout_s) if new else self.fleet

    def _query(
        self, grid: Grid, node_ids: list[int], timeout_s: float
    ) -> dict[int, NodeDescriptor]:
        messages = [
            Message(
                content=RecordDict({"config": ConfigRecord(dict(self.query_config))}),
                message_type=MessageType.QUERY,
                dst_node_id=node_id,
            )
            for node_id in node_ids
        ]
        for reply in self.send_and_receive(grid, messages, timeout_s):
            node_id = self.node_of(reply)
            if reply.has_error():
                self.query_failures[node_id] = str(reply.error.reason)
                continue
            try:
                self.fleet[node_id] = NodeDescriptor.from_config(dict(reply.content["device"]))
            except (ValueError, KeyError) as err:
                self.query_failures[node_id] = f"malformed QUERY reply: {err}"
        for node_id in node_ids:  # never asked again: each later round would wait for it
            if node_id not in self.fleet and node_id not in self.query_failures:
                self.query_failures[node_id] = "no reply to the QUERY (timeout)"
        return self.fleet

    def node_batch_sizes(self, node_id: int) -> tuple[list[int], list[float]]:
        """B restricted to what fits the node's memory, with r aligned to it."""
        desc = self.fleet.get(node_id)
        max_b = self.batch_sizes[-1] if desc is None else desc.max_batch_size
        pairs = [(b, r) for b, r in zip(self.batch_sizes, self.r, strict=True) if b <= max_b]
        if not pairs:  # nothing fits: send the smallest and let the node explain
            pairs = [(self.batch_sizes[0], self.r[0])]
        return [b for b, _ in pairs], [r for _, r in pairs]

    def r_rows(self, batch_sizes: Sequence[int]) -> list[float]:
        """r_b for each of ``batch_sizes`` (a LUT's rows); NaN for a b without an r."""
        by_b = dict(zip(self.batch_sizes, self.r, strict=True))
        return [by_b.get(b, math.nan) for b in batch_sizes]

    def node_config(self, server_round: int, node_id: int) -> TrainConfig:
        """The TRAIN config of ``node_id`` in ``server_round``."""
        b_node, r_node = self.node_batch_sizes(node_id)
        deadline = self._deadline_s
        return dataclasses.replace(
            self.template,
            server_round=server_round,
            batch_sizes=tuple(b_node),
            r=tuple(r_node),
            deadline_s=deadline,
            time_calibration=self.time_calibration.get(node_id, 1.0) if deadline else 1.0,
            kind_lut=self.luts.lut_json(node_id),
            critical=self.plan is not None and node_id in self.plan.critical,
        )

    # ----------------------------------------------------------------------------- TRAIN
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One TRAIN message per node, each with its own RecordDict."""
        if self.fraction_train == 0.0:
            return []
        available = sorted(n for n in grid.get_node_ids() if n in self.fleet)
        sample_size = max(int(len(available) * self.fraction_train), self.min_train_nodes)
        sample_size = min(sample_size, len(available))
        node_ids = (
            available
            if sample_size == len(available)
            else sorted(random.sample(available, sample_size))
        )
        self._deadline_s = None
        self.plan = None
        if self.planning is not None and server_round > 1:
            self.plan = self.plan_round(server_round, node_ids)
            finite = math.isfinite(self.plan.deadline_s)
            self._deadline_s = self.plan.deadline_s if finite else None
        self._sent_arrays = arrays  # FedNova's base (aggregate_train)
        messages = []
        for node_id in node_ids:
            node_cfg = ConfigRecord(self.node_config(server_round, node_id).to_config())
            content = RecordDict({"arrays": arrays, "config": node_cfg})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)
            )
        return messages

    def sort_key(self, reply: Message) -> tuple[str, int]:
        """Replies in the fleet's order: node name, then id."""
        node_id = self.node_of(reply)
        desc = self.fleet.get(node_id)
        return ("" if desc is None else desc.node_name, node_id)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg (or FedNova, by ``aggregation``) of the arrays; every node's report kept in
        a ``RoundReport``.

        Replies are taken in the fleet's order (node name, then id), not in arrival order, so
        the floating-point sums of FedAvg, and with them a whole run, repeat exactly for the
        same fleet, data and seeds.
        """
        rows: list[NodeRow] = []
        good: list[RecordDict] = []
        for msg in sorted(replies, key=self.sort_key):
            node_id = self.node_of(msg)
            if msg.has_error():
                rows.append(self._row(server_round, node_id, str(msg.error.reason)))
                continue
            try:
                report = TrainReport.from_metrics(dict(msg.content["metrics"]))
            except (ValueError, TypeError) as err:
                rows.append(self._row(server_round, node_id, str(err)))
                continue
            row = self._row(server_round, node_id, "")
            rows.append(dataclasses.replace(row, ok=True, report=report, p_max=report.cap))
            good.append(msg.content)
            self._remember_calibration(node_id, report)
            self._distrust_library_lut(server_round, node_id, report)
            self._last[node_id] = report
        report_ = RoundReport(
            server_round, rows, deadline_s=self._deadline_s, shared_round_s=self.luts.round_s
        )
        self._record_plan(report_)
        self.rounds.append(report_)
        if not good:
            return None, None
        # FedAvg, or FedNova by each node's local work (strategies/aggregation.py)
        arrays, warning = aggregate_round(
            self.aggregation, self._sent_arrays, good, self.weighted_by_key, server_round
        )
        if warning:
            log.warning(warning)
            report_.warnings.append(warning)
        ok = report_.reports()
        agg = MetricRecord(
            {
                "nodes-ok": len(ok),
                "nodes-failed": len(rows) - len(ok),
                "num-examples": sum(r.num_examples for r in ok),
            }
        )
        return arrays, agg

    def _distrust_library_lut(self, server_round: int, node_id: int, report: TrainReport) -> None:
        """A node whose round disagreed with its kind's LUT (its peak beyond the promise,
        its LUT set aside, or its check of the kind's cell re-profiled) while that LUT came
        from the library: the library copy is set aside and the run drops it, so the next
        round profiles the kind again (and its new LUT replaces the library's), and no
        fresh node of the kind, in this run or a later one, trusts the wrong numbers."""
        if self.shared is None or not (report.lut_set_aside or report.kind_reprofiled):
            return
        kind = self.luts.kind_of.get(node_id)
        entry = next(
            (e for e in self.luts.log if kind is not None and e.get("kind") == kind.label), None
        )
        if kind is None or entry is None or entry.get("source") != "library":
            return
        what = "peaked over its LUT's promise" if report.lut_set_aside else "re-profiled"
        reason = f"node {node_id} {what} in round {server_round}"
        setter = getattr(self.shared.library, "set_aside", None)
        kept = setter(kind, reason) if setter is not None else "library cannot set aside"
        entry.update(source="library, set aside", **{"set-aside": f"{reason}; {kept}"})
        self.luts.kind_luts.pop(kind, None)

    # ----------------------------------------------------------------------------- plan
    def forecast(self, node_id: int, server_round: int) -> NodeForecast:
        """A node's predicted best round time: its measured time after a missed deadline;
        else its kind's LUT × its last local work × its calibration; else what it reported
        (``fastest-time-s``); inf when nothing is known yet."""
        assert self.planning is not None
        if node_id in self._measured_s:
            return NodeForecast(node_id, self._measured_s.pop(node_id), "measured")
        last = self._last.get(node_id)
        kind = self.luts.kind_of.get(node_id)
        lut = None if kind is None else self.luts.kind_luts.get(kind)
        desc = self.fleet.get(node_id)
        if lut is not None and last is not None and desc is not None:
            best = best_round_time_s(
                lut.time_per_sample_s,
                lut.peak_power_w,
                lut.peak_sigma_w,
                desc.cap_at(server_round).with_margin(desc.cap_margin),
                self.template.local_epochs * last.num_examples,
                calibration=self.time_calibration.get(node_id, 1.0),
                objective=self.planning.pace_objective,
                r=self.r_rows(lut.batch_sizes),
                avg_power_w=lut.avg_power_w,
            )
            if math.isfinite(best):
                return NodeForecast(node_id, best, "lut")
        reported = None if last is None else last.fastest_time_s
        if reported is not None and math.isfinite(reported) and reported > 0:
            return NodeForecast(node_id, reported, "reported")
        return NodeForecast(node_id, math.inf, "none")

    def plan_round(self, server_round: int, node_ids: list[int]) -> RoundPlan:
        """This round's plan over ``node_ids`` (``strategies.round_plan.plan_round``)."""
        assert self.planning is not None
        forecasts = [self.forecast(n, server_round) for n in node_ids]
        return plan_round(forecasts, self.planning.round_deadline_s)

    def _record_plan(self, report: RoundReport) -> None:
        """The plan's record of the round (``round_plan.round_record``): warnings in the
        round's record, the late nodes' measured times for the next plan, the run's log."""
        plan, planning = self.plan, self.planning
        if plan is None or planning is None or not math.isfinite(plan.deadline_s):
            return
        times = {n.node_id: n.report.train_time_s for n in report.nodes if n.report is not None}
        names = {n: d.node_name for n, d in self.fleet.items()}
        warnings, late, entry = round_record(plan, planning, report.server_round, times, names)
        report.warnings.extend(warnings)
        self._measured_s.update(late)
        self.plan_log.append(entry)

    def _remember_calibration(self, node_id: int, report: TrainReport) -> None:
        """Keep the node's calibration (measured / LUT-predicted time of its last round)."""
        predicted = report.predicted_time_s
        if predicted is not None and predicted > 0 and report.train_time_s > 0:
            self.time_calibration[node_id] = report.train_time_s / predicted

    # ----------------------------------------------------------------------------- shared
    @property
    def kind_luts(self) -> dict[KindKey, LUT]:
        return self.luts.kind_luts

    @property
    def shared_log(self) -> list[dict[str, Any]]:
        return self.luts.log

    def shared_phase(
        self, grid: Grid, arrays: ArrayRecord, server_round: int, timeout_s: float
    ) -> ArrayRecord:
        """Fleet-shared profiling before ``server_round``'s training (methods that select
        from a LUT; ``shared_profiling.run_phase``); returns the global arrays."""
        if self.shared is None or self.template.method not in ("power-aware", "oracle"):
            return arrays
        return run_phase(
            self.shared,
            self.luts,
            self,
            grid,
            arrays,
            fleet=self.fleet,
            batch_sizes={n: self.node_batch_sizes(n)[0] for n in self.fleet},
            template=self.template,
            server_round=server_round,
            timeout_s=timeout_s,
        )

    # ----------------------------------------------------------------------------- loop
    def run(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        *,
        num_rounds: int,
        timeout_s: float,
        evaluate_fn: Callable[[int, ArrayRecord], dict[str, float]],
        target_accuracy: float | None = None,
    ) -> ArrayRecord:
        """QUERY round, then TRAIN rounds until ``target_accuracy`` or ``num_rounds``.

        Flower's ``Strategy.start`` always runs every round; stopping at a target
        accuracy is what time-to-accuracy needs, hence this loop over the same hooks.
        """
        if not self.fleet:
            self.query_fleet(grid, timeout_s)
        if not self.fleet:
            raise RuntimeError("no node answered the QUERY round; nothing to train")
        arrays = initial_arrays
        evaluate_fn(0, arrays)
        for server_round in range(1, num_rounds + 1):
            if server_round > 1:
                self.query_new_nodes(grid, timeout_s)
            arrays = self.shared_phase(grid, arrays, server_round, timeout_s)
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
            replies = self.send_and_receive(grid, messages, timeout_s)
            sent = {m.metadata.dst_node_id for m in messages}
            got = {self.node_of(m) for m in replies}
            new_arrays, _ = self.aggregate_train(server_round, replies)
            self._name_the_silent(server_round, sent, got)
            if new_arrays is not None:
                arrays = new_arrays
            ev = evaluate_fn(server_round, arrays)
            if self.on_round is not None:
                self.on_round(self.rounds[-1], ev)
            acc = ev.get("accuracy", math.nan)
            if target_accuracy is not None and acc >= target_accuracy:
                log.info("target accuracy %.3f reached in round %d", target_accuracy, server_round)
                break
        return arrays

    def _name_the_silent(self, server_round: int, sent: set[int], got: set[int]) -> None:
        """Rows for nodes that sent no reply, and (all asked) for nodes that were absent."""
        nodes = self.rounds[-1].nodes
        for node_id in sorted(sent - got):  # no reply at all within the timeout
            nodes.append(self._row(server_round, node_id, "no reply (timeout)"))
        if self.fraction_train >= 1.0:  # every connected node is asked: name the absent
            for node_id in sorted(set(self.fleet) - sent):
                error = "not connected this round (absent from the SuperLink)"
                nodes.append(self._row(server_round, node_id, error))
