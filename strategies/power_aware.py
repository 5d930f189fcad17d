"""PowerAwareFedAvg: FedAvg that sends each node r and its settings, and accounts time/energy."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords, sample_nodes

log = logging.getLogger(__name__)

# Metrics every TRAIN reply carries (DESIGN §5); replies must agree on their keys.
TRAIN_METRIC_KEYS = (
    "num-examples",
    "train-time-s",
    "energy-j",
    "avg-power-w",
    "peak-power-w",
    "p-max-w",
    "batch-size",
    "gpu-freq-mhz",
    "profile-time-s",
    "profile-energy-j",
    "cap-violations",
    "train-loss",
)


@dataclass
class NodeReport:
    """One node's reply in one round (or why it has none)."""

    server_round: int
    node_id: int
    node_name: str
    device: str
    ok: bool
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""


@dataclass
class RoundReport:
    """Fleet-level accounting of one synchronous round."""

    server_round: int
    nodes: list[NodeReport]
    #: Deadline sent to the nodes this round (pacing), None without one.
    deadline_s: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def deadline_misses(self) -> int:
        """Nodes whose local training took longer than the round's deadline."""
        return sum(int(n.metrics.get("deadline-miss", 0.0)) for n in self.ok_nodes)

    @property
    def predicted_energy_saved_j(self) -> float:
        """Sum of the nodes' ``predicted-energy-saved-j`` (pacing against running at f*, as
        their LUTs predict it; see ``fl_client.node._pacing_metrics``)."""
        return sum(n.metrics.get("predicted-energy-saved-j", 0.0) for n in self.ok_nodes)

    @property
    def ok_nodes(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.ok]

    @property
    def round_time_s(self) -> float:
        """Synchronous round: the slowest node's device time (profiling included)."""
        times = [n.metrics["train-time-s"] + n.metrics["profile-time-s"] for n in self.ok_nodes]
        return max(times, default=0.0)

    @property
    def energy_j(self) -> float:
        """Fleet energy of the round: training and profiling, summed over nodes."""
        return sum(n.metrics["energy-j"] + n.metrics["profile-energy-j"] for n in self.ok_nodes)

    @property
    def wait_energy_j(self) -> float:
        """Energy the nodes spend idle while they wait for the slowest one (idle power ×
        waiting time); nodes whose idle power is unknown count 0."""
        total = 0.0
        for n in self.ok_nodes:
            idle_w = n.metrics.get("idle-power-w", math.nan)
            busy_s = n.metrics["train-time-s"] + n.metrics["profile-time-s"]
            if math.isfinite(idle_w):
                total += idle_w * max(self.round_time_s - busy_s, 0.0)
        return total

    @property
    def profile_time_s(self) -> float:
        return sum(n.metrics["profile-time-s"] for n in self.ok_nodes)

    @property
    def train_time_s(self) -> float:
        return sum(n.metrics["train-time-s"] for n in self.ok_nodes)


