"""A finished run read back (``simulations.report``): what a folder that is not a finished
run is told, and the numbers the pictures draw, checked against the recorder's records.

``fabricated_run`` writes a small run's records through the real recorder
(``fl_server.results.RunRecorder``): three nodes, three rounds, a fleet-shared profiling
step in round 1, a round plan's deadline in rounds 2 and 3, a failed node in round 3.
``fedbuff_run`` writes a ``fedbuff`` run's: the run itself (``fl_server.async_loop``) on a
fake fleet of four nodes with fleet-shared profiling.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message, MessageType
from rich.console import Console

from fl_client.contract import Cap, NodeRow, TrainReport
from fl_client.files import RUN_LOCK
from fl_server.async_loop import AsyncRun, run_fedbuff
from fl_server.async_records import AsyncRecorder
from fl_server.results import RunRecorder
from fl_server.server_app import record_fleet
from fl_server.target import Target
from simulations.report import (
    KINDS,
    UPDATES,
    RunRecords,
    RunRecordsError,
    fedbuff_node_names,
    fedbuff_segments,
    load_run,
    node_names,
    progress,
    round_spans,
    run_node_names,
    run_segments,
    table_row,
    timeline_segments,
)
from strategies.fedbuff import UpdateBudget, VirtualClock
from strategies.power_aware import RoundReport
from tests.fl_server.test_async_loop import PushGrid
from tests.fl_server.test_async_loop import _run as fake_fleet_run
from tests.strategies.test_shared_exchange import BatchGrid
from tests.strategies.test_shared_exchange import _handler as shared_handler
from tests.strategies.test_shared_exchange import _strategy as shared_strategy
from tests.strategies.test_shared_profiling import FLEET as SHARED_FLEET

#: node -> (device, cap W, idle power W)
FLEET = {
    "nano-4.5w": ("jetson-nano", 4.5, 1.2),
    "tx2nx-7w": ("jetson-tx2-nx", 7.0, 1.9),
    "orin-free": ("jetson-orin-nano", math.inf, 3.1),
}
#: round -> (shared profiling step s, deadline s, accuracy, {node: (shared s, profile s,
#: train s) or None: no update})
ROUNDS: dict[int, tuple[float, float | None, float, dict[str, Any]]] = {
    1: (1.2, None, 0.31, {
        "nano-4.5w": (1.2, 0.4, 2.0), "tx2nx-7w": (0.8, 0.3, 1.2), "orin-free": (0.5, 0.1, 0.4),
    }),
    2: (0.0, 2.2, 0.62, {
        "nano-4.5w": (0.0, 0.0, 2.1), "tx2nx-7w": (0.0, 0.0, 1.9), "orin-free": (0.0, 0.0, 1.5),
    }),
    3: (0.0, 2.2, 0.74, {
        "nano-4.5w": (0.0, 0.0, 2.0), "tx2nx-7w": None, "orin-free": (0.0, 0.0, 1.4),
    }),
}  # fmt: skip
TARGET = 0.7


def _train_report(name: str, profile_s: float, train_s: float) -> TrainReport:
    _, cap_w, idle_w = FLEET[name]
    power_w = min(cap_w, 8.0) * 0.8
    return TrainReport(
        num_examples=120.0,
        train_time_s=train_s,
        train_energy_j=power_w * train_s,
        avg_power_w=power_w,
        peak_power_w=power_w * 1.1,
        idle_power_w=idle_w,
        p_max_w=cap_w,
        cap_margin=0.05,
        batch_size=32.0,
        gpu_freq_mhz=614.4,
        profile_time_s=profile_s,
        profile_energy_j=power_w * profile_s,
        cap_violations=0.0,
        time_over_cap_s=0.0,
        train_loss=1.0,
    )


def fabricated_run(folder: Path, method: str = "power-aware", slower: float = 1.0) -> Path:
    """Write the records of the run in ``ROUNDS`` into ``folder`` (every time × ``slower``)
    through the run recorder, as a run would; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    rec = RunRecorder(
        folder,
        method=method,
        target=Target(TARGET),
        console=Console(file=io.StringIO()),
        balance="energy",
    )
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    for rnd, (step_s, deadline_s, accuracy, nodes) in ROUNDS.items():
        rows = []
        for node_id, (name, times) in enumerate(nodes.items()):
            device, cap_w, _ = FLEET[name]
            if times is None:
                rows.append(NodeRow(rnd, node_id, name, device, Cap(cap_w), False, error="gone"))
                continue
            shared_s, profile_s, train_s = (t * slower for t in times)
            report = _train_report(name, profile_s, train_s)
            shared = {"shared_time_s": shared_s, "shared_energy_j": 2.0 * shared_s}
            rows.append(NodeRow(rnd, node_id, name, device, report.cap, True, report, **shared))
        round_report = RoundReport(
            rnd,
            rows,
            deadline_s=None if deadline_s is None else deadline_s * slower,
            shared_round_s=step_s * slower,
        )
        rec.record_round(round_report, {"accuracy": accuracy / slower, "loss": 1.0})
    rec.finish()
    return folder


