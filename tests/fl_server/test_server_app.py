"""fl_server.server_app: the strategy built by its constructor from the run settings (the
TRAIN config carries the run's starting weights), and the run's loop of rounds."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Error, Message

from fl_client import checkpoint, model_zoo
from fl_client.contract import Cap, TrainConfig
from fl_client.settings import RunSettings
from fl_server.server_app import Rounds, make_strategy, run_rounds, window_note
from fl_server.target import Target
from strategies.power_aware import RoundReport
from strategies.round_plan import PlanSettings
from tests.strategies.test_power_aware import FakeGrid, _handler, _strategy

pytestmark = pytest.mark.usefixtures("flower_task_identity")

R_EST = SimpleNamespace(batch_sizes=(32, 64), r=(0.5, 1.0))


def _settings(tmp_path: Path, **over: object) -> RunSettings:
    return RunSettings.from_config({"cache-dir": str(tmp_path / "cache"), "fleet": "", **over})


def test_every_train_config_names_the_checkpoint_the_run_started_from(tmp_path: Path) -> None:
    """The nodes key the oracle's r by the checkpoint's sha256: the server sends it (the
    node never sees the file); a run from random weights sends none."""
    torch.manual_seed(0)
    path = tmp_path / "w.safetensors"
    checkpoint.save(model_zoo.build_model("cnn").state_dict(), path)
    weights = checkpoint.load_into(model_zoo.build_model("cnn"), path)
    settings = _settings(tmp_path, method="oracle")
    strategy = make_strategy(settings, R_EST, weights)
    sent = TrainConfig.from_config(strategy.template.to_config())
    assert sent.initial_weights_sha256 == checkpoint.file_sha256(path) == weights.sha256
    assert make_strategy(settings, R_EST).template.initial_weights_sha256 is None


def test_the_strategy_is_configured_by_its_constructor_from_the_settings(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        balance="energy",
        **{
            "round-deadline-s": 12.0,
            "deadline-margin": 0.1,
            "aggregation": "fednova",
            "min-train-nodes": 3,
            "shared-seed-cells": 5,
        },
    )
    strategy = make_strategy(settings, R_EST)
    assert strategy.planner is not None
    assert strategy.planner.settings == PlanSettings(
        "energy",
        round_deadline_s=12.0,
        margin=0.1,
        peak_sigma_k=settings.peak_sigma_k,
        critical_r_weight=settings.critical_r_weight,
    )
    assert strategy.shared is not None and strategy.shared.setup.options.seed_cells == 5
    assert strategy.aggregation == "fednova"
    assert strategy.min_train_nodes == strategy.fleet.min_nodes == 3
    assert strategy.fleet.query_config == {"model": "cnn", "batch-sizes": [32, 64]}
    assert (strategy.fleet.batch_sizes, strategy.fleet.r) == ([32, 64], [0.5, 1.0])
    plain = make_strategy(_settings(tmp_path, balance="off", **{"shared-profiling": "off"}), R_EST)
    assert plain.planner is None and plain.shared is None
    # a baseline never profiles: fleet-shared profiling is for the methods with a LUT
    assert make_strategy(_settings(tmp_path, method="b1"), R_EST).shared is None


# --------------------------------------------------------------------------- the loop


def test_run_stops_at_target_and_records_silent_nodes() -> None:
    grid = FakeGrid([11, 12, 13], _handler(silent={13}))
    seen: list[tuple[RoundReport, dict[str, float]]] = []
    accuracies = iter([0.1, 0.5, 0.95, 0.99])
    run_rounds(
        _strategy(),
        grid,
        ArrayRecord([np.zeros(3)]),
        Rounds(num_rounds=10, timeout_s=5, target=Target(0.9)),
        lambda rnd, arr: {"accuracy": next(accuracies), "loss": 1.0},
        lambda rep, ev: seen.append((rep, ev)),
    )
    assert [rep.server_round for rep, _ in seen] == [1, 2]
    assert [ev["accuracy"] for _, ev in seen] == [0.5, 0.95]
    missing = [n for n in seen[0][0].nodes if not n.ok]
    assert [(n.node_name, n.error) for n in missing] == [("orin", "no reply (timeout)")]
    assert missing[0].p_max == Cap.NONE and missing[0].device == "jetson-agx-orin"


@pytest.mark.parametrize(("window", "stops_after"), [(1, 2), (3, 6)])
def test_the_run_stops_where_the_mean_over_its_window_reaches_the_target(
    window: int, stops_after: int
) -> None:
    """0.86 in round 2 is a lucky round: with a window of 3 the run goes on to round 6, the
    first whose mean over rounds 4–6 (0.8633) reaches 0.85."""
    accuracies = iter([0.1, 0.70, 0.86, 0.78, 0.84, 0.88, 0.87, 0.9, 0.9])
    seen: list[float] = []
    run_rounds(
        _strategy(),
        FakeGrid([11, 12, 13], _handler()),
        ArrayRecord([np.zeros(3)]),
        Rounds(num_rounds=8, timeout_s=5, target=Target(0.85, window)),
        lambda rnd, arr: {"accuracy": next(accuracies), "loss": 1.0},
        lambda rep, ev: seen.append(ev["accuracy"]),
    )
    assert len(seen) == stops_after


def test_a_window_longer_than_the_round_budget_is_named_at_start(tmp_path: Path) -> None:
    short = _settings(tmp_path, **{"num-rounds": 2})  # the default window: 3 rounds
    note = window_note(short)
    assert note is not None and note.startswith("target-window: 3 rounds is longer than")
    assert "num-rounds (2)" in note
    assert window_note(_settings(tmp_path, **{"num-rounds": 3})) is None
    assert window_note(_settings(tmp_path, **{"num-rounds": 2, "target-window": 1})) is None


def test_run_without_any_node_answering_the_query_is_an_error() -> None:
    def handle(msg: Message) -> Message:
        return Message(Error(code=1, reason="down"), reply_to=msg)

    with pytest.raises(RuntimeError, match="no node answered the QUERY round"):
        run_rounds(
            _strategy(),
            FakeGrid([11, 12], handle),
            ArrayRecord([np.zeros(3)]),
            Rounds(num_rounds=1, timeout_s=5),
            lambda rnd, arr: {"accuracy": 0.0, "loss": 1.0},
        )


def test_a_node_gone_from_the_superlink_is_named_absent_and_counted_back_when_it_rejoins() -> None:
    grid = FakeGrid([11, 12, 13], _handler())
    seen: list[RoundReport] = []
    strategy = _strategy()
    strategy.fleet.query(grid, timeout_s=5)
    online = iter([[11, 12, 13], [11, 12], [11, 12, 13]])

    def evaluate(rnd: int, arr: ArrayRecord) -> dict[str, float]:
        if rnd < 3:  # the SuperLink's view of who is connected in the next round
            grid.node_ids = next(online)
        return {"accuracy": 0.1, "loss": 1.0}

    run_rounds(
        strategy,
        grid,
        ArrayRecord([np.zeros(3)]),
        Rounds(num_rounds=3, timeout_s=5),
        evaluate,
        lambda rep, ev: seen.append(rep),
    )
    absent = [[(n.node_name, n.error) for n in rep.nodes if not n.ok] for rep in seen]
    assert absent[0] == [] and absent[2] == []
    assert absent[1] == [("orin", "not connected this round (absent from the SuperLink)")]
    assert [len(rep.ok_nodes) for rep in seen] == [3, 2, 3]
