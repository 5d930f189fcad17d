"""``powerfl devices | profile | select`` through the real ``powerfl`` entry point: the LUT
written and printed, replay tables, fake Jetson and fake NVML devices, errors naming keys."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_client import cell_measure, cli_tools, lut_text, model_zoo, profiler
from fl_client.contract import Cap
from fl_client.devices import jetson_sysfs, safety
from fl_client.devices.base import GPU_POWER_LIMIT_W
from fl_client.devices.cli import cmd_devices
from fl_client.devices.descriptors import load_device_spec
from fl_client.devices.replay import ReplayDevice
from fl_client.devices.sampler import PowerMeasurement
from fl_client.lut import LUT
from fl_client.power import PowerLimit
from fl_client.selection import Tables
from fl_client.selector import Method, Objective, select_eq4
from fl_client.settings import RunSettings
from simulations.cli import build_parser, main
from tests.fl_client.devices.conftest import FakeGpu, make_fake_pynvml
from tests.fl_client.devices.fakes_sysfs import build_tree

NANO_MHZ = [76.8 * k for k in range(1, 13)]
FAST = ["--warmup-steps", "0", "--steps", "1", "--quiet"]


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """GPU state files in tmp_path; no handler or registration outlives the test."""
    folder = tmp_path / "powerfl-state"
    monkeypatch.setenv(safety.STATE_DIR_ENV, str(folder))
    yield folder
    with safety._lock:
        safety._active.clear()
    safety.uninstall_handlers()


@pytest.fixture
def no_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells sized by the sensor's window and samples but not by settling nor by the step
    time's standard error: wall-clock step times on a busy test machine can keep a cell
    going up to its cap (both are tested on scripted traces in
    tests/fl_client/test_profiler.py and on the replayed H100 trace in
    tests/fl_client/devices/test_trace_replay.py). The fake sensors here read one constant
    power, which would be refused as a stuck sensor (tested on the replayed trace too)."""
    window = profiler.ProfileOptions.cell_window
    monkeypatch.setattr(
        profiler.ProfileOptions,
        "cell_window",
        lambda self, device: replace(
            window(self, device), settle_tolerance=math.inf, max_time_rse=math.inf
        ),
    )
    monkeypatch.setattr(cell_measure, "STUCK_MIN_S", math.inf)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_powerfl_has_the_device_commands() -> None:
    parser = build_parser()
    assert parser.parse_args(["devices"]).func is cmd_devices
    args = parser.parse_args(["profile", "--model", "cnn", "--batch-sizes", "4,8"])
    assert args.func is cli_tools.cmd_profile
    assert (args.p_max_w, args.backend, args.device) == ("none", "auto", "")
    args = parser.parse_args(["select", "--lut", "x.json", "--r", "1", "--p-max-w", "5"])
    assert args.func is cli_tools.cmd_select and args.method == "power-aware"
    # --cap-margin defaults to the run setting's default in both commands
    assert float(args.cap_margin) == RunSettings.from_config({}).cap_margin == 0.05
    args = parser.parse_args(["profile", "--model", "cnn", "--batch-sizes", "4", "--p-max-w", "5"])
    assert float(args.cap_margin) == cli_tools.DEFAULT_CAP_MARGIN == 0.05
    with pytest.raises(SystemExit):
        parser.parse_args(["profile", "--model", "cnn"])  # --batch-sizes is required
    assert cli_tools.MODEL_NAMES == model_zoo.MODEL_NAMES


