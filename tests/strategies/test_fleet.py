"""The fleet: the QUERY round and its failures, which node a reply answers for, the round's
sample, and each node's B, r and cap."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, RecordDict

from fl_client.contract import Cap
from fl_client.power import PowerLimit
from strategies.fleet import Fleet
from tests.strategies.test_power_aware import FLEET, TEMPLATE, FakeGrid, _handler

pytestmark = pytest.mark.usefixtures("flower_task_identity")

QUERY = {"model": "cnn", "batch-sizes": list(TEMPLATE.batch_sizes)}


def _fleet(min_nodes: int = 2) -> Fleet:
    return Fleet(QUERY, TEMPLATE.batch_sizes, TEMPLATE.r, min_nodes)


def test_query_round_learns_every_node() -> None:
    grid = FakeGrid([11, 12, 13], _handler())
    fleet = _fleet()
    nodes = fleet.query(grid, timeout_s=5)
    assert set(nodes) == {11, 12, 13} and nodes is fleet.nodes
    assert nodes[13] == FLEET[13] and nodes[13].device == "jetson-agx-orin"
    assert nodes[13].p_max == Cap.NONE and nodes[11].p_max == Cap(5.0)
    assert all(m.metadata.message_type == MessageType.QUERY for m in grid.sent)
    assert dict(grid.sent[0].content.config_records["config"]) == {
        "model": "cnn",
        "batch-sizes": [16, 32, 64, 128],
    }
    assert fleet.query_failures == {}
    assert fleet.names == {11: "nano-a", 12: "nano-b", 13: "orin"}


def test_query_failures_and_malformed_replies_are_kept_with_the_reason() -> None:
    def handle(msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        if node == 12:
            return Message(Error(code=1, reason="no such device"), reply_to=msg)
        config = FLEET[node].to_config()
        if node == 13:
            del config["max-batch-size"]
        return Message(RecordDict({"device": ConfigRecord(config)}), reply_to=msg)

    fleet = _fleet()
    nodes = fleet.query(FakeGrid([11, 12, 13], handle), timeout_s=5)
    assert set(nodes) == {11}
    assert fleet.query_failures[12] == "no such device"
    assert fleet.query_failures[13] == (
        "malformed QUERY reply: max-batch-size: missing from the QUERY reply"
    )


def test_only_nodes_that_joined_later_are_queried_again_and_a_silent_one_once() -> None:
    grid = FakeGrid([11, 12], _handler())
    fleet = _fleet()
    fleet.query(grid, timeout_s=5)
    grid.node_ids += [13, 15]
    grid.handler = lambda m: None if m.metadata.dst_node_id == 15 else _handler()(m)
    fleet.query_new(grid, timeout_s=5)
    assert set(fleet.nodes) == {11, 12, 13}
    assert fleet.query_failures == {15: "no reply to the QUERY (timeout)"}
    sent = len(grid.sent)
    fleet.query_new(grid, timeout_s=5)
    assert len(grid.sent) == sent  # nobody new: no message at all


def test_a_reply_the_superlink_made_is_mapped_to_the_node_it_answers_for() -> None:
    """A "Node Unavailable" reply comes from the SuperLink's own id: the message it answers
    names the node (the Grid fills in message ids as it pushes; faked here)."""
    fleet = _fleet()
    to_12 = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=12)
    to_12.metadata.__dict__["_message_id"] = "m-12"

    def superlink(msg: Message) -> Message:
        reply = Message(Error(code=1, reason="Node Unavailable"), reply_to=msg)
        reply.metadata.__dict__["_src_node_id"] = 1
        return reply

    (reply,) = fleet.send_and_receive(FakeGrid([12], superlink), [to_12], timeout_s=5)
    assert reply.metadata.src_node_id == 1 and reply.metadata.reply_to_message_id == "m-12"
    assert fleet.node_of(reply) == 12
    # a later exchange forgets the earlier one's messages: the reply's own source again
    fleet.send_and_receive(FakeGrid([], superlink), [], timeout_s=5)
    assert fleet.node_of(reply) == 1


def test_replies_are_ordered_by_node_name_then_id() -> None:
    grid = FakeGrid([13, 12, 11, 99], _handler())
    fleet = _fleet()
    fleet.query(FakeGrid([11, 12, 13], _handler()), timeout_s=5)
    messages = [
        Message(
            RecordDict({"arrays": ArrayRecord([np.zeros(3)])}),
            message_type=MessageType.TRAIN,
            dst_node_id=n,
        )
        for n in (13, 99, 11)
    ]
    replies = fleet.send_and_receive(grid, messages, timeout_s=5)
    # 99 never answered the QUERY: no name, first
    assert [fleet.node_of(r) for r in fleet.ordered(replies)] == [99, 11, 13]


def test_the_round_samples_queried_nodes_at_least_min_nodes_in_id_order() -> None:
    grid = FakeGrid([13, 11, 12, 42], _handler())  # 42 never answered the QUERY
    fleet = _fleet()
    fleet.query(FakeGrid([11, 12, 13], _handler()), timeout_s=5)
    assert fleet.sample(grid, 1.0, 2) == [11, 12, 13]
    random.seed(3)
    picked = fleet.sample(grid, 0.1, 2)
    assert len(picked) == 2 and picked == sorted(picked) and set(picked) <= {11, 12, 13}
    assert fleet.sample(grid, 0.1, 5) == [11, 12, 13]  # no more than there are


def test_a_node_that_fits_nothing_gets_the_smallest_batch_size_to_explain() -> None:
    fleet = _fleet(min_nodes=1)
    fleet.nodes = {11: dataclasses.replace(FLEET[11], max_batch_size=0)}
    assert fleet.batch_sizes_of(11) == ([16], [0.4])
    # a node that never answered the QUERY gets all of B
    assert fleet.batch_sizes_of(99) == ([16, 32, 64, 128], [0.4, 0.5, 0.8, 1.0])


def test_r_by_a_luts_rows() -> None:
    fleet = _fleet()
    by_b = dict(zip(fleet.batch_sizes, fleet.r, strict=True))
    b_first, b_last = fleet.batch_sizes[0], fleet.batch_sizes[-1]
    rows = fleet.r_rows([b_last, 3, b_first])
    assert rows[0] == by_b[b_last] and rows[2] == by_b[b_first]
    assert math.isnan(rows[1])  # a b the server has no r for


def test_a_nodes_limit_is_its_cap_that_round_with_its_margin() -> None:
    fleet = _fleet()
    fleet.query(FakeGrid([11, 12, 13], _handler()), timeout_s=5)
    margin = FLEET[12].cap_margin
    # nano-b's schedule steps from 7 W to 4.5 W in round 3
    assert fleet.limit_of(12, 1) == PowerLimit(7.0, margin)
    assert fleet.limit_of(12, 3) == PowerLimit(4.5, margin)
    assert fleet.limit_of(13, 1) == PowerLimit()  # no cap
    assert fleet.limit_of(99, 1) is None


def test_a_failed_row_names_what_the_query_told_and_its_shared_cost() -> None:
    fleet = _fleet()
    fleet.query(FakeGrid([11, 12, 13], _handler()), timeout_s=5)
    row = fleet.failed_row(3, 12, "crashed", shared=(1.5, 4.0))
    assert (row.node_name, row.device, row.p_max, row.ok, row.error) == (
        "nano-b",
        "jetson-nano",
        Cap(4.5),
        False,
        "crashed",
    )
    assert (row.shared_time_s, row.shared_energy_j) == (1.5, 4.0)
    stranger = fleet.failed_row(3, 99, "late")
    assert (stranger.node_name, stranger.device, stranger.p_max) == ("99", "?", Cap.NONE)
    assert (stranger.shared_time_s, stranger.shared_energy_j) == (0.0, 0.0)
