"""The fleet as the server knows it: who answered the QUERY, which node a reply answers for,
each node's B and r, and the nodes left out with the reason."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fl_client.contract import Cap, NodeDescriptor, NodeRow
from fl_client.power import PowerLimit

log = logging.getLogger(__name__)


class Fleet:
    """The nodes of a run, as their QUERY replies describe them.

    The QUERY asks every connected node for its ``NodeDescriptor`` (device, backend, power
    cap and the largest b that fits its memory); a node whose QUERY fails is kept in
    ``query_failures`` with the reason and never asked again. Every exchange goes through
    ``send_and_receive``, so a reply the SuperLink makes itself (a node gone) is still
    mapped to the node it answers for (``node_of``).

    Parameters
    ----------
    query_config : dict
        Keys sent in the QUERY message (``model``, ``batch-sizes``).
    batch_sizes, r : sequences
        The run's B and Eq. 3's r aligned with it; each node gets the part that fits it.
    min_nodes : int
        Nodes the first QUERY waits for (``min-train-nodes``).
    """

    def __init__(
        self,
        query_config: Mapping[str, Any],
        batch_sizes: Sequence[int],
        r: Sequence[float],
        min_nodes: int = 2,
    ) -> None:
        self.query_config = dict(query_config)
        self.batch_sizes = list(batch_sizes)
        self.r = list(r)
        self.min_nodes = min_nodes
        self.nodes: dict[int, NodeDescriptor] = {}  # node_id -> QUERY reply
        self.query_failures: dict[int, str] = {}
        self._sent_to: dict[str, int] = {}  # message id -> node it was sent to

    @property
    def names(self) -> dict[int, str]:
        """Node id → node name, for the nodes that answered the QUERY."""
        return {n: d.node_name for n, d in self.nodes.items()}

    # ----------------------------------------------------------------------------- messages
    def send_and_receive(
        self, grid: Grid, messages: list[Message], timeout_s: float
    ) -> list[Message]:
        """``grid.send_and_receive``, remembering which node each message went to."""
        replies = list(grid.send_and_receive(messages, timeout=timeout_s))
        self._sent_to = {
            m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id
        }
        return replies

    def node_of(self, reply: Message) -> int:
        """The node a reply answers for.

        A reply the SuperLink makes itself (e.g. "Node Unavailable" once a node misses its
        heartbeats) has the SuperLink's id as source: map it back through the message it
        answers, whose id ``send_and_receive`` filled in on the sent message.
        """
        src = reply.metadata.src_node_id
        return self._sent_to.get(reply.metadata.reply_to_message_id, src)

    def ordered(self, replies: Iterable[Message]) -> list[Message]:
        """Replies in the fleet's order (node name, then id), not in arrival order, so the
        floating-point sums of an average run in one order and a run repeats exactly."""

        def key(reply: Message) -> tuple[str, int]:
            node_id = self.node_of(reply)
            desc = self.nodes.get(node_id)
            return ("" if desc is None else desc.node_name, node_id)

        return sorted(replies, key=key)

    # ----------------------------------------------------------------------------- QUERY
    def query(self, grid: Grid, timeout_s: float) -> dict[int, NodeDescriptor]:
        """Ask every connected node for its device descriptor and power cap, after waiting
        up to ``timeout_s`` for ``min_nodes`` (``min-train-nodes``) to connect.

        Flower's ``sample_nodes`` waits for them forever; a fleet that never gets that large
        (a SuperNode down, a typo in its address) must end the run with the reason instead.
        The wait sleeps in short steps, so Ctrl-C ends it at once.
        """
        need, t0 = self.min_nodes, time.monotonic()
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

    def query_new(self, grid: Grid, timeout_s: float) -> dict[int, NodeDescriptor]:
        """QUERY the nodes that connected after the run began (a node that fails its QUERY
        is not asked again), so a node joining later trains, with its kind's LUT."""
        new = [
            n for n in grid.get_node_ids() if n not in self.nodes and n not in self.query_failures
        ]
        return self._query(grid, new, timeout_s) if new else self.nodes

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
                self.nodes[node_id] = NodeDescriptor.from_config(dict(reply.content["device"]))
            except (ValueError, KeyError) as err:
                self.query_failures[node_id] = f"malformed QUERY reply: {err}"
        for node_id in node_ids:  # never asked again: each later round would wait for it
            if node_id not in self.nodes and node_id not in self.query_failures:
                self.query_failures[node_id] = "no reply to the QUERY (timeout)"
        return self.nodes

    def sample(self, grid: Grid, fraction: float, min_nodes: int) -> list[int]:
        """The round's nodes: every connected node that answered the QUERY, or a random
        ``fraction`` of them (at least ``min_nodes``), in id order."""
        available = sorted(n for n in grid.get_node_ids() if n in self.nodes)
        size = min(max(int(len(available) * fraction), min_nodes), len(available))
        return available if size == len(available) else sorted(random.sample(available, size))

    # ----------------------------------------------------------------------------- per node
    def batch_sizes_of(self, node_id: int) -> tuple[list[int], list[float]]:
        """B restricted to what fits the node's memory, with r aligned to it."""
        desc = self.nodes.get(node_id)
        max_b = self.batch_sizes[-1] if desc is None else desc.max_batch_size
        pairs = [(b, r) for b, r in zip(self.batch_sizes, self.r, strict=True) if b <= max_b]
        if not pairs:  # nothing fits: send the smallest and let the node explain
            pairs = [(self.batch_sizes[0], self.r[0])]
        return [b for b, _ in pairs], [r for _, r in pairs]

    def r_rows(self, batch_sizes: Sequence[int]) -> list[float]:
        """r_b for each of ``batch_sizes`` (a LUT's rows); NaN for a b without an r."""
        by_b = dict(zip(self.batch_sizes, self.r, strict=True))
        return [by_b.get(b, math.nan) for b in batch_sizes]

    def limit_of(self, node_id: int, server_round: int) -> PowerLimit | None:
        """The node's cap in ``server_round`` with its ``cap-margin`` (None: not queried)."""
        desc = self.nodes.get(node_id)
        return None if desc is None else desc.cap_at(server_round).with_margin(desc.cap_margin)

    def failed_row(
        self,
        server_round: int,
        node_id: int,
        error: str,
        shared: tuple[float, float] = (0.0, 0.0),
    ) -> NodeRow:
        """A failed node's row, with its name, device and real cap where the QUERY gave them,
        and ``shared``: the (s, J) of its shared-profiling slices this round (measured even
        if its TRAIN failed)."""
        desc = self.nodes.get(node_id)
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
            shared_time_s=shared[0],
            shared_energy_j=shared[1],
        )
