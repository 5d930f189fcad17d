"""The replay backend: CSV/JSON tables, accounting from the table on an emulated clock, and
errors that name the file, row and key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from fl_client.devices import DeviceError, InvalidFrequencyError, Workload, locked
from fl_client.devices.base import GPU_FREQ_MHZ, GPU_POWER_LIMIT_W
from fl_client.devices.replay import (
    ReplayDevice,
    ReplayFormatError,
    load_replay_tables,
    save_replay_table,
)
from fl_client.feasibility import feasible_knob_indices
from fl_client.selection import InfeasibleCapError, Tables
from fl_client.selector import select
from fl_client.settings import REPO_ROOT

EXAMPLE = REPO_ROOT / "configs" / "replay" / "example-illustrative-jetson-nano-resnet18.csv"
RESNET = Workload("resnet18", (3, 32, 32), 1e9)

TABLE = {
    "device": "jetson-nano",
    "model": "resnet18",
    "input_shape": [3, 32, 32],
    "power_rail": "POM_5V_IN",
    "memory_bytes": 4_148_256_768,
    "source": "test",
    "rows": [
        {"batch_size": 32, "freq_mhz": 307.2, "time_per_step_s": 0.2, "peak_power_w": 4.5,
         "avg_power_w": 4.0},
        {"batch_size": 32, "freq_mhz": 921.6, "time_per_step_s": 0.1, "peak_power_w": 7.5,
         "avg_power_w": 6.0},
        {"batch_size": 64, "freq_mhz": 307.2, "time_per_sample_s": 0.005, "peak_power_w": 4.8,
         "avg_power_w": 4.4},
    ],
}  # fmt: skip


def write_json(tmp_path: Path, data: object, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_json_table_drives_accounting_on_an_emulated_clock(tmp_path: Path):
    dev = ReplayDevice.from_file(write_json(tmp_path, TABLE))
    assert dev.info.kind == "jetson-nano" and dev.info.backend == "replay"
    assert dev.knob_values == (307.2, 921.6)
    assert dev.info.power_rail == "POM_5V_IN"
    assert dev.current_knob_value() == 921.6  # unlocked: the highest frequency
    ran = []
    with dev.measure(RESNET) as meter:
        meter.step(32, lambda: ran.append(32))
        with locked(dev, 307.2):
            meter.step(32, lambda: ran.append(32))
            meter.step(64, lambda: ran.append(64))
    m = meter.measurement
    assert ran == [32, 32, 64]  # fn really runs
    assert m.steps == 3 and m.samples == 128
    assert m.time_s == pytest.approx(0.1 + 0.2 + 0.32)  # 64 × 0.005 s
    assert m.energy_j == pytest.approx(6.0 * 0.1 + 4.0 * 0.2 + 4.4 * 0.32)
    assert m.peak_power_w == 7.5
    assert m.power_samples_w == [7.5, 4.5, 4.8]
    assert dev.now_s() == pytest.approx(0.62)
    assert dev.current_knob_value() == 921.6  # restored


def test_csv_and_json_are_the_same_table(tmp_path: Path):
    [from_json] = load_replay_tables(write_json(tmp_path, TABLE))
    csv_path = save_replay_table(from_json, tmp_path / "t.csv")
    [from_csv] = load_replay_tables(csv_path)
    assert from_csv.rows == from_json.rows
    assert (from_csv.device, from_csv.model, from_csv.input_shape) == (
        "jetson-nano",
        "resnet18",
        (3, 32, 32),
    )
    assert from_csv.memory_bytes == 4_148_256_768
    [again] = load_replay_tables(save_replay_table(from_csv, tmp_path / "again.json"))
    assert again.rows == from_json.rows


def test_csv_with_group_columns_holds_several_tables(tmp_path: Path):
    path = tmp_path / "multi.csv"
    path.write_text(
        "# memory_bytes: 8000000000\n"
        "device,model,input_shape,batch_size,freq_mhz,time_per_step_s,peak_power_w,avg_power_w\n"
        "jetson-orin-nano,cnn,3x32x32,16,306,0.01,6,5\n"
        "jetson-orin-nano,resnet18,3x32x32,16,306,0.04,7,6\n"
        "jetson-orin-nano,resnet18,3x32x32,16,1020,0.02,11,9\n"
        "jetson-nano,cnn,,16,76.8,0.05,3,2.5\n"
    )
    tables = load_replay_tables(path)
    assert len(tables) == 3
    dev = ReplayDevice(tables, "jetson-orin-nano")
    assert dev.knob_values == (306.0, 1020.0)
    assert dev.table_for(RESNET).knob_values == (306.0, 1020.0)
    with pytest.raises(DeviceError, match="holds devices"):
        ReplayDevice(tables)
    with pytest.raises(DeviceError, match="no rows for 'jetson-tx2'"):
        ReplayDevice(tables, "jetson-tx2")


def test_missing_row_names_what_the_table_has(tmp_path: Path):
    dev = ReplayDevice.from_file(write_json(tmp_path, TABLE))
    dev.set_knob_value(921.6)
    with (
        dev.measure(RESNET) as meter,
        pytest.raises(
            DeviceError, match=r"no row for batch_size=64 at freq_mhz=921.6.*batch sizes \[32\]"
        ),
    ):
        meter.step(64, lambda: None)
    with pytest.raises(InvalidFrequencyError, match=r"allowed: 307\.2, 921\.6"):
        dev.set_knob_value(500.0)


def test_unknown_workload_is_an_error(tmp_path: Path):
    dev = ReplayDevice.from_file(write_json(tmp_path, TABLE))
    with pytest.raises(DeviceError, match=r"no table for model 'cnn'.*resnet18 3x32x32"):
        dev.table_for(Workload("cnn", (3, 32, 32), 1e6))
    with pytest.raises(DeviceError, match="input shape 1x28x28"):
        dev.table_for(Workload("resnet18", (1, 28, 28), 1e6))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t["rows"][0].pop("peak_power_w"), r"row #1: peak_power_w: missing"),
        (lambda t: t["rows"][1].update(avg_power_w=-1), r"row #2: avg_power_w: must be > 0"),
        (lambda t: t["rows"][0].update(batch_size=2.5), r"batch_size: must be an integer"),
        (lambda t: t["rows"][0].pop("time_per_step_s"), r"time_per_step_s or time_per_sample_s"),
        (lambda t: t["rows"][0].update(avg_power_w=9.0), r"avg_power_w 9.0 above peak"),
        (lambda t: t["rows"].append(dict(t["rows"][0])), r"two rows for batch_size=32"),
        (lambda t: t.pop("model"), r"model: missing"),
        (lambda t: t.update(rows=[]), r"no rows"),
        (lambda t: t.update(input_shape="3 by 32"), r"input_shape: expected"),
        (lambda t: t["rows"][0].update(freq_mhz="fast"), r"freq_mhz: not a number"),
    ],
)
def test_bad_tables_name_file_row_and_key(tmp_path: Path, mutate, message: str):
    data = json.loads(json.dumps(TABLE))
    mutate(data)
    with pytest.raises(ReplayFormatError, match=message):
        load_replay_tables(write_json(tmp_path, data))


def test_bad_files(tmp_path: Path):
    with pytest.raises(ReplayFormatError, match="file not found"):
        load_replay_tables(tmp_path / "nope.csv")
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ReplayFormatError, match=r"\.json or \.csv"):
        load_replay_tables(tmp_path / "t.txt")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ReplayFormatError, match="not valid JSON"):
        load_replay_tables(tmp_path / "bad.json")


def test_memory_is_required_without_a_twin(tmp_path: Path):
    data = {**TABLE, "device": "my-board", "memory_bytes": None}
    with pytest.raises(DeviceError, match="memory_bytes: missing for 'my-board'"):
        ReplayDevice.from_file(write_json(tmp_path, data))


def test_example_table_loads_and_keeps_its_stated_calibration():
    dev = ReplayDevice.from_file(EXAMPLE, "jetson-nano")
    table = dev.table_for(RESNET)
    assert dev.knob_values == tuple(round(76.8 * k, 1) for k in range(1, 13))
    assert table.batch_sizes == (4, 8, 16, 32, 64, 128)
    assert "NOT MEASURED" in table.source

    def highest_feasible(b: int, p_max_w: float) -> float:
        return max(f for f in dev.knob_values if table.row(b, f).peak_power_w < p_max_w)

    assert highest_feasible(128, 5.0) == 307.2
    assert highest_feasible(64, 5.0) == 460.8
    t128 = table.row(128, 307.2).time_per_sample_s
    t64 = table.row(64, 460.8).time_per_sample_s
    assert 1 - t64 / t128 == pytest.approx(0.319, abs=0.005)
    assert highest_feasible(8, 5.0) > highest_feasible(32, 5.0)


# --------------------------------------------------------------------------- knob and σ (issue 13)

POWER_LIMIT_EXAMPLE = REPO_ROOT / "configs" / "replay" / "example-illustrative-gpu-power-limit.csv"


def test_a_power_limit_table_names_its_knob_and_unit():
    [table] = load_replay_tables(POWER_LIMIT_EXAMPLE)
    assert table.knob is GPU_POWER_LIMIT_W
    assert (table.knob.key, table.knob.unit) == ("power_limit_w", "W")
    assert table.knob_values == (100.0, 125.0, 150.0, 175.0, 200.0, 225.0, 250.0)
    assert table.row(64, 125.0).peak_power_sigma_w == 0.5
    dev = ReplayDevice([table])
    assert dev.knob is GPU_POWER_LIMIT_W and dev.knob_values[0] == 100.0
    described = dev.describe()
    assert described["knob-unit"] == "W" and described["power-limits-w"] == list(dev.knob_values)
    assert "gpu-freqs-mhz" not in described and "cur-freq-mhz" not in described
    with pytest.raises(InvalidFrequencyError, match=r"gpu-power-limit-w: 110 W is not in"):
        dev.set_knob_value(110.0)
    with dev.measure(RESNET) as meter, locked(dev, 150.0):
        assert dev.current_knob_value() == 150.0  # the limit set, in W
        meter.step(64, lambda: None)
    assert dev.current_knob_value() == dev.knob_values[-1] == 250.0  # restored: the highest
    assert meter.measurement.time_s == pytest.approx(0.13332)
    with pytest.raises(DeviceError, match=r"at power_limit_w=150.*GPU power limit values 100"):
        table.row(48, 150.0)


def test_the_selector_reads_a_power_limit_table_whose_lowest_limit_does_not_bind():
    # The 100 W limit does not bind: those cells read above the 125 W cells and above a
    # 133 W cap. The old running-maximum rule refuses every row; each cell on its own
    # leaves the 125 W cells (131.6 W + 2 × 0.5 W σ < 133 W).
    [table] = load_replay_tables(POWER_LIMIT_EXAMPLE)
    grid = table.grid()
    assert grid.knob is GPU_POWER_LIMIT_W and grid.batch_sizes == (16, 32, 64, 128)
    assert feasible_knob_indices(grid.peak_power_w, 133.0) == [None] * 4
    tables = Tables(
        grid.time_per_sample_s, grid.peak_power_w, grid.avg_power_w, grid.peak_power_sigma_w,
        grid.knob,
    )  # fmt: skip
    sel = select(
        "power-aware",
        batch_sizes=list(grid.batch_sizes),
        knob_values=list(grid.knob_values),
        tables=tables,
        r=[1.0, 0.9, 0.8, 0.75],
        limit=133.0,
    )
    assert sel.knob_value == 125.0 and sel.knob is GPU_POWER_LIMIT_W
    assert sel.to_dict()["gpu-power-limit-w"] == 125.0 and sel.to_dict()["knob-unit"] == "W"
    with pytest.raises(InfeasibleCapError, match=r"no \(batch size, GPU power limit\).*125 W"):
        select(
            "power-aware",
            batch_sizes=list(grid.batch_sizes),
            knob_values=list(grid.knob_values),
            tables=tables,
            r=[1.0] * 4,
            limit=132.0,
        )


def test_knob_and_sigma_survive_csv_and_json(tmp_path: Path):
    [table] = load_replay_tables(POWER_LIMIT_EXAMPLE)
    [again] = load_replay_tables(save_replay_table(table, tmp_path / "t.json"))
    assert again.knob is GPU_POWER_LIMIT_W and again.rows == table.rows
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["format"] == "powerfl-replay/2" and data["knob"] == "power_limit_w"
    assert "power_limit_w" in data["rows"][0] and "freq_mhz" not in data["rows"][0]
    [from_csv] = load_replay_tables(save_replay_table(again, tmp_path / "t.csv"))
    assert from_csv.rows == table.rows and from_csv.knob is GPU_POWER_LIMIT_W
    header = next(
        line for line in (tmp_path / "t.csv").read_text().splitlines() if not line.startswith("#")
    )
    assert header.split(",")[:2] == ["batch_size", "power_limit_w"]
    assert header.endswith(",peak_power_sigma_w")


def test_old_frequency_tables_still_load_and_round_trip(tmp_path: Path):
    old = {**TABLE, "format": "powerfl-replay/1"}
    [table] = load_replay_tables(write_json(tmp_path, old))
    assert table.knob is GPU_FREQ_MHZ and all(r.peak_power_sigma_w is None for r in table.rows)
    csv_path = save_replay_table(table, tmp_path / "t.csv")
    assert "peak_power_sigma_w" not in csv_path.read_text()  # no σ column without σ
    assert load_replay_tables(csv_path)[0].rows == table.rows
    grid = table.grid([32, 64, 128])
    assert grid.knob is GPU_FREQ_MHZ and grid.knob_values == (307.2, 921.6)
    assert np.isnan(grid.time_per_sample_s[2]).all()  # b=128 is not in the table
    assert np.isnan(grid.peak_power_sigma_w).all()
    assert grid.time_per_sample_s[1, 0] == pytest.approx(0.005)


def test_a_sigma_column_with_gaps(tmp_path: Path):
    path = tmp_path / "s.csv"
    path.write_text(
        "# device: jetson-nano\n# model: resnet18\n"
        "batch_size,freq_mhz,time_per_step_s,peak_power_w,avg_power_w,peak_power_sigma_w\n"
        "32,307.2,0.2,4.5,4.0,0\n"
        "32,921.6,0.1,7.5,6.0,\n"
    )
    [table] = load_replay_tables(path)
    assert [r.peak_power_sigma_w for r in table.rows] == [0.0, None]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.update(knob="voltage_mv"), r"knob: unknown value 'voltage_mv'"),
        (lambda t: t.update(knob="power_limit_w"), r"knob: power_limit_w is named but the rows"),
        (lambda t: t["rows"][0].update(power_limit_w=150), r"freq_mhz and power_limit_w; a table"),
        (lambda t: t.update(format="powerfl-replay/9"), r"format: 'powerfl-replay/9' is not one"),
        (
            lambda t: t["rows"][0].update(peak_power_sigma_w=-0.1),
            r"peak_power_sigma_w: must be ≥ 0",
        ),
        (
            lambda t: t["rows"][0].update(peak_power_sigma_w="x"),
            r"peak_power_sigma_w: not a number",
        ),
    ],
)
def test_bad_knob_and_sigma_name_the_key(tmp_path: Path, mutate, message: str):
    data = json.loads(json.dumps(TABLE))
    mutate(data)
    with pytest.raises(ReplayFormatError, match=message):
        load_replay_tables(write_json(tmp_path, data))


def test_a_device_has_one_knob(tmp_path: Path):
    [freq] = load_replay_tables(write_json(tmp_path, TABLE))
    [limit] = load_replay_tables(POWER_LIMIT_EXAMPLE)
    mixed = dataclasses.replace(limit, device="jetson-nano")
    with pytest.raises(DeviceError, match=r"mix knobs \(freq_mhz, power_limit_w\)"):
        ReplayDevice([freq, mixed], "jetson-nano")