@pytest.mark.parametrize("key", ["cap-margin", "peak-sigma-k", "tie-tolerance"])
def test_select_options_mirror_their_run_settings(key: str, capsys: pytest.CaptureFixture[str]):
    """``powerfl select``'s --cap-margin, --peak-sigma-k and --tie-tolerance take their help,
    default and check from the run setting's entry in the settings table."""
    from fl_client.settings_table import RUN

    setting = RUN[key]
    select = ["select", "--lut", "x.json", "--r", "1", "--p-max-w", "5"]
    args = build_parser().parse_args(select)
    assert cli_tools.setting_option(args, key) == setting.value
    args = build_parser().parse_args([*select, f"--{key}", "0.5"])
    assert cli_tools.setting_option(args, key) == setting.parse("0.5") == 0.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["select", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "".join(setting.plain_doc().split()) in help_text
    bad = build_parser().parse_args([*select, f"--{key}", "-1"])
    with pytest.raises(ValueError) as err:
        cli_tools.setting_option(bad, key)
    assert str(err.value) == f"{key}: expected {setting.check.allowed()}, got '-1'"


# ------------------------------------------------------------------------------ profile


def test_profile_on_the_twin_writes_and_prints_the_lut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    argv = ["profile", "--backend", "simulated", "--device", "jetson-nano", "--model", "cnn"]
    argv += ["--batch-sizes", "4,8", "--cache-dir", str(cache), *FAST]
    out_path, replay_path = tmp_path / "lut.json", tmp_path / "nano-cnn.csv"
    code, out, err = run([*argv, "--out", str(out_path), "--replay-out", str(replay_path)], capsys)
    assert code == 0, err
    lut = LUT.load(out_path)
    assert lut.device_kind == "jetson-nano" and lut.backend == "simulated"
    assert lut.batch_sizes == (4, 8) and lut.freqs_mhz == pytest.approx(NANO_MHZ)
    assert lut.grid == "full" and lut.limit.cap_w is None
    [cached] = list(cache.glob("lut_*.json"))
    assert LUT.load(cached).to_json() == lut.to_json()
    assert str(cached) in out and str(out_path) in out and "(profiled)" in out
    # the printed table: a header per frequency and the measured numbers
    assert "full grid, 24 cells" in out and "power rail: POM_5V_IN" in out
    assert re.search(r"b \\ MHz\s+76\.8\s+153\.6 .*921\.6", out)
    row8 = next(line for line in out.splitlines() if line.split()[:1] == ["8"])
    assert row8.split()[1:] == [f"{1e3 * x:.4g}" for x in lut.time_per_sample_s[1]]
    assert f"{lut.peak_power_w[0, -1]:.2f}" in out
    # how each cell was measured, and the window the real board would have needed (a report)
    assert "power samples per cell" in out and "measured window per cell (s)" in out
    assert "window the real board's power sensor would need per cell (s)" in out
    # one exact reading per step; a cell runs on until its mean step time's relative
    # standard error is ≤ 1% (the twin's steps are noisy), so at least 2 steps
    assert (lut.power_samples >= 2).all() and (lut.time_rse <= 0.01).all()
    assert (lut.needed_window_s >= 0.5).all()
    board_s = lut.board_profile_time_s
    assert board_s is not None and board_s > lut.profile_time_s
    assert f"profiling these cells would take about {board_s:.1f} s" in out
    assert f"simulated took {lut.profile_time_s:.1f} s, report only" in out
    assert "real board's power sensor: ina3221-sysfs: ≥ 0.5 s and ≥ 10 power samples" in out
    # the replay table holds the same cells, per step
    replay = ReplayDevice.from_file(replay_path)
    [table] = replay.tables
    assert len(table.rows) == 24 and table.power_rail == "POM_5V_IN"
    assert replay.info.memory_bytes == load_device_spec("jetson-nano").memory_bytes
    row = table.row(8, 921.6)
    assert row.time_per_step_s == pytest.approx(8 * lut.time_per_sample_s[1, -1], rel=1e-5)
    assert row.peak_power_w == pytest.approx(lut.peak_power_w[1, -1], rel=1e-5)
    # the second time the cache answers, with the same tables
    code, out, _ = run(argv, capsys)
    assert code == 0 and "(from the cache)" in out
    # ≥ 2 measured steps per cell (the step time's standard error needs them): σ recorded
    assert "σ of the per-step peak power (W" in out
    assert np.isfinite(lut.peak_sigma_w).all()
    # and `select` on the written LUT is Eq. 4 on its tables (with average power and σ)
    tables = Tables(lut.time_per_sample_s, lut.peak_power_w, lut.avg_power_w, lut.peak_sigma_w)
    select = ["select", "--lut", str(out_path), "--r", "1,0.6", "--p-max-w", "2.5"]
    code, out, _ = run([*select, "--cap-margin", "0", "--json"], capsys)
    expected = select_eq4(tables, [4, 8], lut.freqs_mhz, [1, 0.6], 2.5)
    assert code == 0
    rule = {"peak-sigma-k": 2.0, "tie-tolerance": 0.02}
    assert json.loads(out) == json.loads(
        json.dumps({**expected.to_dict(), "cap-margin": 0.0, **rule})
    )
    # the rule's settings on the command line
    code, out, _ = run(
        [*select, "--cap-margin", "0", "--json", "--peak-sigma-k", "0", "--tie-tolerance", "0"],
        capsys,
    )
    exact = Objective(peak_sigma_k=0.0, tie_tolerance=0.0)
    expected = select_eq4(
        tables, [4, 8], lut.freqs_mhz, [1, 0.6], 2.5, method=Method(objective=exact)
    )
    assert json.loads(out)["gpu-freq-mhz"] == expected.freq_mhz
    # Eq. 4 under the default cap margin: the cap less 5%
    code, out, _ = run(select, capsys)
    expected = select_eq4(tables, [4, 8], lut.freqs_mhz, [1, 0.6], PowerLimit(2.5, 0.05))
    assert code == 0 and out.startswith(
        f"power-aware: b* = {expected.batch_size}, f* = {expected.freq_mhz:g} MHz under P_max "
        "2.5 W less cap-margin 5% (2.375 W)"
    )


def test_profile_records_sigma_of_the_per_step_peaks_and_replays_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["profile", "--backend", "simulated", "--device", "jetson-nano", "--model", "cnn"]
    argv += ["--batch-sizes", "4", "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    argv += ["--warmup-steps", "0", "--steps", "2", "--out", str(tmp_path / "lut.json")]
    code, out, err = run([*argv, "--replay-out", str(tmp_path / "replay.json")], capsys)
    assert code == 0, err
    lut = LUT.load(tmp_path / "lut.json")
    assert (lut.peak_sigma_w > 0).all()  # the twin's sensor noise over 2 steps a cell
    assert "σ of the per-step peak power (W" in out
    [table] = ReplayDevice.from_file(tmp_path / "replay.json").tables
    row = table.row(4, 921.6)
    assert row.peak_power_sigma_w == pytest.approx(lut.peak_sigma_w[0, -1], rel=1e-5)


@pytest.mark.parametrize(
    ("margin", "below_w", "title"),
    [
        ("0", 3.0, "efficient mode for P_max 3 W,"),
        ("0.05", 2.85, "efficient mode for P_max 3 W less cap-margin 5% (2.85 W),"),
    ],
)
def test_profile_efficient_mode_marks_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], margin: str, below_w: float, title: str
) -> None:
    argv = ["profile", "--backend", "simulated", "--device", "jetson-nano", "--model", "cnn"]
    argv += ["--batch-sizes", "4,64", "--p-max-w", "3", "--cap-margin", margin]
    code, out, err = run([*argv, "--cache-dir", str(tmp_path), *FAST], capsys)
    assert code == 0, err
    assert title in out
    # cells of ≥ 2 steps (the step time's standard error needs them) record σ: judged by it
    assert f"* = peak + 2·σ not below P_max 3 W{title.split('P_max 3 W')[1].rstrip(',')}" in out
    peak_block = out.split("peak power (W)")[1].split("average power")[0]
    row64 = next(line for line in peak_block.splitlines() if line.split()[:1] == ["64"])
    cells = row64.split()[1:]
    # b=64 walks up from the lowest f and stops at the second cell in a row over the cap
    # less its margin
    assert cells[-1] == "-" and sum(c.endswith("*") for c in cells) == 2
    marked = [k for k, c in enumerate(cells) if c.endswith("*")]
    assert marked[1] == marked[0] + 1 and cells[marked[1] + 1] == "-"
    assert all(float(c.rstrip("*")) >= below_w for c in cells if c.endswith("*"))
    assert all(float(c) < below_w for c in cells if c != "-" and not c.endswith("*"))
    # the LUT holds the bare cap and the margin
    [cached] = list(tmp_path.glob("lut_*.json"))
    lut = LUT.load(cached)
    assert (lut.limit.cap_w, lut.limit.cap_margin) == (3.0, float(margin))


