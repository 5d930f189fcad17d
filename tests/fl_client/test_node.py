"""fl_client.node: the QUERY descriptor, settings parsed once, the full TRAIN config, and what
one node selects and runs under its cap less its cap margin.

Cap schedules and drift checks on the node are in ``test_schedule`` and ``test_drift``;
``NODE``, ``train_config`` and ``run_config`` here are shared with them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fl_client import selector
from fl_client.contract import Cap, NodeDescriptor, SettingsError, TrainConfig, TrainReport
from fl_client.feasibility import PEAK_SIGMA_K
from fl_client.lut import LUT
from fl_client.model_zoo import build_model
from fl_client.node import describe_node, node_context, train_node
from fl_client.selection import Selection
from fl_client.settings import RunSettings

NODE: dict[str, Any] = {
    "device": "jetson-nano",
    "backend": "simulated",
    "partition-id": 0,
    "num-partitions": 4,
}
#: The run's TRAIN config as the server builds it (lr-ref and b-ref: the app defaults).
TEMPLATE = TrainConfig(
    server_round=1,
    method="power-aware",
    model="cnn",
    batch_sizes=(8, 16, 32, 64),
    r=(0.4, 0.5, 0.7, 1.0),
    lr_ref=0.005,
    b_ref=128,
    local_epochs=1,
)
#: r that makes b = 64 the clear b* (B = 8…64 under 7 W or 4.5 W on the Nano twin), whatever
#: breaks near-ties of Eq. 4: the largest b's row is profiled from the lowest frequency up,
#: so it has cells below f*, and a tighter cap moves b = 64 down in frequency.
R_FOR_B64 = (1.0, 1.0, 1.0, 0.5)


def train_config(server_round: int = 1, **over: Any) -> dict[str, Any]:
    """The TRAIN ``ConfigRecord`` of ``server_round`` (``TrainConfig`` fields in ``over``)."""
    return dataclasses.replace(TEMPLATE, server_round=server_round, **over).to_config()


def run_config(tmp_path: Path, **over: Any) -> dict[str, Any]:
    """Run settings with the caches and records in ``tmp_path``."""
    return {"cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "runs"), **over}


def initial_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """The default CNN's weights from ``seed`` (whatever other tests did to torch's RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return dict(build_model("cnn").state_dict())


def _profiled_peak_w(cache: Path, report: TrainReport) -> tuple[LUT, float]:
    (path,) = (cache / "nodes").rglob("lut_*.json")
    lut = LUT.load(path)
    i = lut.batch_sizes.index(int(report.batch_size))
    j = lut.knob_values.index(report.gpu_freq_mhz)
    return lut, float(lut.peak_power_w[i, j])


# --------------------------------------------------------------------------- QUERY


def test_describe_node_is_the_query_reply(tmp_path: Path) -> None:
    query = {"model": "cnn", "batch-sizes": [8, 16, 32, 64, 128]}
    desc = describe_node(run_config(tmp_path), {**NODE, "p-max-w": "4.5"}, query)
    assert isinstance(desc, NodeDescriptor)
    assert (desc.device, desc.backend, desc.partition_id) == ("jetson-nano", "simulated", 0)
    assert desc.p_max == Cap(4.5) and desc.p_max_schedule == ""
    assert 921.6 in desc.knob_values and desc.memory_bytes > 0
    assert desc.max_batch_size in (8, 16, 32, 64, 128)
    assert NodeDescriptor.from_config(desc.to_config()) == desc
    scheduled = describe_node(run_config(tmp_path), {**NODE, "p-max-schedule": "1:7,3:none"}, query)
    assert scheduled.p_max == Cap(7.0) and scheduled.cap_at(3) == Cap.NONE
    assert describe_node(run_config(tmp_path), NODE, query).p_max == Cap.NONE
    # the lowest frequency worth profiling: B1's band for the node's lowest cap
    assert desc.profile_floor_mhz == 307.2
    assert scheduled.profile_floor_mhz == 614.4


@pytest.mark.parametrize("missing", ["model", "batch-sizes"])
def test_a_query_without_its_keys_is_refused_naming_them(tmp_path: Path, missing: str) -> None:
    query = {"model": "cnn", "batch-sizes": [8, 16]}
    del query[missing]
    with pytest.raises(SettingsError, match=f"{missing}: missing from the QUERY config"):
        describe_node(run_config(tmp_path), NODE, query)


# --------------------------------------------------------------------------- settings