def check_timeline_matches_records(run: RunRecords) -> None:
    """What a timeline draws, against the run's records: each node's bars fill its round
    without overlap; its busy bars are its recorded training, profiling and shared
    profiling; its idle bars at its idle power are the idle energy the recorder counted."""
    segments = timeline_segments(run.rounds, run.nodes)
    spans = {s.server_round: s for s in round_spans(run.rounds, run.nodes)}
    rounds = {int(r["server-round"]): r for r in run.rounds}
    assert [s.server_round for s in spans.values()] == list(rounds)
    for rnd, rows in _group(run.nodes).items():
        span = spans[rnd]
        assert span.end_s - span.start_s == pytest.approx(rounds[rnd]["round-time-s"])
        idle_j = 0.0
        for n in rows:
            mine = [s for s in segments if s.server_round == rnd and s.node == n["node-name"]]
            for a, b in itertools.pairwise(mine):  # one after another, no overlap
                assert b.start_s == pytest.approx(a.end_s, abs=1e-9)
            busy = {k: sum(s.duration_s for s in mine if s.kind == k) for k in KINDS}
            idle_s = busy.pop("idle")
            assert busy["profiling"] == pytest.approx(
                (n["shared-time-s"] or 0.0) + (n.get("profile-time-s") or 0.0), abs=1e-9
            )
            if not n["ok"]:
                assert busy["training"] == 0 and any(s.kind == "failed" for s in mine) == (
                    span.end_s > span.training_start_s
                )
                continue
            assert busy["training"] == pytest.approx(n["train-time-s"], abs=1e-9)
            assert mine[0].start_s == pytest.approx(span.start_s, abs=1e-9)
            assert mine[-1].end_s == pytest.approx(span.end_s, abs=1e-9)
            assert busy["profiling"] + busy["training"] + idle_s == pytest.approx(
                span.end_s - span.start_s, abs=1e-9
            )
            idle_j += (n.get("idle-power-w") or 0.0) * idle_s
        assert idle_j == pytest.approx(rounds[rnd]["round-idle-energy-j"], rel=1e-9, abs=1e-9)