def test_a_nodes_own_cached_lut_serves_select_with_the_same_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node under P_max 5 W caches its LUT profiled less its 5% margin (the run setting's
    default); ``select --p-max-w 5`` (the same default margin) selects from it what the
    node chose."""
    from fl_client.node import train_node
    from tests.fl_client.test_node import NODE, initial_state, run_config, train_config

    _, report = train_node(
        run_config(tmp_path), {**NODE, "p-max-w": 5.0}, train_config(), initial_state()
    )
    (node_file,) = (tmp_path / "cache" / "nodes").rglob("lut_*pmax5.0w-margin0.05*.json")
    lut = LUT.load(node_file)
    assert (lut.limit.cap_w, lut.limit.cap_margin) == (5.0, 0.05) and report.cap_margin == 0.05
    r = ",".join(f"{x:g}" for x in train_config()["r"])
    argv = ["select", "--lut", str(node_file), "--r", r]
    code, out, err = run([*argv, "--p-max-w", "5", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert (data["batch-size"], data["gpu-freq-mhz"]) == (report.batch_size, report.gpu_freq_mhz)
    assert data["p-max-w"] == 5.0 and data["cap-margin"] == 0.05
    assert data["predicted-peak-power-w"] < 4.75
    code, out, err = run([*argv, "--p-max-w", "5"], capsys)
    assert code == 0, err
    assert out.startswith(
        f"power-aware: b* = {int(report.batch_size)}, f* = {report.gpu_freq_mhz:g} MHz under "
        "P_max 5 W less cap-margin 5% (4.75 W)"
    )
    # the reduced cap is not the cap: 4.75 W is refused, naming what fits
    code, _, err = run([*argv, "--p-max-w", "4.75"], capsys)
    assert code == 2 and "p-max-w: 4.75 W differs from the cap this LUT was profiled for" in err
    assert "(P_max 5 W less cap-margin 5% (4.75 W))" in err and "use --p-max-w 5," in err


def test_profile_on_a_fake_jetson_measures_the_board_rail_and_restores(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str], no_settling: None
) -> None:
    fake = build_tree(tmp_path / "root", "nano-jp4")
    argv = ["profile", "--backend", "jetson", "--sysfs-root", str(fake.root), "--model", "cnn"]
    argv += ["--batch-sizes", "4", "--sample-rate-hz", "200", "--cache-dir", str(tmp_path), *FAST]

    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    lut = LUT.from_json(out)
    assert lut.device_kind == "jetson-nano" and lut.backend == "jetson"  # detected
    assert lut.freqs_mhz == pytest.approx(NANO_MHZ)
    # POM_5V_IN reads 3149 mW on the fake board, whatever the frequency
    assert np.allclose(lut.peak_power_w, 3.149) and np.allclose(lut.avg_power_w, 3.149)
    # the board's INA3221 over sysfs: every cell measured for ≥ 0.5 s and ≥ 10 samples
    assert (lut.window_s >= 0.5).all() and (lut.power_samples >= 10).all()
    assert (lut.settled == 1).all() and np.isnan(lut.needed_window_s).all()  # a real board
    assert "written to" in err
    assert (fake.min_hz, fake.max_hz) == (76_800_000, 921_600_000)  # restored
    assert safety.leftover_states(state_dir) == []


def test_profile_without_write_permission_is_a_clear_error(
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    real_access = os.access
    monkeypatch.setattr(
        jetson_sysfs.os,
        "access",
        lambda p, mode: False if mode == os.W_OK else real_access(p, mode),
    )
    argv = ["profile", "--backend", "jetson", "--sysfs-root", str(fake.root), "--model", "cnn"]
    code, out, err = run([*argv, "--batch-sizes", "4", "--cache-dir", str(tmp_path), *FAST], capsys)
    assert code == 2
    assert err.startswith("powerfl profile: error: no write permission on ")
    assert "min_freq" in err and "SuperNode as root" in err and "udev" in err
    assert "Traceback" not in err + out
    assert (fake.min_hz, fake.max_hz) == (306_000_000, 1_020_000_000)
    assert safety.leftover_states(state_dir) == []


def test_profile_nvml_measure_only_compares_energy_counter_and_samples(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_settling: None,
) -> None:
    gpu = FakeGpu(instant_power_mw=123_456)  # instantaneous readings: 1 s per cell
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(gpu))
    monkeypatch.setattr("os.geteuid", lambda: 1000)  # not root: measure-only
    argv = ["profile", "--backend", "nvml", "--model", "cnn", "--batch-sizes", "4,8"]
    code, out, err = run([*argv, "--cache-dir", str(tmp_path), *FAST], capsys)
    assert code == 0, err
    assert "power rail: nvml:gpu-board" in out
    assert "power sensor: nvml-instant: ≥ 1 s and ≥ 10 power samples per cell" in out
    assert re.search(r"energy check: device counter \d+\.\d\d J, integrated sampled power "
                     r"\d+\.\d\d J, difference [+-]\d+\.\d\d%", out)  # fmt: skip
    [path] = list(tmp_path.glob("lut_*.json"))
    lut = LUT.load(path)
    assert lut.freqs_mhz == (1980.0,)  # the unlocked clock, labelled with its highest
    assert np.allclose(lut.peak_power_w, 123.456)
    assert (lut.window_s >= 1.0).all() and (lut.power_samples >= 10).all()
    assert not any(name == "nvmlDeviceSetGpuLockedClocks" for name, _ in gpu.calls)


def test_energy_check_sums_the_measurements_with_a_counter() -> None:
    ms = [
        PowerMeasurement(counter_energy_j=6.0, sampled_energy_j=6.5),
        PowerMeasurement(counter_energy_j=4.0, sampled_energy_j=4.0),
        PowerMeasurement(sampled_energy_j=100.0),  # no counter: not compared
    ]
    check = cli_tools.energy_check(ms)
    assert check == {
        "counter-energy-j": 10.0,
        "sampled-energy-j": 10.5,
        "difference-pct": pytest.approx(5.0),
    }
    assert cli_tools.energy_check([PowerMeasurement(sampled_energy_j=1.0)]) is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "vgg"], "model: unknown model 'vgg'; allowed: cnn, resnet18, mobilenetv2"),
        (["--batch-sizes", "8,4"], "batch-sizes: must be strictly ascending"),
        (["--batch-sizes", ""], "batch-sizes: must not be empty"),
        (["--p-max-w", "-1"], "p-max-w: must be > 0 W (or 'none' for no cap), got '-1'"),
        (["--p-max-w", "nan"], "p-max-w:"),
        (["--p-max-w", "lots"], "p-max-w: expected a number of watts > 0 or 'none'"),
        (["--p-max-w", "5", "--cap-margin", "1"], "cap-margin: expected a number in [0, 1)"),
        (["--p-max-w", "5", "--cap-margin", "x"], "cap-margin: expected a number in [0, 1)"),
        (["--steps", "0"], "steps: must be an integer ≥ 1"),
        (["--sample-rate-hz", "0"], "sample-rate-hz: expected a finite number > 0"),
        (["--sample-rate-hz", "inf"], "sample-rate-hz: expected a finite number > 0, got 'inf'"),
        (["--sample-rate-hz", "nan"], "sample-rate-hz: expected a finite number > 0, got 'nan'"),
        (["--power-source", "jtop", "--lock-clocks", "maybe"], "lock-clocks: expected true"),
        (["--replay-out", "x.txt"], "replay-out: must end in .csv or .json"),
        (["--knob", "volts"], "knob: unknown value 'volts'; allowed: frequency, power-limit"),
        (["--knob", "power-limit"], "knob: power-limit needs a GPU whose power limit can be set"),
        (
            ["--knob", "power-limit", "--power-limit-step-w", "0"],
            "power-limit-step-w: expected a finite number > 0",
        ),
        (["--device", "jetson-nanoo"], "jetson-nanoo"),
    ],
)
def test_profile_bad_input_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    opts = {"--backend": "simulated", "--device": "jetson-nano", "--model": "cnn"}
    opts |= {"--batch-sizes": "4", "--cache-dir": str(tmp_path), "--warmup-steps": "0"}
    opts |= {"--steps": "1"} | dict(zip(extra[::2], extra[1::2], strict=True))  # each once
    argv = ["profile", *(x for pair in opts.items() for x in pair), "--quiet"]
    code, out, err = run(argv, capsys)
    assert code == 2
    assert err.startswith("powerfl profile: error: ") and message in err
    assert "Traceback" not in err and out == ""


# ------------------------------------------------------------------------------ select


def small_lut(p_max_w: float | None = None, cap_margin: float = 0.0) -> LUT:
    time_s = np.array([[3e-3, 2e-3, 1.5e-3], [6e-4, 4e-4, 3e-4]])
    peak_w = np.array([[2.0, 2.5, 3.0], [3.5, 4.6, 5.5]])
    if p_max_w is not None:  # efficient mode: b=64 stopped at its first cell over the cap
        time_s[1, 2] = peak_w[1, 2] = math.nan
    return LUT(
        device_kind="jetson-nano",
        backend="simulated",
        model_name="cnn",
        input_shape=(3, 32, 32),
        batch_sizes=(4, 64),
        freqs_mhz=(307.2, 614.4, 921.6),
        time_per_sample_s=time_s,
        peak_power_w=peak_w,
        avg_power_w=peak_w * 0.9,
        limit=PowerLimit(p_max_w, cap_margin),  # type: ignore[arg-type]
    )


@pytest.fixture
def lut_file(tmp_path: Path) -> Path:
    return small_lut().save(tmp_path / "lut.json")


@pytest.mark.parametrize(
    ("r", "p_max_w", "margin", "b", "f_mhz"),
    [
        ("1,0.5", "5", "0", 64, 614.4),  # b=64 scores 0.4 ms × 0.5 < b=4's 1.5 ms × 1
        ("1,0.5", "4", "0", 64, 307.2),  # tighter cap: b=64 one level lower
        ("0.1,1", "5", "0", 4, 921.6),  # r favours b=4 strongly: 0.15 < 0.4
        ("1,1", "none", "0", 64, 921.6),  # no cap: every b at its top frequency
        ("1,0.5", "4.8", "0", 64, 614.4),  # 4.6 W is below 4.8 W ...
        ("1,0.5", "4.8", "0.05", 64, 307.2),  # ... not below 4.8 W less 5% (4.56 W)
        ("1,1", "none", "0.05", 64, 921.6),  # no cap: no margin either
    ],
)
def test_select_applies_eq4(
    lut_file: Path,
    capsys: pytest.CaptureFixture[str],
    r: str,
    p_max_w: str,
    margin: str,
    b: int,
    f_mhz: float,
) -> None:
    argv = ["select", "--lut", str(lut_file), "--r", r, "--p-max-w", p_max_w]
    argv += ["--cap-margin", margin]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    cap = Cap.parse(p_max_w)
    under = f"P_max {cap.label}"
    if cap.capped and float(margin) > 0:
        under += f" less cap-margin {100 * float(margin):g}%"
    assert out.startswith(f"power-aware: b* = {b}, f* = {f_mhz:g} MHz under {under}")
    chosen = [line for line in out.splitlines() if line.startswith("*")]
    assert len(chosen) == 1 and chosen[0].split()[1:3] == [str(b), f"{f_mhz:g}"]
    code, out, _ = run([*argv, "--json"], capsys)
    data = json.loads(out)
    assert (data["batch-size"], data["gpu-freq-mhz"]) == (b, f_mhz)
    assert len(data["candidates"]) == 2
    assert data["p-max-w"] == cap.to_record()
    assert data["cap-margin"] == (float(margin) if cap.capped else 0.0)


def test_select_infeasible_cap_names_the_lowest_power(
    lut_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        ["select", "--lut", str(lut_file), "--r", "1,1", "--p-max-w", "1.5"], capsys
    )
    assert code == 1 and out == ""
    assert "lowest measured peak power is 2.000 W (b=4, f=307.2 MHz)" in err
    # a cap met only without the margin is infeasible, naming the margin
    argv = ["select", "--lut", str(lut_file), "--r", "1,1", "--p-max-w", "2.05"]
    code, out, err = run(argv, capsys)
    assert code == 1 and out == "" and "less cap-margin 5%" in err
    code, _, _ = run([*argv, "--cap-margin", "0"], capsys)
    assert code == 0


def test_select_baselines(lut_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["select", "--lut", str(lut_file), "--r", "1,0.5", "--p-max-w", "4.5"]
    code, out, _ = run([*base, "--method", "b1"], capsys)  # the Nano's band for 4.5 W
    assert code == 0 and out.startswith("b1: b* = 64, f* = 307.2 MHz at the fixed frequency cap")
    code, out, _ = run([*base, "--method", "b1", "--b1-freq-cap-mhz", "614.4"], capsys)
    assert code == 0 and out.startswith("b1: b* = 64, f* = 614.4 MHz")
    code, out, _ = run(
        [*base, "--method", "fixed", "--fixed-batch-size", "4", "--fixed-freq-mhz", "921.6"],
        capsys,
    )
    assert code == 0 and out.startswith("fixed: b* = 4, f* = 921.6 MHz")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--r", "1", "--p-max-w", "5"], "r: has 1 values but batch-sizes has 2"),
        (["--r", "1,abc", "--p-max-w", "5"], "r: expected comma-separated numbers"),
        (["--r", "1,1.5", "--p-max-w", "5"], "r: value 1.5 for batch size 64 is not in (0, 1]"),
        (["--r", "1,1", "--p-max-w", "0"], "p-max-w: must be > 0 W (or 'none' for no cap)"),
        (["--r", "1,1", "--p-max-w", "5", "--cap-margin", "-0.1"], "cap-margin: expected a"),
        (
            ["--r", "1,1", "--p-max-w", "5", "--method", "fixed"],
            "fixed-batch-size: required by method 'fixed'",
        ),
        (["--r", "1,1", "--p-max-w", "5", "--peak-sigma-k", "-1"], "peak-sigma-k: expected"),
        (["--r", "1,1", "--p-max-w", "5", "--peak-sigma-k", "x"], "peak-sigma-k: expected"),
        (["--r", "1,1", "--p-max-w", "5", "--tie-tolerance", "1"], "tie-tolerance: expected"),
        (
            ["--r", "1,1", "--p-max-w", "5", "--method", "fixed", "--fixed-batch-size", "4",
             "--fixed-freq-mhz", "500"],
            "fixed-freq-mhz: 500.0 is not in the device's frequency table",
        ),
    ],
)  # fmt: skip
def test_select_bad_input_names_the_key(
    lut_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(["select", "--lut", str(lut_file), *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("powerfl select: error: ") and message in err


def test_select_judges_cells_by_peak_plus_k_sigma(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # σ of 0.3 W at b=64, 614.4 MHz: 4.6 + 2 × 0.3 = 5.2 W is not below 5 W
    sigma = np.array([[0.0, 0.0, 0.0], [0.0, 0.3, 0.0]])
    path = LUT(**{**vars(small_lut()), "peak_sigma_w": sigma}).save(tmp_path / "sigma.json")
    argv = ["select", "--lut", str(path), "--r", "1,0.5", "--p-max-w", "5", "--cap-margin", "0"]
    code, out, err = run(argv, capsys)
    assert code == 0 and out.startswith("power-aware: b* = 64, f* = 307.2 MHz"), err
    code, out, err = run([*argv, "--peak-sigma-k", "1"], capsys)  # 4.9 W: feasible
    assert code == 0 and out.startswith("power-aware: b* = 64, f* = 614.4 MHz"), err
    # the LUT printed: σ and the cells the rule refuses
    text = lut_text.format_lut(LUT.load(path), p_max_w=5.0)
    assert "* = peak + 2·σ not below P_max 5 W" in text
    peak_block = text.split("peak power (W)")[1].split("average power")[0]
    row64 = next(line for line in peak_block.splitlines() if line.split()[:1] == ["64"])
    assert row64.split()[1:] == ["3.50", "4.60*", "5.50*"]
    assert "σ of the per-step peak power (W" in text and "0.300" in text


def test_select_names_a_power_limit_knob_and_its_unit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A LUT whose columns are GPU power limits (NVML GPUs, Zeus traces) is selected from as
    any other; the choice and the tables say W, not MHz."""
    base = vars(small_lut())
    lut = LUT(**{**base, "freqs_mhz": (150.0, 200.0, 250.0), "knob": GPU_POWER_LIMIT_W})
    path = lut.save(tmp_path / "limits.json")
    argv = ["select", "--lut", str(path), "--r", "1,0.5", "--p-max-w", "5", "--cap-margin", "0"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert out.startswith("power-aware: b* = 64, power limit* = 200 W under P_max 5 W")
    assert "power limit W" in out.splitlines()[2]
    code, out, _ = run([*argv, "--json"], capsys)
    data = json.loads(out)
    assert (data["gpu-power-limit-w"], data["knob-unit"]) == (200.0, "W")
    assert "gpu-freq-mhz" not in data
    assert re.search(r"b \\ W\s+150\s+200\s+250", lut_text.format_lut(lut))


def test_select_bad_lut_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--r", "1,1", "--p-max-w", "5"]
    code, _, err = run(["select", "--lut", str(tmp_path / "missing.json"), *args], capsys)
    assert code == 2 and f"lut: {tmp_path / 'missing.json'}: no such file; give a LUT" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "powerfl-lut"')
    code, _, err = run(["select", "--lut", str(broken), *args], capsys)
    assert code == 2 and f"lut: {broken} is not a valid LUT file (not valid JSON" in err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "powerfl-lut"}))
    code, _, err = run(["select", "--lut", str(other), *args], capsys)
    assert code == 2 and "keys: missing" in err


