"""fl_client.lut and its format (fl_client.lut_format): strict JSON, v1 files, the cap read
into one PowerLimit, the cache key and files, how each cell was measured."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_client.devices.base import GPU_FREQ_MHZ, GPU_POWER_LIMIT_W, Workload
from fl_client.lut import LUT, LUTKey, load_cached, lut_checksum, save_quietly
from fl_client.lut_cells import merge_cells
from fl_client.lut_format import CELL_TABLES, LUT_VERSION, LUTFormatError
from fl_client.power import PowerLimit
from fl_client.profiler import ProfileOptions, load_or_profile, profile
from fl_client.selection import Tables
from fl_client.selector import select_eq4
from tests.fl_client.test_profiler import (
    B6,
    NANO_FREQS_MHZ,
    WORKLOAD,
    CountingSteps,
    FakeDevice,
)


def _options(p_max_w: Any = None, cap_margin: float = 0.0, **kw: Any) -> ProfileOptions:
    """Profiling options from the flat keywords the CLI and run settings give."""
    return ProfileOptions(PowerLimit(p_max_w, cap_margin), **kw)


def _profiled(p_max_w: float | None = None, **kw: Any) -> LUT:
    return profile(
        FakeDevice(), WORKLOAD, B6, CountingSteps(), _options(p_max_w, progress=False, **kw)
    )


FREQS = (100.0, 200.0, 300.0, 400.0)


def _row_lut(
    time_row: list[float],
    peak_row: list[float],
    avg_row: list[float],
    cap: float | None = None,
    grid: str = "",
    cap_margin: float = 0.0,
) -> LUT:
    """A one-row LUT (b = 16) over FREQS."""
    return LUT(
        device_kind="jetson-nano",
        backend="simulated",
        model_name="cnn",
        input_shape=(1, 8, 8),
        batch_sizes=(16,),
        knob_values=FREQS,
        time_per_sample_s=np.array([time_row], dtype=float),
        peak_power_w=np.array([peak_row], dtype=float),
        avg_power_w=np.array([avg_row], dtype=float),
        limit=PowerLimit.of(cap) if not cap_margin else PowerLimit(cap, cap_margin),  # type: ignore[arg-type]
        grid=grid,
    )


def _lut_fields(lut: LUT) -> dict[str, Any]:
    names = ("device_kind", "backend", "model_name", "input_shape", "batch_sizes", "knob_values")
    tables = ("time_per_sample_s", "peak_power_w", "avg_power_w", "limit", "grid")
    return {name: getattr(lut, name) for name in names + tables}


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize(("p_max_w", "margin"), [(3.5, 0.0), (3.5, 0.05), (None, 0.0)])
def test_json_round_trip_keeps_nan_cells_and_metadata(p_max_w: float | None, margin: float) -> None:
    lut = _profiled(p_max_w, cap_margin=margin)
    text = lut.to_json()
    rec = json.loads(text)
    assert "NaN" not in text and "Infinity" not in text
    assert rec["p-max-w"] == p_max_w and rec["cap-margin"] == margin
    assert rec["version"] == LUT_VERSION == 3 and "knob" not in rec  # σ recorded: version 3
    back = LUT.from_json(text)
    for name in ("time_per_sample_s", "peak_power_w", "avg_power_w", "peak_sigma_w"):
        np.testing.assert_array_equal(getattr(back, name), getattr(lut, name))
    for name in (
        "device_kind",
        "backend",
        "model_name",
        "input_shape",
        "batch_sizes",
        "knob_values",
        "limit",
        "profile_time_s",
        "profile_energy_j",
        "created_utc",
        "warmup_steps",
        "steps",
        "grid",
        "knob",
    ):
        assert getattr(back, name) == getattr(lut, name), name
    assert not back.time_per_sample_s.flags.writeable
    assert back.key == lut.key


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("steps"), "missing"),
        (lambda r: r.update(extra=1), "unknown"),
        (lambda r: r.update({"peak-power-w": r["peak-power-w"][:-1]}), "shape"),
        (lambda r: r.update({"freqs-mhz": r["freqs-mhz"][:-1]}), "shape"),
        (lambda r: r.update({"workload-key": "resnet18-3x32x32"}), "workload-key"),
        (lambda r: r.update({"version": 99}), "format"),
        (lambda r: r.update({"format": "other-lut"}), "format"),
        (lambda r: r.update({"batch-sizes": [4, 8, 16, 32, 128, 64]}), "ascending"),
        (
            lambda r: r.update({"p-max-w": None, "cap-margin": 0}),
            "efficient-mode LUT needs the cap",
        ),
        (lambda r: r.update({"p-max-w": None, "cap-margin": 0, "grid": "full"}), "full-grid"),
        (lambda r: (r.update({"p-max-w": None, "cap-margin": 0}), r.pop("grid")), "full-grid"),
        (lambda r: r.update({"grid": "highest"}), "without a cap"),
        (lambda r: r.update({"grid": "diagonal"}), "grid: unknown value"),
        (lambda r: r.update({"p-max-w": -1}), "p-max-w"),
        (lambda r: r.update({"cap-margin": 1.0}), "cap-margin: must be in"),
        (lambda r: r.update({"cap-margin": -0.05}), "cap-margin: must be in"),
        (lambda r: r.update({"cap-margin": "0.05"}), "cap-margin: wrong type"),
        (lambda r: r.update({"steps": True}), "steps: wrong type"),
        (lambda r: r.update({"batch-sizes": "4,8"}), "batch-sizes"),
        (lambda r: r["time-per-sample-s"][0].__setitem__(0, "x"), "numbers or null"),
        (lambda r: r["avg-power-w"][-1].__setitem__(0, None), "different cells"),
        (lambda r: r.update({"peak-sigma-w": r["peak-sigma-w"][:-1]}), "peak-sigma-w: shape"),
        (lambda r: r["peak-sigma-w"][-1].__setitem__(0, -0.1), "peak-sigma-w: measured cells"),
        (lambda r: r["peak-sigma-w"][-1].__setitem__(-1, 0.1), "not profiled"),
        (lambda r: r.update({"peak-sigma-w": "0.1"}), "peak-sigma-w: wrong type"),
        (lambda r: r.update({"knob": "voltage"}), "knob: unknown value"),
        (
            lambda r: r.update({"version": 2}),
            r"\['peak-sigma-w', 'power-samples', 'settled', 'time-rse', 'window-s'\] are not keys "
            "of a version 2",
        ),
    ],
)
def test_from_json_is_strict(edit: Callable[[dict[str, Any]], object], message: str) -> None:
    rec = json.loads(_profiled(3.5, cap_margin=0.05).to_json())
    edit(rec)
    with pytest.raises(LUTFormatError, match=message):
        LUT.from_json(json.dumps(rec))


def test_from_json_rejects_non_json() -> None:
    with pytest.raises(LUTFormatError, match="not valid JSON"):
        LUT.from_json("{not json")
    with pytest.raises(LUTFormatError, match="one JSON object"):
        LUT.from_json("[]")


def _drop_cell_tables(rec: dict[str, Any]) -> None:
    """Take out the per-cell tables of how cells were measured (new in version 3)."""
    for key in CELL_TABLES.values():
        rec.pop(key, None)


def test_a_version_1_file_reads_as_its_cap_with_margin_0() -> None:
    """Version 1 stored the cap less its margin as ``p-max-w`` and had no ``cap-margin``."""
    rec = json.loads(_profiled(4.75).to_json())
    rec["version"] = 1
    del rec["cap-margin"], rec["peak-sigma-w"]
    _drop_cell_tables(rec)
    old = LUT.from_json(json.dumps(rec))
    assert (old.limit.cap_w, old.limit.cap_margin, old.grid) == (4.75, 0.0, "efficient")
    assert old.limit.limit_w == 4.75
    # written again, it is a version 2 file saying the same
    again = json.loads(old.to_json())
    assert again["version"] == 2 and again["cap-margin"] == 0.0 and again["p-max-w"] == 4.75
    # files without a grid key (older still) read as full without a cap
    rec = json.loads(_profiled().to_json())
    rec["version"] = 1
    del rec["cap-margin"], rec["grid"], rec["peak-sigma-w"]
    _drop_cell_tables(rec)
    assert LUT.from_json(json.dumps(rec)).grid == "full"


def test_a_version_2_file_reads_with_sigma_not_recorded_and_is_written_as_before() -> None:
    """Version 2 had no σ and no knob: σ reads as not recorded (NaN, 0 for the selector),
    the knob as the GPU frequency, and the LUT is written again byte for byte."""
    rec = json.loads(_profiled(3.5).to_json())
    rec["version"] = 2
    del rec["peak-sigma-w"]
    _drop_cell_tables(rec)
    text = json.dumps(rec, indent=1)
    old = LUT.from_json(text)
    assert np.isnan(old.peak_sigma_w).all()
    assert old.knob == GPU_FREQ_MHZ
    assert old.to_json() == text  # still version 2, no new keys: checksums of stored LUTs hold
    t = old.time_per_sample_s
    sel = select_eq4(Tables(t, old.peak_power_w, peak_sigma_w=old.peak_sigma_w), B6,
                     NANO_FREQS_MHZ, [1.0] * 6, 3.5)  # fmt: skip
    assert sel.peak_power_w < 3.5


def test_a_power_limit_knob_is_kept_in_the_file() -> None:
    lut = LUT(**{**_lut_fields(_row_lut([4.0, 2.0, 1.5, 1.0], [2, 3, 4, 5], [2, 3, 4, 5])),
                 "knob": GPU_POWER_LIMIT_W})  # fmt: skip
    rec = json.loads(lut.to_json())
    assert (rec["version"], rec["knob"]) == (3, "power-limit-w") and "peak-sigma-w" not in rec
    # the columns are W: written under the knob's own key, never as freqs-mhz
    assert rec["power-limits-w"] == list(lut.knob_values) and "freqs-mhz" not in rec
    again = LUT.from_json(lut.to_json())
    assert again.knob == GPU_POWER_LIMIT_W and again.knob_values == lut.knob_values
    older = {k: v for k, v in rec.items() if k != "power-limits-w"}  # written before: read
    legacy = LUT.from_json(json.dumps({**older, "freqs-mhz": rec["power-limits-w"]}))
    assert legacy.to_json() == lut.to_json()
    for bad in ({**older, "power-limits-w": rec["power-limits-w"], "knob": "freq-mhz"},
                {**rec, "freqs-mhz": rec["power-limits-w"]}):  # fmt: skip
        with pytest.raises(LUTFormatError, match="power-limits-w: the columns of a LUT whose"):
            LUT.from_json(json.dumps(bad))
    with pytest.raises(LUTFormatError, match="knob"):
        merge_cells(lut, _row_lut([4.0, 2.0, 1.5, 1.0], [2, 3, 4, 5], [2, 3, 4, 5]), overwrite=True)


def test_a_lut_keeps_its_bare_cap_and_margin_apart() -> None:
    lut = _row_lut(
        [4.0, 2.0, math.nan, math.nan],
        [2, 3] + [math.nan] * 2,
        [2, 3] + [math.nan] * 2,
        cap=5.0,
        cap_margin=0.05,
    )
    assert lut.limit.cap_w == 5.0 and lut.limit.cap_margin == 0.05
    assert lut.limit.limit_w == pytest.approx(4.75)
    full = _row_lut([4.0, 2.0, 1.5, 1.0], [2, 3, 4, 5], [2, 3, 4, 5])
    assert not full.limit.capped and full.grid == "full"
    # a file's margin without a cap is refused where the file is read
    rec = json.loads(full.to_json())
    rec["cap-margin"] = 0.05
    with pytest.raises(LUTFormatError, match="cap-margin: must be in"):
        LUT.from_json(json.dumps(rec))
    with pytest.raises(LUTFormatError, match="on-demand LUT is made without a cap"):
        LUT(**{**_lut_fields(full), "limit": PowerLimit(5.0), "grid": "on-demand"})


# --------------------------------------------------------------------------- cache key


def test_cache_keys_differ_by_device_backend_workload_batch_sizes_cap_margin_and_grid(
    tmp_path: Path,
) -> None:
    def path(**over: Any) -> Path:
        fields: dict[str, Any] = {
            "device_kind": "jetson-nano",
            "backend": "simulated",
            "workload": WORKLOAD,
            "batch_sizes": tuple(B6),
            "knob_values": NANO_FREQS_MHZ,
            "limit": PowerLimit(),
            "grid": "full",
        }
        return LUTKey(**{**fields, **over}).path(tmp_path)

    base = path()
    others = [
        path(device_kind="jetson-tx2"),
        path(backend="jetson"),
        path(workload=Workload("cnn", (3, 32, 32), 1e6)),
        path(batch_sizes=tuple(B6[:-1])),
        path(limit=PowerLimit(5.0), grid="efficient"),
        path(limit=PowerLimit(5.0, 0.05), grid="efficient"),
        path(limit=PowerLimit(4.75), grid="efficient"),
        path(grid="highest"),
        path(grid="on-demand"),
        path(knob=GPU_POWER_LIMIT_W),  # an NVML GPU's LUT over power limits: another file
    ]
    assert len({base, *others}) == 1 + len(others)
    assert "_power-limit_" in others[-1].name and path(knob=GPU_FREQ_MHZ) == base
    assert base.parent == tmp_path
    assert base.name.startswith("lut_jetson-nano_simulated_cnn-1x8x8_b4-8-16-32-64-128_full_")
    assert "pmax5.0w-margin0.05" in others[5].name
    # the frequency table is checked on load (``mismatch``), not part of the name
    assert path(knob_values=NANO_FREQS_MHZ[:-1]) == base


def test_key_of_a_device_and_its_lut_agree() -> None:
    dev = FakeDevice()
    key = LUTKey.of(dev, WORKLOAD, B6, limit=PowerLimit(3.5, 0.05), grid="efficient")
    assert (key.device_kind, key.backend, key.knob_values) == ("fake-nano", "fake", NANO_FREQS_MHZ)
    lut = _profiled(3.5, cap_margin=0.05)
    assert key.mismatch(lut) is None
    # a key without a cap has no margin, whatever was passed
    assert LUTKey.of(dev, WORKLOAD, B6, limit=PowerLimit(None, 0.05)).limit.cap_margin == 0.0  # type: ignore[arg-type]
    assert LUTKey.of(dev, WORKLOAD, B6).mismatch(_profiled()) is None


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"device_kind": "jetson-tx2"}, "device-kind is 'fake-nano', expected 'jetson-tx2'"),
        ({"backend": "jetson"}, "backend is 'fake'"),
        ({"workload": Workload("resnet18", (1, 8, 8), 1e6)}, "model-name is 'cnn'"),
        ({"workload": Workload("cnn", (3, 8, 8), 1e6)}, "input-shape is (1, 8, 8)"),
        ({"batch_sizes": (4, 8)}, "batch-sizes is (4, 8, 16, 32, 64, 128)"),
        ({"knob_values": NANO_FREQS_MHZ[:-1]}, "freqs-mhz is"),
        ({"limit": PowerLimit(4.0, 0.05)}, "p-max-w is 3.5, expected 4.0"),
        ({"limit": PowerLimit(3.5, 0.1)}, "cap-margin is 0.05, expected 0.1"),
        ({"grid": "full"}, "grid is 'efficient', expected 'full'"),
    ],
)
def test_mismatch_names_what_differs(over: dict[str, Any], reason: str) -> None:
    key = LUTKey.of(FakeDevice(), WORKLOAD, B6, limit=PowerLimit(3.5, 0.05), grid="efficient")
    other = dataclasses.replace(key, **over)
    got = other.mismatch(_profiled(3.5, cap_margin=0.05))
    assert got is not None and got.startswith(reason)


# --------------------------------------------------------------------------- cache files


def test_load_cached_answers_only_a_valid_fitting_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lut = _profiled(3.5, cap_margin=0.05)
    key = lut.key
    path = key.path(tmp_path)
    assert load_cached(path, key) is None  # no file: nothing, no warning
    assert caplog.text == ""
    lut.save(path)
    cached = load_cached(path, key)
    assert cached is not None and cached.to_json() == lut.to_json()
    # the same file asked for under another margin does not fit: set aside
    wrong = dataclasses.replace(key, limit=PowerLimit(3.5, 0.1))
    with caplog.at_level(logging.WARNING, logger="fl_client.lut"):
        assert load_cached(path, wrong) is None
    assert "cap-margin is 0.05, expected 0.1" in caplog.text
    assert not path.exists() and len(list(tmp_path.glob(path.name + ".corrupt-*"))) == 1


def _cached(folder: Path, device: FakeDevice, steps: CountingSteps) -> tuple[LUT, bool]:
    return load_or_profile(device, WORKLOAD, B6, steps, folder, ProfileOptions(progress=False))


def test_corrupt_cache_is_set_aside_and_reprofiled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    steps = CountingSteps()
    _cached(tmp_path, FakeDevice(), steps)
    path = LUTKey.of(FakeDevice(), WORKLOAD, B6).path(tmp_path)
    path.write_text('{"format": "powerfl-lut", "truncated')
    with caplog.at_level(logging.WARNING, logger="fl_client.lut"):
        _, from_cache = _cached(tmp_path, FakeDevice(), steps)
    assert not from_cache
    assert "corrupt or does not match" in caplog.text and "re-profiling" in caplog.text
    aside = list(tmp_path.glob(path.name + ".corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text().endswith("truncated")
    assert LUT.load(path).grid == "full"  # a good file again
    assert _cached(tmp_path, FakeDevice(), steps)[1]


@pytest.mark.parametrize("tamper", ["edited", "unchecked"])
def test_a_well_formed_but_wrong_cache_is_refused_by_its_checksum(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tamper: str
) -> None:
    """A cache file whose numbers were changed (its checksum no longer matches), or one
    written without a checksum, is set aside and re-profiled: never trusted."""
    steps = CountingSteps()
    lut, _ = _cached(tmp_path, FakeDevice(), steps)
    path = LUTKey.of(FakeDevice(), WORKLOAD, B6).path(tmp_path)
    rec = json.loads(path.read_text())
    assert rec["content-sha256"] == lut_checksum(lut)
    if tamper == "edited":  # well-formed, plausible, wrong: a peak 20% low
        rec["peak-power-w"] = [[p * 0.8 for p in row] for row in rec["peak-power-w"]]
    else:
        del rec["content-sha256"]
    path.write_text(json.dumps(rec))
    if tamper == "unchecked":  # read on purpose (not as a cache), it still parses
        assert LUT.load(path).to_json() == lut.to_json()
    else:
        with pytest.raises(LUTFormatError, match="content-sha256: the content does not match"):
            LUT.load(path)
    before = sum(steps.calls.values())
    with caplog.at_level(logging.WARNING, logger="fl_client.lut"):
        again, from_cache = _cached(tmp_path, FakeDevice(), steps)
    assert not from_cache and sum(steps.calls.values()) > before  # profiled again
    assert "content-sha256" in caplog.text and "re-profiling" in caplog.text
    assert len(list(tmp_path.glob(path.name + ".corrupt-*"))) == 1
    assert again.to_json() == LUT.load(path, require_checksum=True).to_json()


def test_a_cache_file_that_is_not_utf8_is_set_aside(tmp_path: Path) -> None:
    key = LUTKey.of(FakeDevice(), WORKLOAD, B6)
    path = key.path(tmp_path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(LUTFormatError, match="not UTF-8"):
        LUT.load(path)
    assert load_cached(path, key) is None
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1


def test_mismatching_cache_is_set_aside_and_reprofiled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    steps = CountingSteps()
    _cached(tmp_path, FakeDevice(), steps)
    # same kind and backend, but the frequency table changed (e.g. a new JetPack)
    dev = FakeDevice(knob_values=NANO_FREQS_MHZ[:-1])
    with caplog.at_level(logging.WARNING, logger="fl_client.lut"):
        lut, from_cache = _cached(tmp_path, dev, steps)
    assert not from_cache and lut.knob_values == NANO_FREQS_MHZ[:-1]
    assert "freqs-mhz" in caplog.text
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1


def test_save_is_atomic_and_save_quietly_only_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lut = _profiled()
    path = lut.save(tmp_path / "sub" / "lut.json")
    assert [p.name for p in path.parent.iterdir()] == ["lut.json"]  # no temporary file
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="fl_client.lut"):
        save_quietly(lut, blocker / "lut.json")  # a folder that cannot be made
    assert "could not update the LUT cache" in caplog.text
    save_quietly(lut, tmp_path / "quiet.json")
    assert LUT.load(tmp_path / "quiet.json").to_json() == lut.to_json()


# ------------------------------------------------------------------ how cells were measured


def test_the_per_cell_window_tables_round_trip() -> None:
    lut = _profiled(3.5)
    measured = ~np.isnan(lut.time_per_sample_s)
    for name in CELL_TABLES:
        table = getattr(lut, name)
        assert np.isnan(table[~measured]).all()
    # the fake's sensor is exact: at least the 3 steps, one sample each; no real board
    assert (lut.power_samples[measured] >= 3).all() and (lut.settled[measured] == 1).all()
    assert (lut.window_s[measured] > 0).all() and np.isnan(lut.needed_window_s).all()
    rec = json.loads(lut.to_json())
    assert rec["version"] == 3 and "needed-window-s" not in rec  # only what was recorded
    assert {"power-samples", "window-s", "settled"} <= set(rec)
    back = LUT.from_json(lut.to_json())
    for name in CELL_TABLES:
        np.testing.assert_array_equal(getattr(back, name), getattr(lut, name))
    assert back.to_json() == lut.to_json()
    # with the board's window (an emulated device): it too
    needed = np.where(measured, 0.5, np.nan)
    twin = LUT(**{**_lut_fields(lut), "window_s": lut.window_s, "needed_window_s": needed,
                  "profile_time_s": lut.profile_time_s})  # fmt: skip
    again = LUT.from_json(twin.to_json())
    np.testing.assert_array_equal(again.needed_window_s, needed)
    expected = twin.profile_time_s - np.nansum(twin.window_s) + 0.5 * twin.cells_profiled
    assert again.board_profile_time_s == pytest.approx(expected)
    assert lut.board_profile_time_s is None  # no board recorded


def test_a_version_3_file_without_window_tables_still_loads() -> None:
    """Version 3 files written before the window tables existed (σ, knob only)."""
    rec = json.loads(_profiled(3.5).to_json())
    _drop_cell_tables(rec)
    text = json.dumps(rec, indent=1)
    old = LUT.from_json(text)
    for name in CELL_TABLES:
        assert np.isnan(getattr(old, name)).all()
    assert old.to_json() == text and int((old.settled == 0).sum()) == 0
    assert old.board_profile_time_s is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("settled", 0.5, "settled: must be 1"),
        ("power-samples", 2.5, "whole numbers"),
        ("window-s", -0.1, "window-s: measured cells must be finite"),
        ("needed-window-s", "x", "numbers or null"),
    ],
)
def test_the_window_tables_are_checked(key: str, value: object, message: str) -> None:
    lut = _profiled(3.5)
    rec = json.loads(lut.to_json())
    measured = ~np.isnan(lut.time_per_sample_s)
    i, j = map(int, np.argwhere(measured)[0])
    if key not in rec:
        rec[key] = [[None] * len(row) for row in rec["time-per-sample-s"]]
    rec[key][i][j] = value
    with pytest.raises(LUTFormatError, match=message):
        LUT.from_json(json.dumps(rec))
    rec = json.loads(lut.to_json())
    i, j = map(int, np.argwhere(~measured)[0])
    rec["window-s"][i][j] = 1.0
    with pytest.raises(LUTFormatError, match="window-s: a value in a cell that was not profiled"):
        LUT.from_json(json.dumps(rec))
    rec = json.loads(lut.to_json())
    rec["power-samples"] = rec["power-samples"][:-1]
    with pytest.raises(LUTFormatError, match="power-samples: shape"):
        LUT.from_json(json.dumps(rec))


def test_the_tables_a_selection_reads_are_the_luts_own() -> None:
    lut = _profiled(3.5, cap_margin=0.05)
    tables = lut.tables
    assert tables.knob == lut.knob
    np.testing.assert_array_equal(tables.time_s, lut.time_per_sample_s)
    np.testing.assert_array_equal(tables.peak_w, lut.peak_power_w)
    np.testing.assert_array_equal(tables.avg_w, lut.avg_power_w)
    np.testing.assert_array_equal(tables.peak_sigma_w, lut.peak_sigma_w)
    # what the select tool and a node choose from: Eq. 4 on them
    assert select_eq4(tables, B6, NANO_FREQS_MHZ, [1.0] * 6, lut.limit).p_max_w == 3.5
