"""Accounting of fleet-shared profiling (``fl_server.results``): each exchange is a
synchronous step, so a round lasts the exchanges' slowest nodes plus the slowest training,
and each node's slices count as its profiling (time, energy, busy time)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MessageType
from rich.console import Console

from fl_client.contract import Cap, NodeRow
from fl_server.results import RoundAccount, RunRecorder
from fl_server.server_app import Rounds, run_rounds
from fl_server.target import Target
from strategies.power_aware import PowerAwareFedAvg, RoundReport
from tests.strategies.test_power_aware import report
from tests.strategies.test_shared_exchange import FLEET, BatchGrid, _cells_of, _handler, _strategy

pytestmark = pytest.mark.usefixtures("flower_task_identity")

IDLE_W = 1.0  # ``report``'s idle power


def _row(
    node_id: int, name: str, ok: bool = True, shared: tuple[float, float] = (0, 0), **over: Any
) -> NodeRow:
    return NodeRow(
        server_round=1,
        node_id=node_id,
        node_name=name,
        device="jetson-nano",
        p_max=Cap(5.0),
        ok=ok,
        report=report(node_id, **over) if ok else None,
        error="" if ok else "crashed",
        shared_time_s=shared[0],
        shared_energy_j=shared[1],
    )


def _round(shared_round_s: float = 2.5) -> RoundReport:
    """a: trains 5 s (+0.5 s checking its cell), 2 s of slices; b: trains 8 s, 1.5 s of
    slices; c: measured 1 s of slices, then failed its TRAIN."""
    return RoundReport(
        server_round=1,
        nodes=[
            _row(1, "a", shared=(2.0, 6.0), train_time_s=5.0, profile_time_s=0.5),
            _row(
                2,
                "b",
                shared=(1.5, 4.5),
                train_time_s=8.0,
                profile_time_s=0.0,
                profile_energy_j=0.0,
            ),
            _row(3, "c", ok=False, shared=(1.0, 3.0)),
        ],
        shared_round_s=shared_round_s,
    )


def test_round_time_is_the_exchanges_slowest_plus_the_slowest_training() -> None:
    account = RoundAccount.of(_round())
    assert account.round_time_s == pytest.approx(2.5 + 8.0)
    # every node's slices are profiling, the failed node's included
    assert account.profile_time_s == pytest.approx(0.5 + 2.0 + 1.5 + 1.0)
    assert account.profile_energy_j == pytest.approx(1.0 + 6.0 + 4.5 + 3.0)
    assert account.train_time_s == pytest.approx(13.0)
    assert account.busy_energy_j == pytest.approx(account.train_energy_j + account.profile_energy_j)
    # busy: its slices, its training and its own profiling; the rest of the round it waits
    assert account.busy_s == pytest.approx({"a": 2.0 + 5.5, "b": 1.5 + 8.0})
    assert account.slowest == "b"
    assert account.idle_energy_j == pytest.approx(IDLE_W * ((10.5 - 7.5) + (10.5 - 9.5)))


def test_without_shared_profiling_the_round_is_its_slowest_training() -> None:
    rep = _round(shared_round_s=0.0)
    for row in rep.nodes:
        row.shared_time_s = row.shared_energy_j = 0.0
    account = RoundAccount.of(rep)
    assert account.round_time_s == pytest.approx(8.0)
    assert account.profile_time_s == pytest.approx(0.5)
    assert account.busy_s == pytest.approx({"a": 5.5, "b": 8.0})


def _recorder(tmp_path: Path) -> RunRecorder:
    tmp_path.mkdir(parents=True, exist_ok=True)
    console = Console(file=io.StringIO(), width=120)
    rec = RunRecorder(tmp_path, method="power-aware", target=Target(0.9), console=console)
    rec.initial_eval({"accuracy": 0.1, "loss": 2.0})
    return rec


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_and_node_totals_count_the_slices_as_profiling(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    rec.record_round(_round(), {"accuracy": 0.5, "loss": 1.0})
    later = RoundReport(
        server_round=2,
        nodes=[
            _row(1, "a", train_time_s=5.0, profile_time_s=0.0, profile_energy_j=0.0),
            _row(2, "b", train_time_s=8.0, profile_time_s=0.0, profile_energy_j=0.0),
        ],
    )
    rec.record_round(later, {"accuracy": 0.95, "loss": 0.5})
    rounds = _lines(tmp_path / "rounds.jsonl")
    assert [r["round-time-s"] for r in rounds] == pytest.approx([10.5, 8.0])
    assert rounds[-1]["sim-time-s"] == pytest.approx(18.5)
    nodes = _lines(tmp_path / "nodes.jsonl")
    assert [(n["node-name"], n["shared-time-s"]) for n in nodes[:3]] == [
        ("a", 2.0),
        ("b", 1.5),
        ("c", 1.0),
    ]
    summary = rec.finish()
    totals = summary["nodes"]
    assert totals["a"]["profile-time-s"] == pytest.approx(0.5 + 2.0)
    assert totals["a"]["profile-energy-j"] == pytest.approx(1.0 + 6.0)
    assert totals["b"]["profile-time-s"] == pytest.approx(1.5)
    assert totals["c"]["profile-time-s"] == pytest.approx(1.0)  # failed, but it measured
    assert totals["c"]["profile-energy-j"] == pytest.approx(3.0)
    assert totals["a"]["wait-s"] == pytest.approx((10.5 - 7.5) + (8.0 - 5.0))
    assert summary["device-profile-time-s"] == pytest.approx(0.5 + 2.0 + 1.5 + 1.0)
    assert summary["sim-time-to-target-s"] == pytest.approx(18.5)
    assert summary["fleet-profile-energy-j"] == pytest.approx(1.0 + 6.0 + 4.5 + 3.0)


def _recorded_run(
    tmp_path: Path, grid: BatchGrid, num_rounds: int
) -> tuple[PowerAwareFedAvg, RunRecorder]:
    """``num_rounds`` of the strategy with fleet-shared profiling over ``grid``, recorded."""
    rec = _recorder(tmp_path / "run")
    strategy = _strategy(tmp_path / "library")
    run_rounds(
        strategy,
        grid,
        ArrayRecord([np.zeros(3)]),
        Rounds(num_rounds=num_rounds, timeout_s=5),
        lambda rnd, arrays: {"accuracy": 0.1 * rnd, "loss": 1.0},
        rec.record_round,
    )
    return strategy, rec


def test_a_run_with_fleet_shared_profiling_is_accounted_round_by_round(tmp_path: Path) -> None:
    """The strategy's shared phase over a fake Grid, recorded: round 1 adds each exchange's
    slowest slice (0.1 s a cell) to the slowest training; round 2 profiles nothing."""
    grid = BatchGrid(list(FLEET), _handler())
    _, rec = _recorded_run(tmp_path, grid, num_rounds=2)
    slowest = sum(max(0.1 * len(_cells_of(m)) for m in b) for b in grid.profile_batches())
    cells = {n: 0 for n in FLEET}
    for batch in grid.profile_batches():
        for m in batch:
            cells[m.metadata.dst_node_id] += len(_cells_of(m))
    train_s = max(float(n) + 0.5 for n in FLEET)  # ``report``: id s training, 0.5 s profiling
    assert [a.round_time_s for a in rec.accounts] == pytest.approx([slowest + train_s, train_s])
    summary = rec.finish()
    for node_id, desc in FLEET.items():
        totals = summary["nodes"][desc.node_name]
        assert totals["profile-time-s"] == pytest.approx(2 * 0.5 + 0.1 * cells[node_id])
        assert totals["profile-energy-j"] == pytest.approx(2 * 1.0 + 0.3 * cells[node_id])


def test_a_node_that_profiled_then_missed_its_train_keeps_its_slices_in_the_records(
    tmp_path: Path,
) -> None:
    """Its slices were measured and merged into its kind's LUT: their cost is the fleet's
    whether its TRAIN reply comes or not."""
    handle = _handler()
    grid = BatchGrid(list(FLEET), lambda m: None if _silent_train(m, 12) else handle(m))
    strategy, rec = _recorded_run(tmp_path, grid, num_rounds=1)
    (row,) = [n for n in strategy.rounds[-1].nodes if n.node_id == 12]
    assert not row.ok and row.error == "no reply (timeout)"
    measured = sum(
        0.1 * len(_cells_of(m))
        for b in grid.profile_batches()
        for m in b
        if m.metadata.dst_node_id == 12
    )
    assert measured > 0
    assert row.shared_time_s == pytest.approx(measured)
    assert rec.finish()["nodes"]["nano-b"]["profile-time-s"] == pytest.approx(measured)


def _silent_train(msg: Message, node_id: int) -> bool:
    return msg.metadata.dst_node_id == node_id and msg.metadata.message_type == MessageType.TRAIN