class PowerAwareFedAvg(FedAvg):
    """FedAvg whose clients choose (batch size, GPU frequency) under their own power caps.

    Before the first round the strategy asks every node (QUERY) for its device, backend,
    power cap and the batch sizes that fit its memory. Each TRAIN message is built per
    node (a fresh RecordDict each) and carries the global arrays, the vector ``r`` aligned
    with that node's ``batch-sizes``, ``lr-ref``, ``b-ref``, ``local-epochs``,
    ``server-round`` and ``method``. Weights are aggregated with FedAvg; time, energy and
    power are kept per node and per round (see ``RoundReport``).

    Parameters
    ----------
    batch_sizes : list[int]
        Candidate batch sizes B (ascending) for which ``r`` was estimated.
    r : list[float]
        Eq. 3's r_b in (0, 1], aligned with ``batch_sizes``.
    method : str
        ``power-aware`` | ``b1`` | ``b2`` | ``oracle`` | ``fixed``; the clients' rule.
    train_config : dict
        Further keys sent in every TRAIN config (``lr-ref``, ``b-ref``, ``local-epochs``...).
    query_config : dict
        Keys sent in the QUERY message (``model``...).
    on_round : callable, optional
        Called with each ``RoundReport`` and the server-side evaluation of the new global
        model (the results writer).
    fraction_train, min_train_nodes : see ``FedAvg``.
    pacing : str
        ``off`` or ``deadline``: from round 2 each node gets a ``deadline-s`` (and its own
        ``time-calibration``, measured / LUT-predicted time of its last round).
    pacing_deadline_s : float
        A fixed deadline in seconds (> 0), or 0: the largest ``fastest-time-s`` (a node's
        local time at its f*) the round's nodes reported last.
    """

    def __init__(
        self,
        *,
        batch_sizes: list[int],
        r: list[float],
        method: str,
        train_config: dict[str, Any],
        query_config: dict[str, Any],
        on_round: Callable[[RoundReport, dict[str, float]], None] | None = None,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        pacing: str = "off",
        pacing_deadline_s: float = 0.0,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=0.0,
            min_train_nodes=min_train_nodes,
            min_available_nodes=min_available_nodes,
        )
        if len(r) != len(batch_sizes):
            raise ValueError(f"r: has {len(r)} values but batch-sizes has {len(batch_sizes)}")
        self.batch_sizes = list(batch_sizes)
        self.r = [float(x) for x in r]
        self.method = method
        self.train_config = dict(train_config)
        self.query_config = dict(query_config)
        self.on_round = on_round
        self.fleet: dict[int, dict[str, Any]] = {}  # node_id -> QUERY reply
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

    # ----------------------------------------------------------------------------- QUERY
    def query_fleet(self, grid: Grid, timeout_s: float) -> dict[int, dict[str, Any]]:
        """Ask every connected node for its device descriptor and power cap."""
        node_ids, _ = sample_nodes(grid, self.min_available_nodes, self.min_available_nodes)
        node_ids = list(grid.get_node_ids())
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
            info = dict(reply.content["device"])
            self.fleet[node_id] = info
        return self.fleet

    def node_batch_sizes(self, node_id: int) -> tuple[list[int], list[float]]:
        """B restricted to what fits the node's memory, with r aligned to it."""
        info = self.fleet.get(node_id, {})
        max_b = int(info.get("max-batch-size", self.batch_sizes[-1]))
        pairs = [(b, r) for b, r in zip(self.batch_sizes, self.r, strict=True) if b <= max_b]
        if not pairs:  # nothing fits: send the smallest and let the node explain
            pairs = [(self.batch_sizes[0], self.r[0])]
        return [b for b, _ in pairs], [r for _, r in pairs]

    # ----------------------------------------------------------------------------- TRAIN
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One TRAIN message per node, each with its own RecordDict."""
        if self.fraction_train == 0.0:
            return []
        available = [n for n in grid.get_node_ids() if n in self.fleet]
        sample_size = max(int(len(available) * self.fraction_train), self.min_train_nodes)
        sample_size = min(sample_size, len(available))
        node_ids = sorted(available)[:sample_size] if sample_size == len(available) else None
        if node_ids is None:
            import random

            node_ids = sorted(random.sample(available, sample_size))
        messages = []
        self._deadline_s = self.deadline_for(node_ids) if server_round > 1 else None
        for node_id in node_ids:
            b_node, r_node = self.node_batch_sizes(node_id)
            pacing: dict[str, float] = {}
            if self._deadline_s is not None:
                pacing["deadline-s"] = self._deadline_s
                pacing["time-calibration"] = self.time_calibration.get(node_id, 1.0)
            node_cfg = ConfigRecord(
                {
                    **dict(config),
                    **self.train_config,
                    "server-round": server_round,
                    "method": self.method,
                    "batch-sizes": b_node,
                    "r": r_node,
                    **pacing,
                }
            )
            content = RecordDict({"arrays": arrays, "config": node_cfg})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg of the arrays; per-node time/energy/power kept in a ``RoundReport``.

        Replies are taken in the fleet's order (node name, then id), not in arrival order, so
        the floating-point sums of FedAvg, and with them a whole run, repeat exactly for the
        same fleet, data and seeds.
        """
        replies = sorted(
            replies,
            key=lambda m: (
                str(self.fleet.get(self._node_of(m), {}).get("node-name", "")),
                self._node_of(m),
            ),
        )
        reports: list[NodeReport] = []
        good: list[RecordDict] = []
        for msg in replies:
            node_id = self._node_of(msg)
            info = self.fleet.get(node_id, {})
            name, device = str(info.get("node-name", node_id)), str(info.get("device", "?"))
            if msg.has_error():
                reports.append(
                    NodeReport(
                        server_round, node_id, name, device, False, error=str(msg.error.reason)
                    )
                )
                continue
            metrics = {k: float(v) for k, v in dict(msg.content["metrics"]).items()}  # type: ignore[arg-type]
            missing = [k for k in TRAIN_METRIC_KEYS if k not in metrics]
            if missing:
                reports.append(
                    NodeReport(
                        server_round,
                        node_id,
                        name,
                        device,
                        False,
                        error=f"reply lacks metrics: {', '.join(missing)}",
                    )
                )
                continue
            reports.append(NodeReport(server_round, node_id, name, device, True, metrics))
            good.append(msg.content)
            self._remember_pacing(node_id, metrics)
        report = RoundReport(server_round, reports, deadline_s=self._deadline_s)
        ok = report.ok_nodes
        if self._deadline_s is not None and ok and report.deadline_misses == len(ok):
            key = "pacing-deadline-s" if self.pacing_deadline_s > 0 else "pacing"
            fastest = min(n.metrics.get("fastest-time-s", math.inf) for n in ok)
            warning = (
                f"{key}: every node missed round {server_round}'s deadline of "
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
        self.rounds.append(report)
        if not good:
            return None, None
        arrays = aggregate_arrayrecords(good, self.weighted_by_key)
        agg = MetricRecord(
            {
                "round-time-s": report.round_time_s,
                "fleet-energy-j": report.energy_j,
                "nodes-ok": len(ok),
                "nodes-failed": len(reports) - len(ok),
                "num-examples": sum(n.metrics["num-examples"] for n in ok),
            }
        )
        return arrays, agg

    def _remember_pacing(self, node_id: int, metrics: dict[str, float]) -> None:
        """Keep what the next round's deadline and the node's calibration come from."""
        fastest = metrics.get("fastest-time-s")
        if fastest is not None and math.isfinite(fastest) and fastest > 0:
            self.fastest_time_s[node_id] = fastest
        predicted = metrics.get("predicted-time-s")
        if predicted is not None and predicted > 0 and metrics["train-time-s"] > 0:
            self.time_calibration[node_id] = metrics["train-time-s"] / predicted

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
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
            replies = self._send_and_receive(grid, messages, timeout_s)
            sent = {m.metadata.dst_node_id for m in messages}
            got = {self._node_of(m) for m in replies}
            new_arrays, _ = self.aggregate_train(server_round, replies)
            for node_id in sorted(sent - got):  # no reply at all within the timeout
                info = self.fleet.get(node_id, {})
                self.rounds[-1].nodes.append(
                    NodeReport(
                        server_round,
                        node_id,
                        str(info.get("node-name", node_id)),
                        str(info.get("device", "?")),
                        False,
                        error="no reply (timeout)",
                    )
                )
            if self.fraction_train >= 1.0:  # every connected node is asked: name the absent
                for node_id in sorted(set(self.fleet) - sent):
                    info = self.fleet[node_id]
                    self.rounds[-1].nodes.append(
                        NodeReport(
                            server_round,
                            node_id,
                            str(info.get("node-name", node_id)),
                            str(info.get("device", "?")),
                            False,
                            error="not connected this round (absent from the SuperLink)",
                        )
                    )
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