def test_settings_are_parsed_once_per_content_of_the_configs(tmp_path: Path) -> None:
    run = run_config(tmp_path, **{"cap-margin": 0.1})
    node = {**NODE, "p-max-w": 5.0}
    ctx = node_context(run, node)
    assert node_context(dict(run), dict(node)) is ctx  # same content: the same parse
    assert ctx.node.p_max == Cap(5.0) and ctx.cap_margin == 0.1
    assert ctx.cache_dir == tmp_path / "cache" / "nodes" / "node-0"
    other = node_context({**run, "cap-margin": 0.2}, node)
    assert other is not ctx and other.cap_margin == 0.2
    assert node_context(run, {**node, "cap-margin": 0.0}).cap_margin == 0.0  # the node's own
    with pytest.raises(SettingsError, match=r"unknown key 'cap-margn' \(did you mean cap-margin"):
        node_context({**run, "cap-margn": 0.1}, node)


def test_the_selection_rule_is_two_run_settings_with_the_selectors_defaults(
    tmp_path: Path,
) -> None:
    defaults = RunSettings.from_config({})
    assert (defaults.peak_sigma_k, defaults.tie_tolerance) == (
        PEAK_SIGMA_K,
        selector.TIE_TOLERANCE,
    )
    ctx = node_context(run_config(tmp_path), NODE)
    assert ctx.objective == selector.Objective()
    ctx = node_context(run_config(tmp_path, **{"peak-sigma-k": 0, "tie-tolerance": "0.1"}), NODE)
    assert ctx.objective == selector.Objective(peak_sigma_k=0.0, tie_tolerance=0.1)
    for key, bad in (("peak-sigma-k", -1), ("peak-sigma-k", "inf"), ("tie-tolerance", 1.0),
                     ("tie-tolerance", "x"), ("peak-sigma-k", True)):  # fmt: skip
        with pytest.raises(SettingsError, match=key):
            RunSettings.from_config({key: bad})


def test_the_node_selects_with_the_luts_sigma_and_average_power_under_its_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    real = selector.select

    def spy(method: selector.Method, **kwargs: Any) -> Selection:
        seen.append({"method": method, **kwargs})
        return real(method, **kwargs)

    monkeypatch.setattr(selector, "select", spy)
    run = run_config(tmp_path, **{"peak-sigma-k": 1.5, "tie-tolerance": 0.05})
    _, report = train_node(run, {**NODE, "p-max-w": 5.0}, train_config(), initial_state())
    [kwargs] = seen
    assert kwargs["method"].objective == selector.Objective(peak_sigma_k=1.5, tie_tolerance=0.05)
    (path,) = (tmp_path / "cache" / "nodes").rglob("lut_*.json")
    lut = LUT.load(path)
    tables = kwargs["tables"]
    np.testing.assert_array_equal(tables.peak_sigma_w, lut.peak_sigma_w)
    np.testing.assert_array_equal(tables.avg_w, lut.avg_power_w)
    measured = ~np.isnan(lut.time_per_sample_s)
    assert (lut.peak_sigma_w[measured] > 0).all()  # the twin's sensor noise, 3 steps a cell
    # the choice's robust peak is below the cap less its margin
    i = lut.batch_sizes.index(int(report.batch_size))
    j = lut.knob_values.index(report.gpu_freq_mhz)
    assert lut.peak_power_w[i, j] + 1.5 * lut.peak_sigma_w[i, j] < 5.0 * 0.95


# --------------------------------------------------------------------------- TRAIN config


@pytest.mark.parametrize("missing", ["lr-ref", "b-ref", "r", "server-round"])
def test_train_needs_the_full_train_config_and_never_falls_back(
    tmp_path: Path, missing: str
) -> None:
    """lr-ref and b-ref are also run settings: the node no longer reads them from there."""
    cfg = train_config()
    del cfg[missing]
    with pytest.raises(SettingsError, match=f"{missing}: missing from the TRAIN config"):
        train_node(run_config(tmp_path), NODE, cfg, initial_state())


def test_train_refuses_keys_that_are_not_part_of_the_train_config(tmp_path: Path) -> None:
    cfg = {**train_config(), "cap-margin": 0.0}
    with pytest.raises(SettingsError, match="cap-margin: not part of the TRAIN config"):
        train_node(run_config(tmp_path), NODE, cfg, initial_state())


