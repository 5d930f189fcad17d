"""Fleet-shared profiling on the node (the simulated twin): measuring a slice
(``profile_cells`` and the ``train.profile`` handler), and a TRAIN round that selects from
its kind's LUT after verifying the chosen cell on its own board, re-profiles that row when
the board disagrees, and ignores a LUT of another kind."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fl_client.client_app import make_client_app
from fl_client.contract import CellsReport, ProfileRequest, TrainReport
from fl_client.devices.descriptors import load_device_spec
from fl_client.devices.simulated import power_w as twin_power_w
from fl_client.devices.simulated import time_per_sample_s as twin_time_per_sample_s
from fl_client.lut import LUT, KindKey
from fl_client.node import describe_node, profile_cells, train_node, workload_for
from strategies.shared_profiling import SharedOptions, exchanges, kinds_of
from tests.fl_client.test_node import NODE, R_FOR_B64, initial_state, run_config, train_config

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NANO = load_device_spec("jetson-nano")
F = tuple(NANO.gpu_freqs_mhz)
B = [8, 16, 32, 64]
CAP_W, MARGIN = 5.0, 0.05  # the run setting's cap-margin
#: The TRAIN config keys every test here shares: B, and r that makes b = 64 the choice
TRAIN = {"r": R_FOR_B64}


def _request(cells: list[tuple[int, float]], steps_train: bool = True) -> ProfileRequest:
    return ProfileRequest(
        server_round=1,
        model="cnn",
        batch_sizes=tuple(B),
        cells_b=tuple(b for b, _ in cells),
        cells_knob_value=tuple(f for _, f in cells),
        lr_ref=0.005,
        b_ref=128,
        steps_train=steps_train,
    )


def _node(partition: int, **options: Any) -> dict[str, Any]:
    return {**NODE, "partition-id": partition, "p-max-w": CAP_W, **options}


@pytest.fixture(scope="module")
def kind_lut(tmp_path_factory: pytest.TempPathFactory) -> LUT:
    """The Nano kind's LUT, measured as the strategy has it measured: seed slices, then
    confirm cells, by two twin nodes (partitions 0 and 1) under 5 W."""
    tmp = tmp_path_factory.mktemp("kind")
    nodes = {0: _node(0), 1: _node(1)}
    fleet = {
        n: describe_node(run_config(tmp), cfg, {"model": "cnn", "batch-sizes": B})
        for n, cfg in nodes.items()
    }
    kinds = kinds_of(fleet, {n: B for n in fleet}, "cnn", workload_for("cnn").input_shape)
    (prof,) = kinds.values()
    state = initial_state()

    cost = [0.0, 0.0]

    def measure(requests: dict[int, list[tuple[int, float]]]) -> None:
        for node, cells in requests.items():
            config = _request(cells, steps_train=False).to_config()
            report = profile_cells(run_config(tmp), nodes[node], config, state)[1]
            prof.add(report)
            cost[0] += report.profile_time_s
            cost[1] += report.profile_energy_j

    for requests in exchanges(kinds, {k: list(R_FOR_B64) for k in kinds}, SharedOptions()):
        measure(requests)
    lut = prof.lut(cost[0], cost[1])
    assert lut is not None
    return lut


def _train(
    tmp_path: Path,
    node: dict[str, Any],
    server_round: int = 1,
    verify: str = "training",
    **cfg: Any,
) -> TrainReport:
    config = train_config(server_round, **{**TRAIN, **cfg})
    settings = run_config(tmp_path, **{"shared-verify": verify})
    return train_node(settings, node, config, initial_state())[1]


def _cell(lut: LUT, report: TrainReport) -> tuple[float, float]:
    """The LUT's time per sample and peak power at the report's (b, f)."""
    i = lut.batch_sizes.index(int(report.batch_size))
    j = lut.knob_values.index(report.gpu_freq_mhz)
    return float(lut.time_per_sample_s[i, j]), float(lut.peak_power_w[i, j])


def _verified_copy(tmp_path: Path) -> LUT:
    (path,) = (tmp_path / "cache" / "nodes").rglob("lut_*_shared_*.json")
    return LUT.load(path)


# --------------------------------------------------------------------------- PROFILE


@pytest.mark.parametrize("steps_train", [True, False])
def test_profile_cells_measures_exactly_the_requested_cells(
    tmp_path: Path, steps_train: bool
) -> None:
    cells = [(64, F[4]), (8, F[-1]), (16, F[6])]
    state = initial_state()
    new_state, report = profile_cells(
        run_config(tmp_path), _node(0), _request(cells, steps_train).to_config(), state
    )
    assert isinstance(report, CellsReport)
    assert list(zip(report.cells_b, report.cells_knob_value, strict=True)) == cells  # in order
    flops = workload_for("cnn").flops_per_sample
    for (b, f), t, p, a in zip(
        cells, report.time_per_sample_s, report.peak_power_w, report.avg_power_w, strict=True
    ):
        assert t == pytest.approx(twin_time_per_sample_s(NANO, b, f, flops), rel=0.15)
        assert 0 < a <= p
    assert report.profile_time_s > 0 and report.profile_energy_j > 0
    assert CellsReport.from_metrics(report.to_metrics()) == report  # survives the wire
    request = _request(cells, steps_train).to_config()  # an older server's key reads the same
    older = {("cells-freq-mhz" if k == "cells-knob-value" else k): v for k, v in request.items()}
    assert "cells-knob-value" in request and "cells-knob-value" not in older
    assert ProfileRequest.from_config(older) == ProfileRequest.from_config(request)
    changed = [k for k in state if not torch.equal(new_state[k], state[k])]
    if steps_train:  # warm-up and measured steps are real minibatches whose updates stay
        # a cell runs 1 warm-up and at least 3 measured steps, more until its mean step
        # time settles (relative standard error <= 1%); every one is a real minibatch
        assert changed and report.num_examples >= (1 + 3) * (64 + 8 + 16)
    else:
        assert changed == [] and report.num_examples == 0


def _context(tmp_path: Path) -> Context:
    return Context(
        run_id=1,
        node_id=7,
        node_config=_node(0),
        state=RecordDict(),
        run_config=run_config(tmp_path),
    )


def _profile_message(config: dict[str, Any]) -> Message:
    arrays = ArrayRecord(initial_state())
    return Message(
        RecordDict({"arrays": arrays, "config": ConfigRecord(config)}),
        message_type="train.profile",
        dst_node_id=7,
    )


def test_the_profile_handler_replies_with_the_cells_and_the_arrays(tmp_path: Path) -> None:
    app = make_client_app()
    config = _request([(32, F[5])]).to_config()
    reply = app(_profile_message(config), _context(tmp_path))
    assert not reply.has_error(), reply.error.reason
    report = CellsReport.from_metrics(dict(reply.content.metric_records["metrics"]))
    assert report.cells_b == (32.0,) and report.num_examples == 4 * 32
    assert set(reply.content.array_records["arrays"]) == set(initial_state())
    bad = {**config, "cells-b": [128]}
    reply = app(_profile_message(bad), _context(tmp_path))
    assert reply.has_error()
    assert "cells: batch sizes [128] are not in batch-sizes" in str(reply.error.reason)


# --------------------------------------------------------------------------- TRAIN


@pytest.mark.parametrize("verify", ["training", "before"])
def test_a_valid_kind_lut_is_verified_at_the_chosen_cell_then_trusted(
    tmp_path: Path, kind_lut: LUT, verify: str
) -> None:
    node = _node(2)  # a node that measured none of the kind's cells
    first = _train(tmp_path, node, verify=verify, kind_lut=kind_lut.to_json())
    assert first.lut_shared == 1.0 and first.lut_from_cache == 0.0
    assert first.kind_reprofiled == 0.0
    assert first.kind_verify_deviation is not None and 0 <= first.kind_verify_deviation <= 0.15
    time_s, peak_w = _cell(kind_lut, first)  # a measured cell of the kind's LUT ...
    assert np.isfinite(time_s) and peak_w < CAP_W * (1 - MARGIN)  # ... under the cap
    assert first.batch_size == 64
    assert first.peak_power_w < CAP_W and first.cap_violations == 0
    if verify == "training":  # the round's own steps checked the cell: nothing measured
        assert first.profile_time_s == 0.0
    else:
        assert 0 < first.profile_time_s < kind_lut.profile_time_s / 4  # one cell, not a LUT
    record = TrainReport.from_metrics(first.to_metrics()).to_record()
    assert record["kind-verify-deviation"] == pytest.approx(first.kind_verify_deviation)
    assert record["kind-reprofiled"] == 0.0 and record["lut-shared"] == 1.0
    # the next round trusts the verified copy: nothing measured, the same choice
    second = _train(tmp_path, node, 2, verify=verify, kind_lut=kind_lut.to_json())
    assert second.profile_time_s == 0.0 and second.lut_from_cache == 1.0
    assert second.lut_shared == 1.0 and second.kind_verify_deviation is None
    assert (second.batch_size, second.gpu_freq_mhz) == (first.batch_size, first.gpu_freq_mhz)


def test_a_chosen_cell_the_node_measured_in_its_slice_is_not_measured_again(
    tmp_path: Path, kind_lut: LUT
) -> None:
    probe = _train(tmp_path / "probe", _node(2), kind_lut=kind_lut.to_json())
    cell = (int(probe.batch_size), probe.gpu_freq_mhz)
    config = _request([cell], steps_train=False).to_config()
    profile_cells(run_config(tmp_path), _node(3), config, initial_state())
    report = _train(tmp_path, _node(3), verify="before", kind_lut=kind_lut.to_json())
    assert (report.batch_size, report.gpu_freq_mhz) == (probe.batch_size, probe.gpu_freq_mhz)
    assert report.profile_time_s == 0.0 and report.kind_reprofiled == 0.0
    assert report.kind_verify_deviation is not None and report.kind_verify_deviation <= 0.15


@pytest.mark.slow  # re-profiles b = 64's row for real: about 8 s each
@pytest.mark.parametrize(
    "drift", [{"twin-slowdown": 1.6}, {"twin-extra-power-w": 1.0}], ids=["slower", "hotter"]
)
def test_a_board_that_disagrees_reprofiles_its_row_and_says_so(
    tmp_path: Path, kind_lut: LUT, drift: dict[str, float]
) -> None:
    node = _node(2, **drift)
    first = _train(tmp_path, node, verify="before", kind_lut=kind_lut.to_json())
    _check_reprofiled(tmp_path, kind_lut, drift, first)
    second = _train(tmp_path, node, 2, verify="before", kind_lut=kind_lut.to_json())
    assert second.profile_time_s == 0.0 and second.kind_reprofiled is None
    assert (second.batch_size, second.gpu_freq_mhz) == (first.batch_size, first.gpu_freq_mhz)


def _check_reprofiled(
    tmp_path: Path, kind_lut: LUT, drift: dict[str, float], report: TrainReport
) -> None:
    """``report``'s round measured the chosen cell before training, found the board off
    the kind's LUT, re-profiled the row and chose again, feasibly on this board."""
    assert report.kind_reprofiled == 1.0
    assert report.kind_verify_deviation is not None and report.kind_verify_deviation > 0.15
    assert report.to_record()["kind-reprofiled"] == 1.0
    assert report.profile_time_s > 0.2  # the check and the row
    # the corrected copy holds what this board measured; the choice is feasible on it
    mine = _verified_copy(tmp_path)
    assert _cell(mine, report)[1] < CAP_W * (1 - MARGIN)
    assert report.peak_power_w < CAP_W
    b = int(report.batch_size)
    i = mine.batch_sizes.index(b)
    flops = workload_for("cnn").flops_per_sample
    # the row as this board draws it, against the twin's noiseless board
    ratio = mine.time_per_sample_s[i] / [twin_time_per_sample_s(NANO, b, f, flops) for f in F]
    power = mine.peak_power_w[i] - [twin_power_w(NANO, b, f, flops) for f in F]
    assert np.count_nonzero(~np.isnan(mine.time_per_sample_s[i])) >= 2
    if "twin-slowdown" in drift:
        assert np.nanmedian(ratio) == pytest.approx(1.6, rel=0.15)
    else:
        assert np.nanmin(power) > 0.5  # +1 W at every cell, up to the sensor's noise
        # its choice is judged on its own row: feasible there with peak + k·σ
        i, j = (
            mine.batch_sizes.index(int(report.batch_size)),
            mine.knob_values.index(report.gpu_freq_mhz),
        )
        robust_w = mine.peak_power_w[i, j] + 2.0 * np.nan_to_num(mine.peak_sigma_w[i, j])
        assert robust_w < CAP_W * (1 - MARGIN)