def test_select_efficient_lut_only_under_its_own_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_lut(p_max_w=5.0).save(tmp_path / "eff.json")
    argv = ["select", "--lut", str(path), "--r", "1,0.5", "--cap-margin", "0"]
    code, _, err = run([*argv, "--p-max-w", "4"], capsys)
    assert code == 2
    assert "p-max-w: 4 W differs from the cap this LUT was profiled for" in err
    assert "--p-max-w 5," in err
    code, out, _ = run([*argv, "--p-max-w", "5"], capsys)
    assert code == 0 and out.startswith("power-aware: b* = 64, f* = 614.4 MHz")


def test_select_efficient_lut_only_under_its_own_cap_margin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_lut(p_max_w=5.0, cap_margin=0.05).save(tmp_path / "eff.json")
    argv = ["select", "--lut", str(path), "--r", "1,0.5"]
    code, out, err = run([*argv, "--p-max-w", "5"], capsys)  # the default margin: 0.05
    assert code == 0, err
    assert out.startswith("power-aware: b* = 64, f* = 614.4 MHz under P_max 5 W less cap-margin")
    code, _, err = run([*argv, "--p-max-w", "5", "--cap-margin", "0.1"], capsys)
    assert code == 2
    assert "cap-margin: 0.1 differs from the margin this LUT was profiled with" in err
    assert "use --cap-margin 0.05," in err
    # a LUT of the old format stored the cap less its margin, with margin 0: it says so
    old = small_lut(p_max_w=4.75).save(tmp_path / "v1.json")
    code, _, err = run(["select", "--lut", str(old), "--r", "1,0.5", "--p-max-w", "5"], capsys)
    assert code == 2 and "use --p-max-w 4.75 --cap-margin 0," in err
    argv = ["select", "--lut", str(old), "--r", "1,0.5", "--p-max-w", "4.75", "--cap-margin", "0"]
    code, _, err = run(argv, capsys)
    assert code == 0, err