def test_train_returns_new_weights_and_a_report_that_survives_the_wire(tmp_path: Path) -> None:
    state = initial_state()
    new_state, report = train_node(
        run_config(tmp_path), {**NODE, "p-max-w": 5.0}, train_config(), state
    )
    assert set(new_state) == set(state)
    assert any(not torch.equal(new_state[k], state[k]) for k in state)  # it trained
    assert isinstance(report, TrainReport) and report.cap == Cap(5.0)
    assert report.p_max_w == 5.0 and report.cap_margin == 0.05  # the run setting's default
    assert report.peak_power_w < 5.0 and report.train_time_s > 0
    assert report.train_energy_j == pytest.approx(report.avg_power_w * report.train_time_s)
    assert report.profile_time_s > 0 and report.profile_energy_j > 0
    assert report.lut_from_cache == 0.0 and report.predicted_time_s is not None
    assert report.deadline_s is None and report.drift_deviation is None
    assert TrainReport.from_metrics(report.to_metrics()).to_record() == report.to_record()
    json.dumps(report.to_record(), allow_nan=False)
    # the next round re-selects from the cached LUT: no profiling, the same choice
    _, again = train_node(
        run_config(tmp_path), {**NODE, "p-max-w": 5.0}, train_config(2), new_state
    )
    assert again.lut_from_cache == 1.0 and again.profile_time_s == 0.0
    assert (again.batch_size, again.gpu_freq_mhz) == (report.batch_size, report.gpu_freq_mhz)


def test_an_uncapped_node_reports_no_cap_as_inf_on_the_wire_and_null_on_disk(
    tmp_path: Path,
) -> None:
    _, report = train_node(run_config(tmp_path), NODE, train_config(), initial_state())
    assert report.cap == Cap.NONE and math.isinf(report.p_max_w)
    assert report.to_metrics()["p-max-w"] == math.inf
    assert report.to_record()["p-max-w"] is None


def test_baselines_do_not_profile(tmp_path: Path) -> None:
    _, report = train_node(
        run_config(tmp_path), {**NODE, "p-max-w": 4.5}, train_config(method="b1"), initial_state()
    )
    assert report.batch_size == 64 and report.gpu_freq_mhz == pytest.approx(307.2)
    assert report.profile_time_s == 0.0 and report.predicted_time_s is None
    assert not list((tmp_path / "cache").rglob("lut_*.json"))
    fixed = train_config(method="fixed", fixed_batch_size=16, fixed_freq_mhz=460.8)
    _, small = train_node(run_config(tmp_path), NODE, fixed, initial_state())
    assert (small.batch_size, small.gpu_freq_mhz) == (16, 460.8)
    # the local work FedNova normalises by: one epoch's minibatches at lr-ref·sqrt(b/b-ref)
    for rep, b in ((report, 64), (small, 16)):
        assert rep.local_steps == math.ceil(rep.num_examples / b)
        assert rep.local_lr == pytest.approx(TEMPLATE.lr_ref * math.sqrt(b / TEMPLATE.b_ref))
        assert rep.to_metrics()["local-steps"] == rep.local_steps


# --------------------------------------------------------------------------- oracle r

#: r's settings small enough for a test: the digits to 0.3 within 640 samples per b.
ORACLE_R_SETTINGS = {
    "proxy-target-accuracy": 0.3,
    "r-max-samples": 640,
    "r-eval-every-samples": 64,
}