def _group(nodes: Sequence[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for n in nodes:
        out.setdefault(int(n["server-round"]), []).append(n)
    return out


# ------------------------------------------------------------------------------ timeline


def test_timeline_bars_of_the_fabricated_run(tmp_path: Path) -> None:
    run = load_run(fabricated_run(tmp_path / "run"))
    check_timeline_matches_records(run)
    spans = round_spans(run.rounds, run.nodes)
    # round 1: the shared step (1.2 s), then the slowest node's own profiling and training
    assert [x for s in spans for x in (s.start_s, s.end_s)] == pytest.approx(
        [0.0, 1.2 + 2.4, 3.6, 3.6 + 2.1, 5.7, 5.7 + 2.0]
    )
    assert spans[0].training_start_s == pytest.approx(1.2)
    assert [s.deadline_at_s for s in spans] == [None, pytest.approx(5.8), pytest.approx(7.9)]
    bars = [
        (s.kind, round(s.start_s, 6), round(s.duration_s, 6))
        for s in timeline_segments(run.rounds, run.nodes)
        if s.node == "tx2nx-7w"
    ]
    assert bars == [
        ("profiling", 0.0, 0.8),  # its slices of the fleet-shared profile
        ("idle", 0.8, 0.4),  # waiting for the nano's slices
        ("profiling", 1.2, 0.3),  # checking its chosen cell
        ("training", 1.5, 1.2),
        ("idle", 2.7, 0.9),  # waiting for the nano's training
        ("training", 3.6, 1.9),
        ("idle", 5.5, 0.2),
        ("failed", 5.7, 2.0),  # no update in round 3
    ]
    assert node_names(run.nodes) == ["nano-4.5w", "tx2nx-7w", "orin-free"]


def test_the_slowest_node_never_waits(tmp_path: Path) -> None:
    run = load_run(fabricated_run(tmp_path / "run"))
    critical = {int(r["server-round"]): r["critical-node"] for r in run.rounds}
    for s in timeline_segments(run.rounds, run.nodes):
        if s.node == critical[s.server_round]:
            assert s.kind != "idle"


def fedbuff_run(
    folder: Path, drop: Iterable[int] = (), target: float = 2.0, versions: int = 5
) -> Path:
    """A ``fedbuff`` run's records written by the run itself (``run_fedbuff`` and its
    recorder) into ``folder``: the four nodes of ``tests.strategies.test_shared_exchange``
    (fleet-shared profiling first, then training by node id), two updates per version,
    version v's accuracy 0.1 × v, up to ``versions`` versions or the ``target``, and the
    fleet's ``fleet.json`` as the server writes it; a ``drop`` node's TRAIN replies are
    errors, so it is dropped with its first work."""
    folder.mkdir(parents=True, exist_ok=True)
    answer = shared_handler()

    def handle(msg: Message) -> Message | None:
        if msg.metadata.message_type == MessageType.TRAIN and msg.metadata.dst_node_id in drop:
            return Message(Error(code=1, reason="board lost"), reply_to=msg)
        return answer(msg)

    rec = AsyncRecorder(
        folder, method="power-aware", target=Target(target), console=Console(file=io.StringIO())
    )
    # as the server sets it up for fedbuff: each node's profiled steps are its own update
    strategy = shared_strategy(
        folder.with_name(f"{folder.name}-library"), steps_train=True, per_node=True
    )
    grid = BatchGrid(sorted(SHARED_FLEET), handle)
    run = AsyncRun(strategy, grid, VirtualClock(2, "inverse-sqrt"), rec, 5.0)
    record_fleet(strategy.fleet, rec)

    def evaluate(version: int, arrays: ArrayRecord) -> dict[str, float]:
        metrics = {"accuracy": 0.1 * version, "loss": 1.0}
        if version == 0:
            rec.initial_eval(metrics)
        return metrics

    run_fedbuff(run, ArrayRecord([np.zeros(3)]), UpdateBudget("fleet", 0, versions), evaluate)
    rec.finish()
    return folder


def check_fedbuff_timeline(run: RunRecords) -> None:
    """What a ``fedbuff`` timeline draws, against the run's records: each node's bars one
    after another, never overlapping; each update's work its profiling from its ``start-s``
    and its training to its ``end-s``; a dropped node's last bar ``failed`` up to the last
    version; any other node's, ordered by device time, its last update's end or the work it
    was running then, up to the last version; ordered by arrival, its last update's end."""
    segments = fedbuff_segments(run)
    assert run.is_fedbuff and run_segments(run) == segments
    last_version_s = run.rounds[-1]["sim-time-s"]
    arrival = any(u["arrival-wall-s"] is not None for u in run.updates)
    opened_s = min(u["start-s"] for u in run.updates if u["work"] > 0)  # the first works
    for name in run_node_names(run):
        mine = [s for s in segments if s.node == name]
        assert mine, f"{name} has no bar"
        for a, b in itertools.pairwise(mine):
            assert b.start_s == pytest.approx(a.end_s, abs=1e-9)
        updates = [u for u in run.updates if u["node"] == name]
        for u in updates:
            work = [
                s
                for s in mine
                if s.server_round == u["work"] and s.kind != "idle" and s.start_s >= u["start-s"]
            ]
            trains = u["device-time-s"] > u["profile-time-s"]  # work 0 is all profiling
            assert [s.kind for s in work] == ["profiling"] * (u["profile-time-s"] > 0) + [
                "training"
            ] * trains
            assert work[0].start_s == pytest.approx(u["start-s"], abs=1e-9)
            assert work[-1].end_s == pytest.approx(u["end-s"], abs=1e-9)
        last_end_s = max((u["end-s"] for u in updates), default=0.0)
        kinds = [s.kind for s in mine]
        if any(not n["ok"] for n in run.nodes if n["node-name"] == name):
            assert kinds[-1] == "failed" and "running" not in kinds
            assert mine[-1].end_s == pytest.approx(last_version_s, abs=1e-9)
        elif arrival:
            assert mine[-1].end_s == pytest.approx(last_end_s, abs=1e-9)
            assert not {"failed", "running"} & set(kinds)
        else:
            assert mine[-1].end_s == pytest.approx(last_version_s, abs=1e-9)
            assert "failed" not in kinds and kinds.count("running") <= 1
            if "running" in kinds:  # the work it was sent at its last update's end
                assert kinds[-1] == "running" and last_end_s < last_version_s
                assert mine[-1].start_s == pytest.approx(max(last_end_s, opened_s), abs=1e-9)


@pytest.mark.usefixtures("flower_task_identity")
def test_fedbuff_bars_are_each_nodes_works_on_its_own_clock(tmp_path: Path) -> None:
    run = load_run(fedbuff_run(tmp_path / "run"))
    check_fedbuff_timeline(run)
    assert run_node_names(run) == fedbuff_node_names(run) == run.fleet
    assert run.fleet == ["nano-a", "nano-b", "nano-c", "orin"]
    segments = fedbuff_segments(run)
    first_rows = {n["node-name"]: n for n in run.nodes if n["server-round"] == 1}
    slices = [r["shared-time-s"] for r in first_rows.values()]
    assert min(slices) < max(slices)  # nodes whose slices took different times
    for name, node in run.summary["nodes"].items():
        mine = [s for s in segments if s.node == name]
        # its slices of the fleet-shared profiling first (its work 0), from 0, then its wait
        # for its kind's LUT, when its first work starts
        opened_s = min(u["start-s"] for u in run.updates if u["node"] == name and u["work"])
        assert (mine[0].kind, mine[0].server_round, mine[0].start_s) == ("profiling", 0, 0.0)
        assert mine[0].duration_s == pytest.approx(first_rows[name]["shared-time-s"])
        busy = {k: sum(s.duration_s for s in mine if s.kind == k) for k in KINDS}
        # its totals are its time in [0, the last version], the shared slices and the work
        # running at the stop (never taken: its part up to then, pro rata) included
        done = busy["training"] + busy["profiling"]
        assert done + busy["running"] == pytest.approx(
            node["train-time-s"] + node["profile-time-s"]
        )
        # its idle bars are the idle time the recorder's clock counted for it
        assert busy["idle"] == pytest.approx(node["wait-s"], abs=1e-9)
        # a node that replies gets its next work at once: idle only before its first work
        assert all(s.end_s <= opened_s + 1e-9 for s in mine if s.kind == "idle")
    # each kind started when its own LUT was merged: the Nanos before the Orin
    first_start = {u["node"]: u["start-s"] for u in run.updates if u["work"] == 1}
    assert first_start["nano-a"] == first_start["nano-b"] == first_start["nano-c"]
    assert first_start["nano-a"] < first_start["orin"]
    # the run stopped at version 5 (nano-c's update): the others were in their next work
    running = {s.node for s in segments if s.kind == "running"}
    last = max(run.updates, key=lambda u: u["end-s"])
    assert running == set(run.fleet) - {last["node"]}


@pytest.mark.usefixtures("flower_task_identity")
def test_a_node_whose_first_training_work_was_never_taken_has_its_row(tmp_path: Path) -> None:
    # one version's budget (and the profiled updates'): one version of training updates, from
    # the two fastest nodes; the other two were still in their first work
    run = load_run(fedbuff_run(tmp_path / "run", versions=1))
    check_fedbuff_timeline(run)
    taken = {u["node"] for u in run.updates if u["work"] > 0}
    assert taken == {"nano-a", "nano-b"} and run_node_names(run) == run.fleet
    for name in set(run.fleet) - taken:  # its slices (work 0), then its first work running
        (profiled,) = [u for u in run.updates if u["node"] == name]
        bars = [(s.kind, s.server_round, s.start_s, s.end_s) for s in fedbuff_segments(run)
                if s.node == name]  # fmt: skip
        assert bars[0] == ("profiling", 0, 0.0, pytest.approx(profiled["profile-time-s"]))
        assert bars[-1][0::3] == ("running", run.summary["sim-time-s"])
        # what it trained while it waited for its kind's LUT ends its work 0
        waited = profiled["device-time-s"] - profiled["profile-time-s"]
        if waited > 0:
            assert bars[1] == ("training", 0, pytest.approx(profiled["end-s"] - waited),
                               profiled["end-s"])  # fmt: skip
        assert [b[0] for b in bars[1 + (waited > 0) : -1]] in ([], ["idle"])


@pytest.mark.usefixtures("flower_task_identity")
def test_a_dropped_node_is_failed_from_the_work_it_was_dropped_with(tmp_path: Path) -> None:
    run = load_run(fedbuff_run(tmp_path / "run", drop=[12]))
    check_fedbuff_timeline(run)
    bars = [(s.kind, s.server_round) for s in fedbuff_segments(run) if s.node == "nano-b"]
    # its slices of the shared step and its training while it waited for its kind's LUT
    # (its work 0), the rest of the wait (less than a step), then its first work: never a
    # training update
    assert bars == [("profiling", 0), ("training", 0), ("idle", 1), ("failed", 1)]
    failed = next(s for s in fedbuff_segments(run) if s.kind == "failed")
    nanos = [u["start-s"] for u in run.updates if u["work"] == 1 and u["node"] != "orin"]
    assert failed.start_s == pytest.approx(min(nanos))  # its kind's first works' start


@pytest.mark.usefixtures("flower_task_identity")
def test_fedbuff_bars_ordered_by_arrival_follow_each_nodes_device_time(tmp_path: Path) -> None:
    # a deployment: updates taken as they arrive; a silent node dropped at its timeout
    fake_fleet_run(tmp_path, grid=PushGrid({11: 1, 12: 3, 13: 2}, silent=[13]), versions=4)
    run = load_run(tmp_path)
    assert all(u["arrival-wall-s"] is not None for u in run.updates)
    check_fedbuff_timeline(run)
    assert {s.kind for s in fedbuff_segments(run)} == {"profiling", "training", "failed"}


def test_a_fedbuff_run_without_its_updates_is_refused_naming_the_file(tmp_path: Path) -> None:
    run = fabricated_run(tmp_path / "run")
    assert load_run(run).updates == [] and not load_run(run).is_fedbuff
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "aggregation": "fedbuff"}))
    with pytest.raises(RunRecordsError, match=re.escape("a fedbuff run (summary.json's aggre")):
        load_run(run)
    (run / UPDATES).write_text(json.dumps({"node": "nano-4.5w", "work": 1}) + "\n")
    with pytest.raises(RunRecordsError, match=r"updates.jsonl line 1: lacks 'start-s', "):
        load_run(run)
    update = {"node": "nano-4.5w", "work": 1, "start-s": 0.0, "end-s": 1.0, "profile-time-s": 0}
    (run / UPDATES).write_text(json.dumps(update) + "\n")
    (run / "fleet.json").write_text(json.dumps({"nodes": {"7": {"device": "jetson-nano"}}}))
    with pytest.raises(RunRecordsError, match=re.escape("fleet.json: not a fleet record (a 'n")):
        load_run(run)
    (run / "fleet.json").unlink()  # a run started without the server app has none
    assert load_run(run).fleet == [] and load_run(run).updates == [update]