def test_select_refuses_luts_that_cannot_answer_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nan = math.nan
    fields: dict[str, Any] = {
        "device_kind": "jetson-nano",
        "backend": "simulated",
        "model_name": "cnn",
        "input_shape": (3, 32, 32),
        "batch_sizes": (4, 64),
        "freqs_mhz": (307.2, 614.4, 921.6),
        "time_per_sample_s": np.array([[nan, nan, 1.5e-3], [nan, nan, 3e-4]]),
        "peak_power_w": np.array([[nan, nan, 3.0], [nan, nan, 5.5]]),
        "avg_power_w": np.array([[nan, nan, 2.7], [nan, nan, 5.0]]),
    }
    highest = LUT(**fields, grid="highest").save(tmp_path / "highest.json")
    argv = ["select", "--lut", str(highest), "--r", "1,0.5"]
    code, out, _ = run([*argv, "--p-max-w", "none"], capsys)
    assert code == 0 and out.startswith("power-aware: b* = 64, f* = 921.6 MHz under P_max none")
    code, _, err = run([*argv, "--p-max-w", "5"], capsys)
    assert code == 2 and "highest frequency only; use --p-max-w none" in err
    cells = LUT(**fields, grid="on-demand").save(tmp_path / "cells.json")
    code, _, err = run(["select", "--lut", str(cells), "--r", "1,0.5", "--p-max-w", "none"], capsys)
    assert code == 2 and "cells a node measured on demand" in err


