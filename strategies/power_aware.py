"""PowerAwareFedAvg: FedAvg that sends each node r and its settings, and accounts time/energy."""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fl_client.contract import (
    Cap,
    CellsReport,
    NodeDescriptor,
    NodeRow,
    ProfileRequest,
    TrainConfig,
    TrainReport,
)
from fl_client.lut import LUT, KindKey
from strategies.aggregation import aggregate_round, check_aggregation
from strategies.shared_profiling import (
    Cell,
    KindProfile,
    SharedOptions,
    exchanges,
    kinds_of,
)

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    """One synchronous round as the strategy saw it: every node's row (its report, or why it
    has none), the deadline sent (pacing; None without one) and warnings. Accounting (round
    time, fleet energy, waiting) is done once, by the run recorder (``fl_server.results``).
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


@dataclass(frozen=True)
class SharedProfiling:
    """Fleet-shared profiling as the strategy runs it (see ``strategies.shared_profiling``).

    ``library`` gets and keeps one LUT per kind across runs (``fl_server.lut_library``:
    anything with ``get(kind)`` and ``put(lut, source)``); ``input_shape`` is the model's
    sample shape; ``steps_train`` keeps the profiled minibatches' updates.
    """

    library: Any
    input_shape: tuple[int, ...]
    options: SharedOptions = field(default_factory=SharedOptions)
    steps_train: bool = False
    warmup_steps: int = 1
    steps: int = 3


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
    pacing : str
        ``off`` or ``deadline``: from round 2 each node gets a ``deadline-s`` (and its own
        ``time-calibration``, measured / LUT-predicted time of its last round).
    pacing_deadline_s : float
        A fixed deadline in seconds (> 0), or 0: the largest ``fastest-time-s`` (a node's
        local time at its f*) the round's nodes reported last.
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
        pacing: str = "off",
        pacing_deadline_s: float = 0.0,
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
        if pacing not in ("off", "deadline"):
            raise ValueError(f"pacing: unknown value {pacing!r}; allowed: off, deadline")
        if not (pacing_deadline_s >= 0 and math.isfinite(pacing_deadline_s)):
            raise ValueError(f"pacing-deadline-s: must be a number ≥ 0, got {pacing_deadline_s}")
        self.pacing = pacing
        self.pacing_deadline_s = float(pacing_deadline_s)
        self.fastest_time_s: dict[int, float] = {}  # node -> last reported time at f*
        self.time_calibration: dict[int, float] = {}  # node -> measured / predicted time
        self._deadline_s: float | None = None
        self.shared: SharedProfiling | None = None
        self.kind_luts: dict[KindKey, LUT] = {}
        self.kind_of: dict[int, KindKey] = {}
        self.shared_log: list[dict[str, Any]] = []  # per kind: how its LUT was made
        self._shared_cost: dict[int, tuple[float, float]] = {}  # node -> (s, J) this round
        self._shared_round_s = 0.0
        # Aggregation (strategies/aggregation.py): the mode and the arrays the round sent
        self.aggregation = check_aggregation(aggregation)
        self._sent_arrays: ArrayRecord | None = None

    @property
    def batch_sizes(self) -> list[int]:
        return list(self.template.batch_sizes)

    @property
    def r(self) -> list[float]:
        return list(self.template.r)

    def deadline_for(self, node_ids: list[int]) -> float | None:
        """This round's deadline for ``node_ids`` (None: pacing off or nothing reported yet)."""
        if self.pacing != "deadline":
            return None
        if self.pacing_deadline_s > 0:
            return self.pacing_deadline_s
        known = [self.fastest_time_s[n] for n in node_ids if n in self.fastest_time_s]
        return max(known) if known else None

    def _node_of(self, reply: Message) -> int:
        """The node a reply answers for.

        A reply the SuperLink makes itself (e.g. "Node Unavailable" once a node misses its
        heartbeats) has the SuperLink's id as source: map it back through the message it
        answers, whose id ``send_and_receive`` filled in on the sent message.
        """
        src = reply.metadata.src_node_id
        return self._sent_to.get(reply.metadata.reply_to_message_id, src)

    def _send_and_receive(
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
        shared_s, shared_j = self._shared_cost.get(node_id, (0.0, 0.0))
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
        for reply in self._send_and_receive(grid, messages, timeout_s):
            node_id = self._node_of(reply)
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
            kind_lut=self._kind_lut_json(node_id),
        )

    def _kind_lut_json(self, node_id: int) -> str | None:
        kind = self.kind_of.get(node_id)
        lut = None if kind is None else self.kind_luts.get(kind)
        return None if lut is None else lut.to_json()

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
        self._deadline_s = self.deadline_for(node_ids) if server_round > 1 else None
        self._sent_arrays = arrays  # FedNova's base (aggregate_train)
        messages = []
        for node_id in node_ids:
            node_cfg = ConfigRecord(self.node_config(server_round, node_id).to_config())
            content = RecordDict({"arrays": arrays, "config": node_cfg})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)
            )
        return messages

    def _sort_key(self, reply: Message) -> tuple[str, int]:
        node_id = self._node_of(reply)
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
        for msg in sorted(replies, key=self._sort_key):
            node_id = self._node_of(msg)
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
            self._remember_pacing(node_id, report)
        report_ = RoundReport(
            server_round, rows, deadline_s=self._deadline_s, shared_round_s=self._shared_round_s
        )
        self._warn_all_missed(report_)
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

    def _warn_all_missed(self, report: RoundReport) -> None:
        """A deadline every node missed is a setting to fix: say so in the round's record."""
        ok = report.reports()
        if self._deadline_s is None or not ok or not all(r.deadline_miss for r in ok):
            return
        key = "pacing-deadline-s" if self.pacing_deadline_s > 0 else "pacing"
        fastest = min(r.fastest_time_s or math.inf for r in ok)
        warning = (
            f"{key}: every node missed round {report.server_round}'s deadline of "
            f"{self._deadline_s:.1f} s (the fastest node needs {fastest:.1f} s at f*); "
            "they ran at f*"
            + (
                "; raise pacing-deadline-s or set it to 0 (from the slowest node)"
                if self.pacing_deadline_s > 0
                else ""
            )
        )
        log.warning(warning)
        report.warnings.append(warning)

    def _remember_pacing(self, node_id: int, report: TrainReport) -> None:
        """Keep what the next round's deadline and the node's calibration come from."""
        fastest = report.fastest_time_s
        if fastest is not None and math.isfinite(fastest) and fastest > 0:
            self.fastest_time_s[node_id] = fastest
        predicted = report.predicted_time_s
        if predicted is not None and predicted > 0 and report.train_time_s > 0:
            self.time_calibration[node_id] = report.train_time_s / predicted

    # ----------------------------------------------------------------------------- shared
    def shared_phase(
        self, grid: Grid, arrays: ArrayRecord, server_round: int, timeout_s: float
    ) -> ArrayRecord:
        """Fleet-shared profiling before ``server_round``'s training, for every kind of the
        fleet that has no LUT yet (none in the library either): the seed exchange, then the
        confirm exchanges (``shared_profiling.exchanges``); returns the global arrays (moved
        by the profiled steps when they train)."""
        self._shared_cost, self._shared_round_s = {}, 0.0
        if self.shared is None or self.template.method not in ("power-aware", "oracle"):
            return arrays
        kinds = kinds_of(
            self.fleet,
            {n: self.node_batch_sizes(n)[0] for n in self.fleet},
            self.template.model,
            self.shared.input_shape,
        )
        self.kind_of = {n: k for k, prof in kinds.items() for n in prof.nodes}
        todo = {k: p for k, p in kinds.items() if k not in self.kind_luts}
        for kind in list(todo):
            known = self.shared.library.get(kind)
            if known is not None:
                self.kind_luts[kind] = known
                self.shared_log.append({"kind": kind.label, "source": "library"})
                del todo[kind]
        if not todo:
            return arrays
        r_of = {k: self._r_for(k) for k in todo}
        for requests in exchanges(todo, r_of, self.shared.options):
            arrays = self._exchange(grid, arrays, server_round, requests, todo, timeout_s)
        self._store_kinds(todo)
        return arrays

    def _r_for(self, kind: KindKey) -> list[float]:
        r_by_b = dict(zip(self.batch_sizes, self.r, strict=True))
        return [r_by_b[b] for b in kind.batch_sizes]

    def _exchange(
        self,
        grid: Grid,
        arrays: ArrayRecord,
        server_round: int,
        requests: dict[int, list[Cell]],
        kinds: dict[KindKey, KindProfile],
        timeout_s: float,
    ) -> ArrayRecord:
        """One synchronous profiling exchange: send each node its cells, merge the replies
        into their kinds, account the slowest node's time, FedAvg the trained arrays."""
        if not requests:
            return arrays
        assert self.shared is not None
        messages = []
        for node_id, cells in sorted(requests.items()):
            req = ProfileRequest(
                server_round=server_round,
                model=self.template.model,
                batch_sizes=self.kind_of[node_id].batch_sizes,
                cells_b=tuple(b for b, _ in cells),
                cells_freq_mhz=tuple(f for _, f in cells),
                lr_ref=self.template.lr_ref,
                b_ref=self.template.b_ref,
                steps_train=self.shared.steps_train,
                warmup_steps=self.shared.warmup_steps,
                steps=self.shared.steps,
            )
            content = RecordDict({"arrays": arrays, "config": ConfigRecord(req.to_config())})
            messages.append(
                Message(content=content, message_type="train.profile", dst_node_id=node_id)
            )
        slowest_s, trained = 0.0, []
        replies = self._send_and_receive(grid, messages, timeout_s)
        # by node name, as in aggregate_train: FedAvg's float sums then run in one order, so
        # a run's weights do not depend on which reply came first
        for reply in sorted(replies, key=self._sort_key):
            node_id = self._node_of(reply)
            if reply.has_error():
                log.warning(
                    "shared profiling: node %s failed its slice: %s", node_id, reply.error.reason
                )
                continue
            report = CellsReport.from_metrics(dict(reply.content["metrics"]))
            kinds[self.kind_of[node_id]].add(report)
            t, e = self._shared_cost.get(node_id, (0.0, 0.0))
            self._shared_cost[node_id] = (t + report.profile_time_s, e + report.profile_energy_j)
            slowest_s = max(slowest_s, report.profile_time_s)
            if report.num_examples > 0:
                trained.append(reply.content)
        self._shared_round_s += slowest_s
        if not trained:
            return arrays
        return aggregate_arrayrecords(trained, self.weighted_by_key)

    def _store_kinds(self, kinds: dict[KindKey, KindProfile]) -> None:
        """Each kind's merged LUT: kept for the run and in the library."""
        assert self.shared is not None
        for kind, prof in kinds.items():
            cost = [self._shared_cost.get(n, (0.0, 0.0)) for n in prof.nodes]
            lut = prof.lut(sum(c[0] for c in cost), sum(c[1] for c in cost))
            entry: dict[str, Any] = {"kind": kind.label, "nodes": len(prof.nodes)}
            if lut is None:
                entry["source"] = "none: no cell measured; its nodes profile their own"
            else:
                self.kind_luts[kind] = lut
                self.shared.library.put(lut, "fleet-shared")
                entry.update(source="fleet-shared", cells=lut.cells_profiled)
            self.shared_log.append(entry)

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
            replies = self._send_and_receive(grid, messages, timeout_s)
            sent = {m.metadata.dst_node_id for m in messages}
            got = {self._node_of(m) for m in replies}
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