@pytest.mark.slow  # re-profiles b = 64's row for real: about 8 s each
@pytest.mark.parametrize(
    "drift", [{"twin-slowdown": 1.6}, {"twin-extra-power-w": 1.0}], ids=["slower", "hotter"]
)
def test_a_board_its_training_finds_off_the_lut_reprofiles_its_row_the_next_round(
    tmp_path: Path, kind_lut: LUT, drift: dict[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    """Checked by its own training steps (the default), a board off its kind's LUT trains
    one round at the kind's choice (the cap guard holds the cap of a board that draws more
    than the kind), is found off, and measures and re-profiles before the next round."""
    node = _node(2, **drift)
    with caplog.at_level(logging.WARNING, logger="fl_client.node"):
        first = _train(tmp_path, node, kind_lut=kind_lut.to_json())
    assert first.profile_time_s == 0.0 and first.kind_reprofiled == 0.0
    assert first.kind_verify_deviation is not None and first.kind_verify_deviation > 0.15
    assert "off its kind's LUT" in caplog.text and "re-profiles the row" in caplog.text
    assert first.lut_power_deviation is not None
    if "twin-extra-power-w" in drift:  # found by its peak against the cell's promise
        assert first.lut_power_deviation > 0.15
    else:  # found by its time: its power is the kind's
        assert first.lut_power_deviation <= 0.15 and first.peak_power_w < CAP_W
    second = _train(tmp_path, node, 2, kind_lut=kind_lut.to_json())
    _check_reprofiled(tmp_path, kind_lut, drift, second)
    third = _train(tmp_path, node, 3, kind_lut=kind_lut.to_json())
    assert third.profile_time_s == 0.0 and third.kind_reprofiled is None
    assert third.lut_from_cache == 1.0
    assert (third.batch_size, third.gpu_freq_mhz) == (second.batch_size, second.gpu_freq_mhz)


def _rows(lut: LUT, n: int) -> LUT:
    return dataclasses.replace(
        lut,
        batch_sizes=lut.batch_sizes[:n],
        time_per_sample_s=lut.time_per_sample_s[:n],
        peak_power_w=lut.peak_power_w[:n],
        avg_power_w=lut.avg_power_w[:n],
        peak_sigma_w=lut.peak_sigma_w[:n],
    )


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (lambda lut: _rows(lut, 1).to_json(), "batch-sizes is (8,), expected (8, 16)"),
        (
            lambda lut: dataclasses.replace(_rows(lut, 2), device_kind="jetson-tx2-nx").to_json(),
            "device-kind is 'jetson-tx2-nx', expected 'jetson-nano'",
        ),
        (
            lambda lut: dataclasses.replace(_rows(lut, 2), model_name="resnet18").to_json(),
            "model-name is 'resnet18', expected 'cnn'",
        ),
        (lambda lut: _rows(lut, 2).to_json()[:-20], "not a valid LUT"),
    ],
    ids=["other-b", "other-device", "other-model", "truncated"],
)
def test_a_kind_lut_for_another_kind_is_ignored_and_the_node_profiles_its_own(
    tmp_path: Path, kind_lut: LUT, other: Any, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """B = 8, 16 here: the node's own profiling stays short."""
    with caplog.at_level(logging.WARNING, logger="fl_client.node"):
        report = _train(
            tmp_path, _node(2), batch_sizes=(8, 16), r=(1.0, 0.5), kind_lut=other(kind_lut)
        )
    assert named in caplog.text and "profiling this node's own" in caplog.text
    assert report.lut_shared == 0.0 and report.kind_verify_deviation is None
    assert report.kind_reprofiled is None and report.profile_time_s > 0
    luts = [LUT.load(p) for p in (tmp_path / "cache").rglob("lut_*.json")]
    assert [lut.grid for lut in luts] == ["efficient"]  # its own, for its cap
    assert KindKey.of_lut(luts[0]) == KindKey.of_lut(_rows(kind_lut, 2))
    # the same two rows of the right kind would have been taken
    right = _train(
        tmp_path / "right",
        _node(2),
        batch_sizes=(8, 16),
        r=(1.0, 0.5),
        kind_lut=_rows(kind_lut, 2).to_json(),
    )
    assert right.lut_shared == 1.0 and right.profile_time_s < report.profile_time_s


def test_baselines_ignore_a_kind_lut(tmp_path: Path, kind_lut: LUT) -> None:
    report = _train(tmp_path, _node(2), method="b1", kind_lut=kind_lut.to_json())
    assert report.lut_shared == 0.0 and report.profile_time_s == 0.0
    assert report.kind_verify_deviation is None


def test_a_kind_lut_with_no_cell_under_this_nodes_cap_gives_way_to_its_own(
    tmp_path: Path, kind_lut: LUT, caplog: pytest.LogCaptureFixture
) -> None:
    """What is left of a kind's LUT when most slices failed: only cells above this node's
    3 W less its margin. The board can run under 3 W (its own profiling finds where): the
    node must not fail the round. (B = 8, 16: its own profiling stays short.)"""
    two = _rows(kind_lut, 2)
    hot = two.peak_power_w >= 3.0 * (1 - MARGIN)
    assert hot.any() and (two.peak_power_w < 3.0 * (1 - MARGIN)).any()
    sparse = dataclasses.replace(
        two,
        time_per_sample_s=np.where(hot, two.time_per_sample_s, np.nan),
        peak_power_w=np.where(hot, two.peak_power_w, np.nan),
        avg_power_w=np.where(hot, two.avg_power_w, np.nan),
        peak_sigma_w=np.where(hot, two.peak_sigma_w, np.nan),
    )
    node = {**_node(2), "p-max-w": 3.0}
    with caplog.at_level(logging.WARNING, logger="fl_client.node"):
        report = _train(
            tmp_path, node, batch_sizes=(8, 16), r=(1.0, 0.5), kind_lut=sparse.to_json()
        )
    assert "kind-lut: p-max-w: no (batch size, GPU frequency) runs below" in caplog.text
    assert "profiling this node's own" in caplog.text
    assert report.lut_shared == 0.0 and report.profile_time_s > 0
    assert report.peak_power_w < 3.0 and report.train_time_s > 0