def test_the_oracles_r_is_keyed_by_the_checkpoints_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint changed after the oracle's r was cached (another sha256 in the TRAIN
    config) recomputes r; the same checkpoint reuses it; random weights have their own."""
    from fl_client import node

    calls: list[str] = []
    real = node.estimate_r

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0].weights_sha256)
        return real(*args, **kwargs)

    monkeypatch.setattr(node, "estimate_r", counted)
    ctx = node_context(run_config(tmp_path, **ORACLE_R_SETTINGS), NODE)
    data = ctx.local_data()
    base = dataclasses.replace(TEMPLATE, method="oracle", batch_sizes=(32, 64), r=(1.0, 1.0))
    first = dataclasses.replace(base, initial_weights_sha256="a" * 64)
    changed = dataclasses.replace(base, initial_weights_sha256="b" * 64)
    state = initial_state()

    r_first = node.oracle_r(ctx, first, state, data)
    assert node.oracle_r(ctx, first, state, data) == r_first  # the same checkpoint: cached
    assert calls == ["a" * 64]
    node.oracle_r(ctx, changed, state, data)  # the checkpoint changed: r is recomputed
    assert calls == ["a" * 64, "b" * 64]
    node.oracle_r(ctx, base, state, data)  # random weights: neither checkpoint's r
    assert calls == ["a" * 64, "b" * 64, ""]
    keys = {node.oracle_r_key(ctx, c, data) for c in (first, changed, base)}
    assert len(keys) == 3
    assert len(list(ctx.cache_dir.glob("oracle-r-cnn-*.json"))) == 3
    assert all(0.0 < x <= 1.0 for x in r_first) and max(r_first) == 1.0


def test_the_oracles_r_is_keyed_by_the_nodes_data_and_rs_settings(tmp_path: Path) -> None:
    from fl_client import node

    run = run_config(tmp_path, **ORACLE_R_SETTINGS)
    ctx = node_context(run, NODE)
    data = ctx.local_data()
    cfg = dataclasses.replace(TEMPLATE, method="oracle", initial_weights_sha256="a" * 64)
    key = node.oracle_r_key(ctx, cfg, data)
    assert node.oracle_r_key(node_context(dict(run), dict(NODE)), cfg, data) == key
    other_node = node_context(run, {**NODE, "partition-id": 1})
    assert node.oracle_r_key(other_node, cfg, other_node.local_data()) != key
    other_target = node_context({**run, "proxy-target-accuracy": 0.4}, NODE)
    assert node.oracle_r_key(other_target, cfg, data) != key
    other_seed = node_context({**run, "seed": 8}, NODE)
    assert node.oracle_r_key(other_seed, cfg, data) != key


# --------------------------------------------------------------------------- cap margin


def test_cap_margin_keeps_the_profiled_peak_of_the_choice_below_the_reduced_cap(
    tmp_path: Path,
) -> None:
    state = initial_state()
    runs = {}
    for margin in (0.0, 0.1):
        cache = tmp_path / f"cache-{margin}"
        run = {"cache-dir": str(cache), "output-dir": str(tmp_path / "runs"), "cap-margin": margin}
        _, m = train_node(run, {**NODE, "p-max-w": 4.0}, train_config(), state)
        lut, peak_w = _profiled_peak_w(cache, m)
        runs[margin] = (m, lut, peak_w)
    (m0, lut0, peak0_w), (m1, lut1, peak1_w) = runs[0.0], runs[0.1]
    assert m0.cap_margin == 0.0 and m1.cap_margin == 0.1
    assert m0.p_max_w == m1.p_max_w == 4.0  # the guard still watches P_max itself
    # the LUT holds the bare cap and the margin; efficient profiling walks up to the cap
    # less the margin, and the choice stays below it
    assert (lut0.limit.cap_w, lut0.limit.cap_margin) == (4.0, 0.0)
    assert (lut1.limit.cap_w, lut1.limit.cap_margin) == (4.0, 0.1)
    assert lut1.limit.limit_w == pytest.approx(3.6)
    assert peak1_w < 3.6
    # without the margin the same node picks a point whose profiled peak is in [3.6, 4) W
    assert 3.6 <= peak0_w < 4.0
    assert (m1.batch_size, m1.gpu_freq_mhz) != (m0.batch_size, m0.gpu_freq_mhz)


def test_a_nodes_own_cap_margin_wins_over_the_run_setting(tmp_path: Path) -> None:
    run = {"cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "r")}
    _, m = train_node(
        {**run, "cap-margin": 0.2},
        {**NODE, "p-max-w": 5.0, "cap-margin": "0.1"},
        train_config(),
        initial_state(),
    )
    assert m.cap_margin == 0.1
    lut, peak_w = _profiled_peak_w(tmp_path / "cache", m)
    assert (lut.limit.cap_w, lut.limit.cap_margin) == (5.0, 0.1)
    assert lut.limit.limit_w == pytest.approx(4.5) and peak_w < 4.5


def test_a_cap_met_only_without_the_margin_is_refused_naming_the_margin(tmp_path: Path) -> None:
    run = {"cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "r")}
    with pytest.raises(ValueError, match=r"less cap-margin 50% \(1\.500 W\).*lower cap-margin"):
        train_node(
            {**run, "cap-margin": 0.5}, {**NODE, "p-max-w": 3.0}, train_config(), initial_state()
        )
    _, m = train_node(
        {**run, "cap-margin": 0.0}, {**NODE, "p-max-w": 3.0}, train_config(), initial_state()
    )
    assert m.p_max_w == 3.0 and m.cap_margin == 0.0 and m.train_time_s > 0


def test_a_trained_round_checks_its_peak_against_the_lut_and_sets_a_wrong_one_aside(
    tmp_path: Path,
) -> None:
    """A well-formed LUT (valid checksum) whose peaks are 30% low: the round trained from it
    peaks far above what it promised, so its file is set aside and the next round profiles
    again; a right LUT passes the same check at no cost."""
    node, state = {**NODE, "p-max-w": 5.0}, initial_state()
    _, first = train_node(run_config(tmp_path), node, train_config(r=R_FOR_B64), state)
    assert first.lut_set_aside == 0.0 and first.lut_power_deviation is not None
    assert first.lut_power_deviation <= 0.15
    (path,) = (tmp_path / "cache" / "nodes").rglob("lut_*.json")
    good = LUT.load(path, require_checksum=True)
    dataclasses.replace(good, peak_power_w=good.peak_power_w * 0.7).save(path)
    _, second = train_node(run_config(tmp_path), node, train_config(2, r=R_FOR_B64), state)
    assert second.lut_from_cache == 1.0 and second.profile_time_s == 0.0  # trusted at first
    assert second.lut_power_deviation is not None and second.lut_power_deviation > 0.15
    assert second.lut_set_aside == 1.0
    assert not path.exists() and len(list(path.parent.glob(path.name + ".corrupt-*"))) == 1
    _, third = train_node(run_config(tmp_path), node, train_config(3, r=R_FOR_B64), state)
    assert third.lut_from_cache == 0.0 and third.profile_time_s > 0  # profiled again
    assert third.lut_set_aside == 0.0


# --------------------------------------------------------------------------- round plan


def test_the_round_plan_on_the_node_by_balance_mode(tmp_path: Path) -> None:
    node = {**NODE, "p-max-w": 7.0}
    state = initial_state()

    def run(rnd: int, balance: str, **cfg: Any) -> TrainReport:
        settings = run_config(tmp_path, balance=balance, **{"straggler-work": 0.5})
        return train_node(settings, node, train_config(rnd, **cfg), state)[1]

    # round 1, no deadline yet: the node's own Eq. 4 choice and its best round time
    first = run(1, "samples", r=R_FOR_B64)
    assert first.deadline_s is None and first.batch_size == 64
    best = first.fastest_time_s
    assert best is not None and 0 < best <= first.train_time_s * 1.05
    # the pace-setter: its fastest cell and straggler-work (half) of its local work
    pace = run(2, "samples", r=R_FOR_B64, deadline_s=best, critical=True)
    # half its samples in whole minibatches (2 of 64 of its 268), at its best cell
    assert pace.predicted_time_s == pytest.approx(best * 128 / 268)
    assert pace.train_time_s < 0.6 * best
    # the pace-setter with critical-r-weight = 1: its own Eq. 4 cell, not its fastest (an r
    # that makes b = 8 worth its slower steps)
    r_b8 = (0.05, 1.0, 1.0, 1.0)
    eq4 = run(1, "off", r=r_b8)
    weighted = train_node(
        run_config(tmp_path, balance="samples", **{"critical-r-weight": 1.0}),
        node,
        train_config(2, r=r_b8, deadline_s=best, critical=True),
        state,
    )[1]
    assert (weighted.batch_size, weighted.gpu_freq_mhz) == (eq4.batch_size, eq4.gpu_freq_mhz)
    assert weighted.batch_size == 8
    unweighted = run(2, "samples", r=r_b8, deadline_s=best, critical=True)
    assert unweighted.batch_size == pace.batch_size == 64
    # slack, samples: the least r_b (b = 8 with the template's r) that meets the deadline
    roomy = 50 * best
    samples = run(3, "samples", deadline_s=roomy)
    assert samples.batch_size == 8 and samples.deadline_miss == 0.0
    assert samples.slack_s == pytest.approx(roomy - samples.train_time_s)
    # slack, steps: its Eq. 4 cell with more local steps, still within the deadline
    steps = run(4, "steps", r=R_FOR_B64, deadline_s=3 * best)
    assert steps.batch_size == 64 and steps.train_time_s > 1.8 * first.train_time_s
    assert steps.deadline_miss == 0.0
    # slack, energy: a cell that meets the deadline, and what its LUT says it saves against
    # the node's fastest cell (idle waiting counted); the other modes predict no saving
    energy = run(5, "energy", deadline_s=roomy)
    assert energy.deadline_miss == 0.0
    # it keeps its own b* (the updates of off): only its frequency may change
    assert energy.batch_size == run(5, "off").batch_size
    assert energy.predicted_energy_saved_j is not None
    assert samples.predicted_energy_saved_j is None and steps.predicted_energy_saved_j is None
    # a deadline no cell meets: the fastest cell, reported as a miss
    late = run(6, "samples", r=R_FOR_B64, deadline_s=best / 10)
    assert late.deadline_miss == 1.0 and late.train_time_s <= first.train_time_s * 1.05


def test_a_power_limit_node_reports_its_limit_in_watts(tmp_path: Path) -> None:
    """A node whose device's knob is the GPU power limit (a replay table of power limits):
    the LUT's columns, the choice and the reply carry W under their own keys, and
    gpu-freq-mhz is the clock sampled during training (none on a replay table: NaN)."""
    rows = [
        f"{b},{w},{0.001 * b * (1.5 - w / 400):.5f},{w * 0.8 + b * 0.1:.2f},{w * 0.7:.2f}"
        for b in range(1, max(TEMPLATE.batch_sizes) + 1)  # an epoch's last batch is smaller
        for w in (100, 150, 200)
    ]
    table = tmp_path / "limits.csv"
    table.write_text(
        "# device: test-gpu\n# model: cnn\n# input_shape: 3x32x32\n# memory_bytes: 17179869184\n"
        "# knob: power_limit_w\n"
        "batch_size,power_limit_w,time_per_step_s,peak_power_w,avg_power_w\n"
        + "\n".join(rows)
        + "\n"
    )
    node = {**NODE, "device": "test-gpu", "backend": "replay", "replay-table": str(table),
            "knob": "power-limit", "p-max-w": 150.0}  # fmt: skip
    query = {"model": "cnn", "batch-sizes": list(TEMPLATE.batch_sizes)}
    desc = describe_node(run_config(tmp_path), node, query)  # the QUERY reply: W, not MHz
    assert (desc.knob, desc.knob_values) == ("power-limit", (100.0, 150.0, 200.0))
    assert desc.to_config()["gpu-power-limits-w"] == [100.0, 150.0, 200.0]
    _, report = train_node(run_config(tmp_path), node, train_config(), initial_state())
    assert report.gpu_power_limit_w in (100.0, 150.0)  # under 150 W less its 5% margin
    assert math.isnan(report.gpu_freq_mhz)  # no clock read, and never the W value
    metrics = report.to_metrics()
    assert metrics["gpu-power-limit-w"] == report.gpu_power_limit_w
    assert report.to_record()["gpu-freq-mhz"] is None
    assert TrainReport.from_metrics(metrics).gpu_power_limit_w == report.gpu_power_limit_w
    [lut_file] = (tmp_path / "cache").rglob("lut_*power-limit*.json")
    saved = json.loads(lut_file.read_text())
    assert saved["knob"] == "power-limit-w" and saved["power-limits-w"] == [100, 150, 200]
    assert "freqs-mhz" not in saved


def test_a_round_trains_where_profiling_measured_and_sends_cpu_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's model goes to ``task.compute_device()`` (the processor profiling's steps
    run on: CUDA on a GPU host; here a stand-in, ``cpu:0``), and the weights come back as
    CPU tensors either way."""
    from fl_client import task

    where = torch.device("cpu", 0)  # a device string no other code path uses
    placed: list[tuple[int, str]] = []
    trained: list[int] = []
    real_to, real_train = torch.nn.Module.to, task.train

    def spy_to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        placed.extend((id(self), str(a)) for a in args if isinstance(a, torch.device))
        return real_to(self, *args, **kwargs)

    def spy_train(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        trained.append(id(model))
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(task, "compute_device", lambda: where)
    monkeypatch.setattr(torch.nn.Module, "to", spy_to)
    monkeypatch.setattr(task, "train", spy_train)
    state, _ = train_node(run_config(tmp_path), NODE, train_config(), initial_state())
    assert len(trained) == 1 and (trained[0], "cpu:0") in placed
    assert all(t.device.type == "cpu" for t in state.values())


def test_a_node_on_its_own_forecast_is_on_time_not_late_by_rounding() -> None:
    from fl_client.balance import missed_deadline

    forecast_s = sum([0.1] * 10)  # 0.9999999999999999: the deadline, summed one way
    measured_s = 0.1 * 10  # 1.0: the same time, summed another way
    assert measured_s > forecast_s and not missed_deadline(measured_s, forecast_s)
    assert missed_deadline(forecast_s * 1.001, forecast_s)
    assert not missed_deadline(forecast_s * 0.5, forecast_s)