# ------------------------------------------------------------------------------ progress


def test_progress_is_the_recorded_accuracy_time_and_energy(tmp_path: Path) -> None:
    run = load_run(fabricated_run(tmp_path / "run"))
    curve = progress(run)
    assert curve.label == "power-aware"
    assert curve.accuracy == pytest.approx((0.1, 0.31, 0.62, 0.74))
    assert curve.time_s == pytest.approx((0.0, *(r["sim-time-s"] for r in run.rounds)))
    # energy with idle waiting, whatever the run's headline counted
    with_idle = [r["fleet-busy-energy-j"] + r["fleet-idle-energy-j"] for r in run.rounds]
    assert curve.energy_j == pytest.approx((0.0, *with_idle))
    assert curve.target_accuracy == TARGET
    s = run.summary
    assert s["round-to-target"] == 3 and curve.target_index == 3
    assert curve.time_s[3] == pytest.approx(s["sim-time-to-target-s"])
    assert curve.energy_j[3] == pytest.approx(
        s["fleet-busy-energy-to-target-j"] + s["fleet-idle-energy-to-target-j"]
    )


def test_a_run_that_misses_the_target_has_no_target_point(tmp_path: Path) -> None:
    run = load_run(fabricated_run(tmp_path / "run", slower=2.0))  # accuracy halved
    curve = progress(run, "slow")
    assert curve.label == "slow" and max(curve.accuracy) < TARGET
    assert curve.target_index is None
    assert table_row(run)[3:6] == ("-", "-", "-")


