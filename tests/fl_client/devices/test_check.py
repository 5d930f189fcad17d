"""``powerfl devices --check`` on the emulated backends: the twin and a replay table have no
sensor, so the check reports their figures for the load, runs no step on the host and says
what it cannot tell. (The sensor check on recorded hardware readings is in
``test_trace_replay``.)"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from fl_client.devices import DeviceOptions, Workload, open_device
from fl_client.devices.check import EMULATED_MAX_STEPS, check_emulated, is_emulated
from fl_client.devices.cli import add_devices_parser
from fl_client.devices.replay import load_replay_tables

#: ResNet18 on 32x32 inputs: the workload of the shipped replay table.
WORKLOAD = Workload("resnet18", (3, 32, 32), 1.1e9)
REPLAY_TABLE = (
    Path(__file__).resolve().parents[3]
    / "configs"
    / "replay"
    / "example-illustrative-jetson-nano-resnet18.csv"
)


class CountingLoad:
    """The check's load; counts the host steps it was asked to run."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, model: str, batch_size: int):
        def step() -> None:
            self.steps += 1
            time.sleep(0.05)  # a host step: the check must not time it

        return WORKLOAD, step


def run_check(argv: list[str], capsys) -> tuple[int, str, str, int, float]:
    load = CountingLoad()
    parser = argparse.ArgumentParser()
    add_devices_parser(parser.add_subparsers(), check_load=load)
    args = parser.parse_args(["devices", "--check", *argv])
    t0 = time.monotonic()
    code = args.func(args)
    took_s = time.monotonic() - t0
    captured = capsys.readouterr()
    return code, captured.out, captured.err, load.steps, took_s


def test_check_on_the_twin_reports_the_model_and_no_sensor(capsys):
    argv = ["--backend", "simulated", "--kind", "jetson-nano", "--json"]
    code, out, err, host_steps, took_s = run_check(argv, capsys)
    assert code == 0, err
    assert host_steps == 0 and took_s < 5.0  # the host's step time is not the device's
    report = json.loads(out)
    assert report["backend"] == "simulated" and report["sensor"] is None
    assert "update-period-s" not in report  # a twin has no sensor to time
    assert report["can-enforce-cap"] is None and "not judged" in report["cap"]
    assert "power model" in report["source"] and "no sensor" in report["readings"]
    assert report["board-sensor"].startswith("ina3221")  # the real board's, to check there
    # the model's own figures for b=128 at the highest frequency
    dev = open_device("jetson-nano", "simulated")
    assert report["knob"] == f"GPU frequency {dev.knob_values[-1]:g} MHz"
    assert report["window-s"] >= 5.0
    assert report["step-time-s"] == pytest.approx(report["window-s"] / report["steps"])
    assert 0 < report["avg-power-w"] <= report["peak-power-w"]
    code, text, _, _, _ = run_check(["--backend", "simulated", "--kind", "jetson-nano"], capsys)
    assert code == 0 and "none run on the host" in text
    assert "update period" not in text and "can enforce a cap not judged" in text


def test_check_on_a_replay_table_reports_its_cells_without_a_stuck_sensor(capsys):
    argv = ["--backend", "replay", "--replay-table", str(REPLAY_TABLE), "--json"]
    code, out, err, host_steps, took_s = run_check(argv, capsys)
    assert code == 0, err  # a table's constant cell is not a stuck sensor
    assert "stuck" not in err and host_steps == 0 and took_s < 5.0
    report = json.loads(out)
    assert report["backend"] == "replay" and report["sensor"] is None
    assert report["can-enforce-cap"] is None and "no cap enforcement" in report["cap"]
    assert "table's cell" in report["readings"]
    (table,) = load_replay_tables(REPLAY_TABLE)
    row = table.row(128, table.knob_values[-1])
    assert f"{len(table.rows)} cells" in report["source"]
    assert report["step-time-s"] == pytest.approx(row.time_per_step_s)
    assert report["avg-power-w"] == pytest.approx(row.avg_power_w)
    assert report["peak-power-w"] == pytest.approx(row.peak_power_w)


def test_a_batch_size_the_table_lacks_is_named(capsys):
    argv = ["--backend", "replay", "--replay-table", str(REPLAY_TABLE)]
    code, _, err, host_steps, _ = run_check([*argv, "--check-batch-size", "3"], capsys)
    assert code == 1 and "batch_size=3" in err and host_steps == 0


def test_check_emulated_stops_after_its_most_steps():
    dev = open_device("", "replay", options=DeviceOptions(replay_table=str(REPLAY_TABLE)))
    assert is_emulated(dev)
    result = check_emulated(dev, WORKLOAD, 4, seconds=1e6)
    assert result.steps == EMULATED_MAX_STEPS
    with pytest.raises(ValueError, match="seconds"):
        check_emulated(dev, WORKLOAD, 4, seconds=float("nan"))