def test_b1_without_bands_for_the_device_asks_for_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lut = small_lut()
    data = json.loads(lut.to_json())
    data["device-kind"] = "rtx-4090"
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    argv = ["select", "--lut", str(path), "--r", "1,1", "--p-max-w", "5", "--method", "b1"]
    code, _, err = run(argv, capsys)
    assert code == 2 and "b1-freq-cap-mhz: no B1 frequency bands known for 'rtx-4090'" in err
    code, _, err = run(["select", "--lut", str(path), "--r", "1,1", "--p-max-w", "1"], capsys)
    assert code == 1  # infeasible, not a crash


# ------------------------------------------------------------------------------ devices


def test_devices_command_is_reachable_from_powerfl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "jtop", None)
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    code, out, _ = run(["devices", "--sysfs-root", str(fake.root)], capsys)
    assert code == 0
    assert "jetson     yes" in out and "17000000.gpu" in out and "VDD_IN" in out
    (tmp_path / "s").mkdir()  # a state folder the user names must exist
    code, out, _ = run(["devices", "--restore", "--state-dir", str(tmp_path / "s")], capsys)
    assert code == 0 and "nothing to restore" in out


def test_profile_output_that_cannot_be_written_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["profile", "--backend", "simulated", "--device", "jetson-nano", "--model", "cnn"]
    argv += ["--batch-sizes", "4", "--cache-dir", str(tmp_path), *FAST]
    code, _, err = run([*argv, "--out", str(blocker / "lut.json")], capsys)
    assert code == 2 and err.startswith(
        f"powerfl profile: error: --out: {blocker} is a file, not a folder; give a folder"
    )
    assert "Traceback" not in err
    assert not list(tmp_path.rglob("*.json"))  # refused before profiling: no LUT cached
