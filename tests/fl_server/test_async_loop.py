"""The ``fedbuff`` run through Flower's messages on a fake fleet (no engine): fixed device
times per node, replies delivered in any host order; versions, records and determinism."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from rich.console import Console

from fl_client.contract import SettingsError
from fl_client.lut import KindKey
from fl_server.async_loop import AsyncRun, WallClock, run_fedbuff
from fl_server.async_records import AsyncRecorder
from fl_server.target import Target
from strategies.fedbuff import UpdateBudget, VirtualClock
from strategies.shared_exchange import Waited
from tests.strategies.test_power_aware import FLEET, FakeGrid, _strategy, report

pytestmark = pytest.mark.usefixtures("flower_task_identity")

REPO = Path(__file__).resolve().parents[2]
#: Device time of every work per node (s); the first work profiles 0.5 s more
TIMES = {11: 3.0, 12: 1.0, 13: 2.0}


def _handler(fail: Iterable[int] = ()) -> Callable[[Message], Message | None]:
    """Nodes that add their id / 100 to every array and report ``TIMES``."""

    def handle(msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type == MessageType.QUERY:
            device = ConfigRecord(FLEET[node].to_config())
            return Message(RecordDict({"device": device}), reply_to=msg)
        if node in fail:
            return Message(Error(code=1, reason=f"node {node} crashed"), reply_to=msg)
        work = msg.content.config_records["config"]["server-round"]
        x = msg.content.array_records["arrays"]["x"].numpy()
        profile_s = 0.5 if work == 1 else 0.0  # the node's first work profiles
        metrics = report(
            node, train_time_s=TIMES[node], profile_time_s=profile_s, profile_energy_j=profile_s
        ).to_metrics()
        arrays = ArrayRecord({"x": ArrayRecord([x + node / 100.0])["0"]})
        content = RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))})
        return Message(content, reply_to=msg)

    return handle


class ReversedGrid(FakeGrid):
    """Delivers each batch of replies in reverse: a host whose wall order differs."""

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        return list(reversed(super().send_and_receive(messages, timeout=timeout)))


class PushGrid(FakeGrid):
    """Replies through ``push_messages`` and ``pull_messages`` in a wall order of its own:
    node n's reply is in ``wall[n]`` pulls after its message was pushed, a ``silent`` node's
    never (a ``fail`` node's is an error). One pull is one second of its wall clock
    (``now``); ``log`` holds every push and reply as (event, node, pull)."""

    def __init__(
        self, wall: dict[int, int], silent: Iterable[int] = (), fail: Iterable[int] = ()
    ) -> None:
        super().__init__(sorted(FLEET), _handler(fail))
        self.wall, self.silent, self.tick = wall, set(silent), 0
        self.due: dict[str, tuple[int, int, Message]] = {}  # id -> (pull, node, reply)
        self.log: list[tuple[str, int, int]] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = f"m{len(self.sent) + 1}"
            msg.metadata.__dict__["_message_id"] = msg_id  # as Flower's grids do
            node = msg.metadata.dst_node_id
            self.sent.append(msg)
            self.log.append(("push", node, self.tick))
            reply = self.handler(msg)
            if node not in self.silent and reply is not None:
                self.due[msg_id] = (self.tick + self.wall[node], node, reply)
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.tick += 1
        out = []
        for msg_id in message_ids:
            if msg_id in self.due and self.due[msg_id][0] <= self.tick:
                _, node, reply = self.due.pop(msg_id)
                self.log.append(("reply", node, self.tick))
                out.append(reply)
        return out

    def now(self) -> float:
        return float(self.tick)


def _run(
    run_dir: Path,
    grid: FakeGrid | None = None,
    buffer_size: int = 2,
    versions: int = 5,
    target: float = 2.0,
    fail: Iterable[int] = (),
    window: int = 1,
    kinds: dict[int, tuple[str, float, float]] | None = None,
    profiled: dict[int, float] | None = None,
    buffer_step: str = "mean",
    waiting: dict[int, tuple[float, float]] | None = None,
    each_node: int | None = None,
) -> dict[str, Any]:
    """A run on ``grid`` (default: every node answers at once): ordered by ``arrival`` on a
    ``PushGrid`` (its wall clock, no sleeping), else by ``virtual``. ``kinds``: node ->
    (its kind, when the kind's LUT is merged, the node's own slices' time), as a fleet-shared
    profiling step would leave them; ``profiled``: node -> the value its profiled steps
    left in every array (with 5 examples); ``waiting``: node -> (from when, for how long:
    s, and as many J) it trained while it waited for its kind's LUT. The budget:
    ``versions`` global versions (``update-budget = "fleet"``), or with ``each_node``, that
    many trained updates of every node still in the run (``"each-node"``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    grid = grid or FakeGrid(sorted(FLEET), _handler(fail))
    strategy = _strategy()
    strategy.fleet.query(grid, timeout_s=5)
    for node, (kind, kind_s, own_s) in (kinds or {}).items():
        key = KindKey(kind, "sim", "cnn", (3, 32, 32), (16,), (1.0,))
        strategy.luts.kind_of[node] = key
        strategy.luts.kind_s[key] = kind_s
        strategy.luts.cost[node] = (own_s, own_s)
        strategy.luts.round_s = max(strategy.luts.round_s, kind_s)
    for node, value in (profiled or {}).items():
        strategy.luts.trained[node] = (
            ArrayRecord({"x": ArrayRecord([np.full(2, value)])["0"]}),
            5.0,
        )
    for node, (start_s, wait_s) in (waiting or {}).items():
        strategy.luts.waiting_train[node] = Waited(start_s, wait_s, wait_s, (16, 1.0), 1)
    rec = AsyncRecorder(
        run_dir,
        method="power-aware",
        target=Target(target, window),
        console=Console(file=io.StringIO()),
    )
    push = isinstance(grid, PushGrid)
    clock = VirtualClock(
        buffer_size, "inverse-sqrt", "arrival" if push else "virtual", buffer_step=buffer_step
    )
    seen: list[int] = []

    def evaluate(version: int, arrays: ArrayRecord) -> dict[str, float]:
        seen.append(version)
        x = float(arrays["x"].numpy().mean())
        metrics = {"accuracy": x, "loss": 1.0 - x}
        if version == 0:  # as the server's evaluation does
            rec.initial_eval(metrics)
        return metrics

    initial = ArrayRecord({"x": ArrayRecord([np.zeros(2)])["0"]})
    run = AsyncRun(strategy, grid, clock, rec, 5.0)
    if isinstance(grid, PushGrid):
        run.wall = WallClock(now=grid.now, sleep=lambda _: None)
    budget = (
        UpdateBudget("fleet", 0, versions)
        if each_node is None
        else UpdateBudget("each-node", each_node, 0)
    )
    final = run_fedbuff(run, initial, budget, evaluate)
    summ = rec.finish()
    return {"summary": summ, "final": final["x"].numpy(), "seen": seen, "rec": rec}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_versions_increase_and_every_record_is_written(tmp_path: Path) -> None:
    out = _run(tmp_path, versions=4)
    assert out["seen"] == [0, 1, 2, 3, 4]  # the initial model and each version evaluated
    rounds = _lines(tmp_path / "rounds.jsonl")
    assert [r["server-round"] for r in rounds] == [1, 2, 3, 4]
    times = [r["sim-time-s"] for r in rounds]
    assert times == sorted(times) and times[0] > 0
    updates = _lines(tmp_path / "updates.jsonl")
    applied = [u for u in updates if u["version"] is not None]
    assert len(applied) == 4 * 2  # K = 2 per version
    for u in updates:
        assert u["end-s"] == pytest.approx(u["start-s"] + u["device-time-s"])
        if u["version"] is not None:
            assert u["staleness"] == u["version"] - 1 - u["base-version"] >= 0
    summ = out["summary"]
    assert summ["versions"] == 4 and summ["aggregation"] == "fedbuff"
    assert summ["sim-time-s"] == pytest.approx(times[-1])
    # every node always has work: no idle time at all in [0, the last version]
    assert summ["idle-share"] == pytest.approx(0.0)
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "nodes.jsonl").is_file()


def test_the_first_updates_follow_device_time(tmp_path: Path) -> None:
    _run(tmp_path, versions=2)
    updates = _lines(tmp_path / "updates.jsonl")
    # node 12 (1 s + 0.5 s profiling) ends at 1.5 and 2.5; node 13 at 2.5 (tie: 12 first)
    assert [(u["node-id"], u["end-s"]) for u in updates[:2]] == [("12", 1.5), ("12", 2.5)]
    assert updates[0]["version"] == updates[1]["version"] == 1


#: Fleet-shared profiling of two kinds: the Nanos' LUT merged at 0.4 s, the Orin's at 6 s
KINDS = {11: ("nano", 0.4, 0.3), 12: ("nano", 0.4, 0.4), 13: ("orin", 6.0, 6.0)}


def test_each_kind_starts_when_its_own_lut_is_merged_from_the_newest_version(
    tmp_path: Path,
) -> None:
    out = _run(tmp_path / "kinds", versions=8, kinds=KINDS)
    updates = _lines(tmp_path / "kinds" / "updates.jsonl")
    first = {u["node-id"]: u for u in reversed(updates)}  # each node's first work
    # the Nanos do not wait for the Orin's 6 s of profiling
    assert first["11"]["start-s"] == first["12"]["start-s"] == 0.4
    assert first["13"]["start-s"] == 6.0
    # by 6 s the Nanos made versions: the Orin starts from the newest one, not version 0
    made_by_6 = max(u["version"] for u in updates if u["version"] is not None and u["end-s"] <= 6.0)
    assert made_by_6 >= 1 and first["13"]["base-version"] == made_by_6
    # against one fleet-wide barrier (every node starts at 6 s): less idle, versions sooner
    barrier = {n: (kind, 6.0, own_s) for n, (kind, _, own_s) in KINDS.items()}
    slow = _run(tmp_path / "barrier", versions=8, kinds=barrier)
    assert out["summary"]["idle-share"] < slow["summary"]["idle-share"]
    assert out["summary"]["sim-time-s"] < slow["summary"]["sim-time-s"]


def test_profiled_steps_are_each_nodes_own_update_buffered_when_its_slices_end(
    tmp_path: Path,
) -> None:
    profiled = {11: 0.3, 12: 0.5, 13: 0.9}
    out = _run(tmp_path, versions=3, kinds=KINDS, profiled=profiled, buffer_step="fleet")
    updates = _lines(tmp_path / "updates.jsonl")
    shared = [u for u in updates if u["work"] == 0]
    assert {u["node-id"]: (u["start-s"], u["end-s"], u["choice"]) for u in shared} == {
        "11": (0.0, 0.3, "profiling"),
        "12": (0.0, 0.4, "profiling"),
        "13": (0.0, 6.0, "profiling"),
    }
    # the Nanos' profiled updates (0.3 s, 0.4 s) fill the first buffer (K = 2): version 1 is
    # their mean (equal weights), moved by their share of the fleet's profiled samples
    # (10 of 15), at 0.4 s
    assert [u["node-id"] for u in updates[:2]] == ["11", "12"]
    assert updates[0]["version"] == updates[1]["version"] == 1
    assert updates[0]["step-scale"] == pytest.approx(10 / 15)
    rounds = _lines(tmp_path / "rounds.jsonl")
    assert rounds[0]["sim-time-s"] == pytest.approx(0.4)
    assert rounds[0]["accuracy"] == pytest.approx(0.4 * 10 / 15)  # the evaluation: mean of x
    # the profiled updates come on top of the budget: 3 versions + ceil(3 / 2)
    assert out["summary"]["versions"] == 5
    # the Nanos then start from version 1, the newest at 0.4 s
    first = {u["node-id"]: u for u in reversed(updates) if u["work"] == 1}
    assert first["11"]["base-version"] == first["12"]["base-version"] == 1


def test_a_node_that_trained_while_it_waited_has_it_in_its_profiled_update(
    tmp_path: Path,
) -> None:
    profiled = {11: 0.3, 12: 0.5, 13: 0.9}
    # node 11's slices end at 0.3 s, its kind's LUT at 0.4 s: it trained 0.1 s in the gap;
    # node 12, its kind's slowest, had no gap; node 13 trained 0.2 s from 6.1 s (it waited
    # for its kind's first exchange), which takes it past its kind's LUT
    waiting = {11: (0.3, 0.1), 13: (6.1, 0.2)}
    args: dict[str, Any] = {"versions": 8, "kinds": KINDS, "buffer_step": "fleet"}
    out = _run(tmp_path / "w", profiled=profiled, waiting=waiting, **args)
    base = _run(tmp_path / "b", profiled=profiled, **args)
    updates = _lines(tmp_path / "w" / "updates.jsonl")
    shared = {u["node-id"]: u for u in updates if u["work"] == 0}
    approx = pytest.approx
    assert {
        n: (u["end-s"], u["device-time-s"], u["profile-time-s"]) for n, u in shared.items()
    } == {
        "11": (approx(0.4), approx(0.4), 0.3),
        "12": (0.4, 0.4, 0.4),
        "13": (approx(6.3), approx(6.2), 6.0),
    }
    first = {u["node-id"]: u for u in reversed(updates) if u["work"] == 1}
    assert first["11"]["start-s"] == first["12"]["start-s"] == 0.4
    assert first["13"]["start-s"] == approx(6.3)  # when its own steps end, past its kind's LUT
    # the gap is training, not idle: its time and energy move from idle to the node's totals
    assert out["summary"]["idle-share"] < base["summary"]["idle-share"]
    name = FLEET[11].node_name
    for run, trained_s in ((out, 0.1), (base, 0.0)):
        rec = run["rec"]
        gap = rec.clock.account(0.3, 0.4)[11]  # its steps there: 0.1 s, 0.1 J
        assert (gap.busy_j - gap.profile_j, gap.idle_s) == approx((trained_s, 0.1 - trained_s))
        whole, node = rec.clock.account(0.0, rec.version_s[-1])[11], run["summary"]["nodes"][name]
        assert node["train-energy-j"] == approx(whole.busy_j - whole.profile_j)
        assert node["profile-energy-j"] == approx(whole.profile_j)
        assert node["wait-s"] == approx(whole.idle_s)
    # node 13's 0.1 s between its slices and its steps is idle, not busy
    clock = out["rec"].clock
    assert clock.account(6.0, 6.1)[13].idle_s == approx(0.1)
    assert clock.account(6.1, 6.3)[13].busy_s == approx(0.2)


def test_on_the_wall_clock_every_node_starts_when_the_profiling_exchange_ends(
    tmp_path: Path,
) -> None:
    _run(tmp_path, grid=PushGrid({11: 1, 12: 1, 13: 1}), versions=2, kinds=KINDS)
    updates = _lines(tmp_path / "updates.jsonl")
    first = {u["node-id"]: u for u in reversed(updates)}
    assert {n: u["start-s"] for n, u in first.items()} == {"11": 6.0, "12": 6.0, "13": 6.0}


def test_two_runs_give_the_same_records_whatever_order_the_host_delivers(
    tmp_path: Path,
) -> None:
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", grid=ReversedGrid(sorted(FLEET), _handler()))
    for name in ("updates.jsonl", "rounds.jsonl", "nodes.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    np.testing.assert_array_equal(a["final"], b["final"])


def test_the_global_model_moves_by_the_weighted_mean_of_the_deltas(tmp_path: Path) -> None:
    out = _run(tmp_path, versions=1)
    # version 1: node 12's two updates from version 0 (deltas 0.12 each, weight equal)
    np.testing.assert_allclose(out["final"], [0.12, 0.12])


def test_the_run_stops_at_the_target_version(tmp_path: Path) -> None:
    out = _run(tmp_path, versions=50, target=0.3)
    summ = out["summary"]
    assert summ["versions"] < 50
    assert summ["round-to-target"] == summ["versions"]
    assert summ["final-accuracy"] >= 0.3
    rounds = _lines(tmp_path / "rounds.jsonl")
    assert summ["sim-time-to-target-s"] == pytest.approx(rounds[-1]["sim-time-s"])
    assert summ["fleet-energy-to-target-j"] > 0


def test_the_target_window_is_the_runs_rule_over_versions(tmp_path: Path) -> None:
    first = _run(tmp_path / "one", versions=50, target=0.3)["summary"]
    out = _run(tmp_path / "three", versions=50, target=0.3, window=3)
    summ = out["summary"]
    rounds = _lines(tmp_path / "three" / "rounds.jsonl")
    accuracies = [r["accuracy"] for r in rounds]
    v = summ["round-to-target"]
    assert sum(accuracies[v - 3 : v]) / 3 >= 0.3 > sum(accuracies[v - 4 : v - 1]) / 3
    assert summ["versions"] == v and v > first["round-to-target"]
    assert summ["first-round-at-target"] == first["round-to-target"]


def test_a_failed_node_is_dropped_and_the_run_goes_on(tmp_path: Path) -> None:
    out = _run(tmp_path, versions=3, fail=[11])
    assert out["summary"]["versions"] == 3
    updates = _lines(tmp_path / "updates.jsonl")
    assert {u["node-id"] for u in updates} == {"12", "13"}
    nodes = _lines(tmp_path / "nodes.jsonl")
    failed = [n for n in nodes if not n["ok"]]
    assert [n["node-name"] for n in failed] == ["nano-a"] and "crashed" in failed[0]["error"]


def test_a_buffer_larger_than_the_fleet_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"buffer-size: 4, but 3 nodes"):
        _run(tmp_path, buffer_size=4)


# --------------------------------------------------- arrival: a deployment's wall clock


def test_arrival_takes_updates_in_wall_order_not_device_time(tmp_path: Path) -> None:
    # device times: 12 fastest, then 13, then 11; wall delays the reverse: 11, 13, 12
    grid = PushGrid({11: 1, 12: 3, 13: 2})
    _run(tmp_path, grid=grid, buffer_size=3, versions=2)
    updates = _lines(tmp_path / "updates.jsonl")
    replies = [n for event, n, _ in grid.log if event == "reply"]
    assert [int(u["node-id"]) for u in updates] == replies[: len(updates)]
    # the slowest device replied first on the wall clock, and is taken first
    assert [u["node-id"] for u in updates[:2]] == ["11", "13"]
    walls = [u["arrival-wall-s"] for u in updates]
    assert walls == sorted(walls) and walls[0] == 1.0
    for u in updates:  # virtual times stay each node's device time
        assert u["end-s"] == pytest.approx(u["start-s"] + u["device-time-s"])


def test_virtual_ordering_records_no_wall_time(tmp_path: Path) -> None:
    _run(tmp_path, versions=1)
    assert all(u["arrival-wall-s"] is None for u in _lines(tmp_path / "updates.jsonl"))


def test_arrival_sends_a_fast_node_new_work_without_waiting_for_a_slow_one(
    tmp_path: Path,
) -> None:
    grid = PushGrid({11: 4, 12: 1, 13: 2})
    _run(tmp_path, grid=grid, buffer_size=2, versions=3)
    first_11 = next(t for event, n, t in grid.log if event == "reply" and n == 11)
    pushes_12 = [t for event, n, t in grid.log if event == "push" and n == 12]
    assert len([t for t in pushes_12 if t < first_11]) >= 3  # node 12 kept busy meanwhile
    updates = _lines(tmp_path / "updates.jsonl")
    applied = [u for u in updates if u["version"] is not None]
    for u in applied:  # staleness is the version gap
        assert u["staleness"] == u["version"] - 1 - u["base-version"]
    slow = [u for u in applied if u["node-id"] == "11"]
    assert slow and slow[0]["staleness"] > 0  # the slow node's update is stale


def test_arrival_drops_a_node_that_never_replies_and_goes_on(tmp_path: Path) -> None:
    grid = PushGrid({11: 1, 12: 1, 13: 2}, silent=[11])
    out = _run(tmp_path, grid=grid, buffer_size=2, versions=6)
    assert out["summary"]["versions"] == 6
    updates = _lines(tmp_path / "updates.jsonl")
    assert {u["node-id"] for u in updates} == {"12", "13"}
    failed = [n for n in _lines(tmp_path / "nodes.jsonl") if not n["ok"]]
    assert [n["node-name"] for n in failed] == ["nano-a"]
    assert "no reply (timeout)" in failed[0]["error"]
    pushes_11 = [t for event, n, t in grid.log if event == "push" and n == 11]
    assert pushes_11 == [0]  # a dropped node gets no more work
    # the timeout (5 s, one pull a second) passed before the run ended
    assert grid.tick >= 5


def test_arrival_drops_a_node_whose_reply_is_an_error_while_others_train(
    tmp_path: Path,
) -> None:
    # node 11's error is the only reply at the first pull: the run waits for the others
    grid = PushGrid({11: 1, 12: 2, 13: 3}, fail=[11])
    out = _run(tmp_path, grid=grid, buffer_size=2, versions=3)
    assert out["summary"]["versions"] == 3
    assert {u["node-id"] for u in _lines(tmp_path / "updates.jsonl")} == {"12", "13"}
    failed = [n for n in _lines(tmp_path / "nodes.jsonl") if not n["ok"]]
    assert [n["node-name"] for n in failed] == ["nano-a"] and "crashed" in failed[0]["error"]


@pytest.mark.parametrize(
    ("wall", "silent", "versions"),
    [
        ({11: 1, 12: 1, 13: 1}, [], 4),  # a reply arrives with the last, never taken
        ({11: 4, 12: 1, 13: 2}, [], 3),  # a slow node's work still in flight
        ({11: 1, 12: 1, 13: 2}, [11], 2),  # a silent node, stopped before its timeout
    ],
)
def test_arrival_records_every_work_it_sent_when_the_run_stops(
    tmp_path: Path, wall: dict[int, int], silent: list[int], versions: int
) -> None:
    """Nothing is lost at the stop: each work pushed is an update in ``updates.jsonl``
    (applied, or arrived and never applied: version null) or named as still in flight."""
    grid = PushGrid(wall, silent=silent)
    out = _run(tmp_path, grid=grid, buffer_size=2, versions=versions)
    summ = out["summary"]
    names = {n: FLEET[n].node_name for n in FLEET}
    updates = _lines(tmp_path / "updates.jsonl")
    in_flight = summ["works-in-flight-at-end"]
    for node, name in names.items():
        pushed = [t for event, n, t in grid.log if event == "push" and n == node]
        replied = [t for event, n, t in grid.log if event == "reply" and n == node]
        mine = [u["work"] for u in updates if u["node"] == name]
        flying = [w["work"] for w in in_flight if w["node"] == name]
        assert len(mine) == len(replied), name  # every reply that arrived is recorded
        assert sorted(mine + flying) == list(range(1, len(pushed) + 1)), name
    applied = [u for u in updates if u["version"] is not None]
    assert summ["updates-applied"] == len(applied) == 2 * versions
    assert summ["updates-buffered-at-end"] == len(updates) - len(applied)


def test_arrival_names_a_silent_nodes_work_when_the_run_stops_before_its_timeout(
    tmp_path: Path,
) -> None:
    grid = PushGrid({11: 1, 12: 1, 13: 2}, silent=[11])
    out = _run(tmp_path, grid=grid, buffer_size=2, versions=2)
    assert grid.tick < 5  # the run stopped before the 5 s timeout dropped node 11
    flying = out["summary"]["works-in-flight-at-end"]
    assert {"node": "nano-a", "work": 1, "base-version": 0} in flying
    assert all(n["ok"] for n in _lines(tmp_path / "nodes.jsonl"))  # not known as failed


def test_arrival_counts_no_idle_time_while_a_slow_node_trains(tmp_path: Path) -> None:
    # node 11 trains through versions made by the others: it is busy, not idle
    out = _run(tmp_path, grid=PushGrid({11: 4, 12: 1, 13: 2}), buffer_size=2, versions=3)
    assert out["summary"]["idle-share"] == pytest.approx(0.0)
    assert out["summary"]["fleet-idle-energy-j"] == pytest.approx(0.0)


def test_virtual_ordering_leaves_no_work_in_flight_at_the_stop(tmp_path: Path) -> None:
    out = _run(tmp_path, versions=3)
    assert out["summary"]["works-in-flight-at-end"] == []


class RefusingGrid(PushGrid):
    """A ``PushGrid`` whose SuperLink does not take node 13's messages (id None, as
    Flower's grids answer for a message they could not push)."""

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(super().push_messages(messages))
        refused = [m.metadata.dst_node_id == 13 for m in messages]
        return [None if r else i for i, r in zip(ids, refused, strict=True)]  # type: ignore[misc]


def test_arrival_drops_a_node_whose_message_the_superlink_did_not_take(tmp_path: Path) -> None:
    out = _run(tmp_path, grid=RefusingGrid({11: 2, 12: 1, 13: 1}), buffer_size=2, versions=2)
    assert out["summary"]["versions"] == 2
    assert {u["node-id"] for u in _lines(tmp_path / "updates.jsonl")} == {"11", "12"}
    failed = [n for n in _lines(tmp_path / "nodes.jsonl") if not n["ok"]]
    assert [n["error"] for n in failed] == ["not taken by the SuperLink"]


# ------------------------------------------------------------- end to end, Flower's engine

E2E_FLEET = """
[[node]]
name = "nano-4.5w"
device = "jetson-nano"
p-max-w = 4.5

[[node]]
name = "tx2nx-7w"
device = "jetson-tx2-nx"
p-max-w = 7.0

[[node]]
name = "orin-free"
device = "jetson-orin-nano"
p-max-w = "none"
"""


@pytest.mark.slow
def test_powerfl_simulate_runs_fedbuff_end_to_end(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(E2E_FLEET)
    out = tmp_path / "runs"
    cmd = [
        *(sys.executable, "-m", "simulations", "simulate", "--methods", "power-aware"),
        *("--fleet", str(fleet), "--rounds", "2", "--output-dir", str(out)),
        *("-c", f"cache-dir={json.dumps(str(tmp_path / 'cache'))}", "-c", "target-accuracy=0.99"),
        *("-c", "aggregation='fedbuff'", "-c", "buffer-size=2", "-c", "update-budget='fleet'"),
    ]  # 2 rounds' updates of 3 nodes, 2 per version: 3 versions, and 2 more for the
    # nodes' 3 profiled updates (fleet-shared profiling trains by default)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = _lines(run_dir / "rounds.jsonl")
    updates = _lines(run_dir / "updates.jsonl")
    assert [r["server-round"] for r in rounds] == [1, 2, 3, 4, 5]
    times = [r["sim-time-s"] for r in rounds]
    assert times == sorted(times) and times[0] > 0
    applied = [u for u in updates if u["version"] is not None]
    assert len(applied) == 5 * 2
    profiled = [u for u in updates if u["work"] == 0]
    # the Nano's slices end after the last version: its profiled update is never taken
    assert {u["node"] for u in profiled} == {"orin-free", "tx2nx-7w"}
    assert all(u["choice"] == "profiling" for u in profiled)
    assert all(u["start-s"] == 0.0 and u["base-version"] == 0 for u in profiled)
    assert all(u["end-s"] > u["start-s"] for u in updates)
    assert summary["aggregation"] == "fedbuff" and summary["versions"] == 5
    assert 0.0 <= summary["idle-share"] < 1.0
    assert "fedbuff: 5 versions from 10 updates" in proc.stdout


def _trained(updates: list[dict[str, Any]]) -> dict[str, int]:
    """Each node's trained updates applied (profiled ones left out)."""
    out: dict[str, int] = {}
    for u in updates:
        if u["version"] is not None and u["choice"] != "profiling":
            out[u["node"]] = out.get(u["node"], 0) + 1
    return out


def test_the_fleet_budget_lets_fast_nodes_spend_it_and_each_node_waits_for_the_slowest(
    tmp_path: Path,
) -> None:
    """Node 12 trains 3× as fast as node 11 (``TIMES``). The fleet's budget (2 rounds of 3
    nodes: 6 updates, 3 versions of 2) ends before the slow node has sent 2; ``each-node``
    goes on until every node has had 2 applied, and stops at the first version where they
    have, so its device time covers two of the slowest node's works."""
    fleet = _run(tmp_path / "fleet", versions=3, target=99.0)
    by_fleet = _trained(_lines(tmp_path / "fleet" / "updates.jsonl"))
    assert sum(by_fleet.values()) == 6 and min(by_fleet.values()) < 2
    each = _run(tmp_path / "each", each_node=2, target=99.0)
    updates = _lines(tmp_path / "each" / "updates.jsonl")
    by_node = _trained(updates)
    assert set(by_node) == set(by_fleet) and min(by_node.values()) == 2
    assert each["summary"]["versions"] > fleet["summary"]["versions"]
    last = each["summary"]["versions"]
    before = _trained([u for u in updates if u["version"] is None or u["version"] < last])
    assert min(before.values(), default=0) < 2 or len(before) < len(by_node)
    slowest = [u for u in updates if u["node-id"] == "11" and u["version"] is not None]
    assert each["summary"]["sim-time-s"] >= max(u["end-s"] for u in slowest)


def test_each_node_budget_leaves_out_a_node_that_dropped(tmp_path: Path) -> None:
    """A node that failed is out of the run: the budget does not wait for its updates."""
    out = _run(tmp_path, each_node=2, target=99.0, fail=[11])
    by_node = _trained(_lines(tmp_path / "updates.jsonl"))
    assert "11" not in {u for u in by_node} and min(by_node.values()) >= 2
    assert out["summary"]["versions"] >= 2