def test_table_row_from_the_summary(tmp_path: Path) -> None:
    run = load_run(fabricated_run(tmp_path / "20261129-020000-power-aware"))
    s = run.summary
    name, method, rounds, to_target, time_s, energy_j, all_j, share = table_row(run)
    assert (name, method, rounds, to_target) == ("20261129-020000-power-aware", "power-aware",
                                                 "3", "3")  # fmt: skip
    assert float(time_s) == pytest.approx(s["sim-time-to-target-s"], abs=0.05)
    e2t = s["fleet-busy-energy-to-target-j"] + s["fleet-idle-energy-to-target-j"]
    assert float(energy_j) == pytest.approx(e2t, abs=0.05)
    assert float(all_j) == pytest.approx(s["fleet-busy-energy-j"] + s["fleet-idle-energy-j"],
                                         abs=0.05)  # fmt: skip
    assert share == f"{100 * s['profile-share']:.1f}%" and s["profile-share"] > 0
    # a window that a lucky round came before: both rounds, the window's first
    lucky = {**s, "target-window": 3, "round-to-target": 6, "first-round-at-target": 2}
    assert table_row(dataclasses.replace(run, summary=lucky))[3] == "6 (first 2)"
    missed = {**s, "target-window": 3, "round-to-target": None, "first-round-at-target": 2}
    assert table_row(dataclasses.replace(run, summary=missed))[3] == "- (first 2)"


