"""PowerAwareFedAvg: FedAvg that sends each node its own TRAIN config (its B and r, the
round's deadline and role, its kind's LUT) and keeps every node's report, round by round."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fl_client.contract import NodeRow, TrainConfig, TrainReport
from strategies.aggregation import aggregate_round, check_aggregation
from strategies.fleet import Fleet
from strategies.round_plan import PlanSettings, RoundPlanner
from strategies.shared_exchange import FleetLUTs, SharedExchange, SharedProfiling

log = logging.getLogger(__name__)

#: Methods that select from a LUT: the ones fleet-shared profiling measures a LUT for
LUT_METHODS = ("power-aware", "oracle")


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

    Each TRAIN message is built per node (a fresh RecordDict each) from ``template``: the
    global arrays and a ``TrainConfig`` whose B is cut to what fits the node (its QUERY
    reply, ``strategies.fleet.Fleet``), with ``r`` aligned to it, the round plan's deadline
    and role, and its kind's LUT. Weights are aggregated with ``aggregation``; every node's
    ``TrainReport`` (or why it has none) is kept in a ``RoundReport`` per round.

    Parameters
    ----------
    template : TrainConfig
        The run's TRAIN config: method, model, B and Eq. 3's r (aligned with B), lr-ref,
        b-ref, local-epochs (``server_round`` is set per round). The QUERY sends its model
        and B.
    min_train_nodes : int
        Nodes the QUERY waits for and each round trains at least (``min-train-nodes``).
    fraction_train : float
        Share of the connected nodes each round trains (see ``FedAvg``).
    aggregation : str
        ``fedavg`` or ``fednova`` (``strategies.aggregation``), for TRAIN and profiled updates.
    planning : PlanSettings, optional
        The round plan (``strategies.round_plan``; None: ``balance = "off"``).
    shared : SharedProfiling, optional
        Fleet-shared profiling (``strategies.shared_exchange``) for the methods that select
        from a LUT (None: each node profiles its own).
    """

    def __init__(
        self,
        *,
        template: TrainConfig,
        min_train_nodes: int = 2,
        fraction_train: float = 1.0,
        aggregation: str = "fedavg",
        planning: PlanSettings | None = None,
        shared: SharedProfiling | None = None,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=0.0,
            min_train_nodes=min_train_nodes,
            min_available_nodes=min_train_nodes,
        )
        self.template = template
        self.aggregation = check_aggregation(aggregation)
        query = {"model": template.model, "batch-sizes": list(template.batch_sizes)}
        self.fleet = Fleet(query, template.batch_sizes, template.r, min_train_nodes)
        self.planner = None if planning is None else RoundPlanner(planning, template.local_epochs)
        self.luts = FleetLUTs()
        self.shared = None  # fleet-shared profiling: for the methods that select from a LUT
        if shared is not None and template.method in LUT_METHODS:
            self.shared = SharedExchange(
                shared, self.luts, self.fleet, template, self.aggregation, self.weighted_by_key
            )
        self.rounds: list[RoundReport] = []
        self._sent_arrays: ArrayRecord | None = None  # the round's global arrays (FedNova's base)

    def node_config(self, server_round: int, node_id: int) -> TrainConfig:
        """The TRAIN config of ``node_id`` in ``server_round``."""
        b_node, r_node = self.fleet.batch_sizes_of(node_id)
        plan = self.planner
        return dataclasses.replace(
            self.template,
            server_round=server_round,
            batch_sizes=tuple(b_node),
            r=tuple(r_node),
            deadline_s=None if plan is None else plan.deadline_s,
            time_calibration=1.0 if plan is None else plan.calibration_of(node_id),
            kind_lut=self.luts.lut_json(node_id),
            critical=plan is not None and plan.is_critical(node_id),
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One TRAIN message per node, each with its own RecordDict."""
        if self.fraction_train == 0.0:
            return []
        node_ids = self.fleet.sample(grid, self.fraction_train, self.min_train_nodes)
        if self.planner is not None:
            self.planner.begin(server_round, node_ids, self.fleet, self.luts.lut_of)
        self._sent_arrays = arrays
        messages = []
        for node_id in node_ids:
            node_cfg = ConfigRecord(self.node_config(server_round, node_id).to_config())
            content = RecordDict({"arrays": arrays, "config": node_cfg})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg (or FedNova, by ``aggregation``) of the arrays; every node's report kept in
        a ``RoundReport``. Replies are taken in the fleet's order (``Fleet.ordered``)."""
        rows: list[NodeRow] = []
        good: list[RecordDict] = []
        for msg in self.fleet.ordered(replies):
            node_id = self.fleet.node_of(msg)
            if msg.has_error():
                rows.append(self.failed_row(server_round, node_id, str(msg.error.reason)))
                continue
            try:
                report = TrainReport.from_metrics(dict(msg.content["metrics"]))
            except (ValueError, TypeError) as err:
                rows.append(self.failed_row(server_round, node_id, str(err)))
                continue
            row = self.failed_row(server_round, node_id, "")
            rows.append(dataclasses.replace(row, ok=True, report=report, p_max=report.cap))
            good.append(msg.content)
            if self.shared is not None:
                self.shared.distrust_library_lut(server_round, node_id, report)
            if self.planner is not None:
                self.planner.observe(node_id, report)
        round_ = RoundReport(
            server_round,
            rows,
            deadline_s=None if self.planner is None else self.planner.deadline_s,
            warnings=list(self.luts.warnings),
            shared_round_s=self.luts.round_s,
        )
        if self.planner is not None:
            times = {n.node_id: n.report.train_time_s for n in rows if n.report is not None}
            round_.warnings += self.planner.record(server_round, times, self.fleet.names)
        self.rounds.append(round_)
        if not good:
            return None, None
        arrays, warning = aggregate_round(
            self.aggregation, self._sent_arrays, good, self.weighted_by_key, server_round
        )
        if warning:
            log.warning(warning)
            round_.warnings.append(warning)
        ok = round_.reports()
        return arrays, MetricRecord(
            {
                "nodes-ok": len(ok),
                "nodes-failed": len(rows) - len(ok),
                "num-examples": sum(r.num_examples for r in ok),
            }
        )

    def failed_row(self, server_round: int, node_id: int, error: str) -> NodeRow:
        """A failed node's row (``Fleet.failed_row``) with its shared-profiling slices."""
        shared = self.luts.cost.get(node_id, (0.0, 0.0))
        return self.fleet.failed_row(server_round, node_id, error, shared)

    def shared_phase(
        self, grid: Grid, arrays: ArrayRecord, server_round: int, timeout_s: float
    ) -> ArrayRecord:
        """Fleet-shared profiling before ``server_round``'s training
        (``SharedExchange.run_phase``); returns the global arrays."""
        if self.shared is None:
            return arrays
        return self.shared.run_phase(grid, arrays, server_round, timeout_s)
