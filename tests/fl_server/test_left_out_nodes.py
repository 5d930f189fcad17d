"""Issue 12 §4: a node whose QUERY fails is named, with its real cap, where the fleet is
known (a simulation), and only by its id where it is not (a SuperLink)."""

from __future__ import annotations

from fl_client.contract import Cap, NodeDescriptor
from fl_client.settings import NodeSettings
from fl_server.server_app import left_out_nodes
from strategies.fleet import Fleet

FLEET = [
    NodeSettings("nano-a", "jetson-nano", "simulated", Cap(5.0)),
    NodeSettings("ghost", "jetson-nano", "replay", Cap(4.5)),
    NodeSettings("orin", "jetson-orin-nano", "jetson", Cap.NONE),
]


def _answered(name: str) -> NodeDescriptor:
    return NodeDescriptor(name, 0, "jetson-nano", "simulated", Cap(5.0), "", (921.6,), 1, "", 64)


def _queried(answered: list[str], failures: dict[int, str]) -> Fleet:
    """The server's fleet after its QUERY: ``answered`` by name, ``failures`` by id."""
    fleet = Fleet({}, [32], [1.0])
    fleet.nodes = {i: _answered(n) for i, n in enumerate(answered)}
    fleet.query_failures = dict(failures)
    return fleet


def test_one_failed_node_is_named_with_its_device_and_real_cap() -> None:
    (node,) = left_out_nodes(_queried(["nano-a", "orin"], {99: "ReplayFormatError: x"}), FLEET)
    assert node == {
        "node": "ghost",
        "node-id": "99",
        "device": "jetson-nano",
        "p-max-w": 4.5,
        "cap-label": "4.5 W",
        "stage": "query",
        "rounds-failed": 0,
        "reason": "ReplayFormatError: x",
    }


def test_several_failed_nodes_are_each_one_of_the_silent_ones() -> None:
    nodes = left_out_nodes(_queried(["nano-a"], {7: "r7", 8: "r8"}), FLEET)
    assert [(n["node"], n["node-id"], n["one-of"], n["reason"]) for n in nodes] == [
        (None, "7", ["ghost", "orin"], "r7"),
        (None, "8", ["ghost", "orin"], "r8"),
    ]
    assert all(n["p-max-w"] is None for n in nodes)  # not known for either


def test_without_a_fleet_a_failed_node_has_its_id_only() -> None:
    (node,) = left_out_nodes(_queried(["nano-a"], {5: "timeout"}), None)
    assert (node["node"], node["node-id"], "one-of" in node) == (None, "5", False)
    assert left_out_nodes(_queried(["nano-a"], {}), FLEET) == []