# ------------------------------------------------------------------------ bad run folders


def test_a_missing_folder_or_a_file(tmp_path: Path) -> None:
    with pytest.raises(RunRecordsError, match="no such folder"):
        load_run(tmp_path / "nope")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(RunRecordsError, match="a file, not a run folder"):
        load_run(tmp_path / "f.txt")


def test_a_folder_that_is_not_a_run_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(
        RunRecordsError, match=re.escape("not a run folder, it has no summary.json")
    ):
        load_run(tmp_path)
    run = fabricated_run(tmp_path / "run")
    (run / "nodes.jsonl").unlink()
    with pytest.raises(RunRecordsError, match=re.escape("has summary.json but no nodes.jsonl")):
        load_run(run)


def test_a_run_in_progress_says_so(tmp_path: Path) -> None:
    run = fabricated_run(tmp_path / "run")
    (run / "summary.json").unlink()  # as before its end
    with pytest.raises(RunRecordsError, match="still in progress, or it was stopped"):
        load_run(run)
    (run / RUN_LOCK).write_text(f"{os.getpid()} 2026-11-29T02:00:00+00:00\n")  # a live owner
    with pytest.raises(RunRecordsError, match=rf"still in progress \(process {os.getpid()}"):
        load_run(run)


def test_records_that_lack_a_key_or_do_not_parse(tmp_path: Path) -> None:
    run = fabricated_run(tmp_path / "run")
    lines = (run / "rounds.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    del row["sim-time-s"]
    (run / "rounds.jsonl").write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    with pytest.raises(RunRecordsError, match=r"rounds.jsonl line 2: lacks 'sim-time-s' "):
        load_run(run)
    (run / "rounds.jsonl").write_text(lines[0] + "\n{oops\n")
    with pytest.raises(
        RunRecordsError, match=re.escape("rounds.jsonl line 2: not readable as JSON")
    ):
        load_run(run)
    (run / "summary.json").write_text("[1, 2]")
    with pytest.raises(RunRecordsError, match=re.escape("summary.json: not a JSON object")):
        load_run(run)


def _as_version(run: Path, version: int, drop: tuple[str, ...]) -> None:
    """Rewrite the run's summary.json as a record of ``version`` without the keys ``drop``."""
    summary = json.loads((run / "summary.json").read_text())
    summary["record-version"] = version
    (run / "summary.json").write_text(json.dumps({k: summary[k] for k in summary if k not in drop}))


#: The keys record version 4 added to the summary.
V4_KEYS = (
    "target-window",
    "first-round-at-target",
    "sim-time-to-first-target-s",
    "fleet-energy-to-first-target-j",
)


def test_a_version_3_run_reads_as_reaching_the_target_at_its_first_round(tmp_path: Path) -> None:
    """Version 3 had no window: its round-to-target is its first round at the target."""
    run = fabricated_run(tmp_path / "run")
    _as_version(run, 3, V4_KEYS)
    s = load_run(run).summary
    assert s["target-window"] == 1 and s["first-round-at-target"] == s["round-to-target"] == 3
    assert s["sim-time-to-first-target-s"] == s["sim-time-to-target-s"]
    assert s["fleet-energy-to-first-target-j"] == s["fleet-energy-to-target-j"]
    _as_version(run, 2, V4_KEYS)  # an older version has no such reading: refused, named
    with pytest.raises(RunRecordsError, match=r"lacks 'target-window', .*record version 2; a "):
        load_run(run)
