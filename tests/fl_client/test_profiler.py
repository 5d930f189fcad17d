"""fl_client.profiler: full and efficient profiling on a fake device, LUT JSON, the cache."""

from __future__ import annotations

import io
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from fl_client.devices.base import (
    Device,
    DeviceInfo,
    InvalidFrequencyError,
    Measurement,
    Workload,
)
from fl_client.profiler import (
    LUT,
    LUTFormatError,
    add_measured_cell,
    load_on_demand,
    load_or_profile,
    lut_cache_path,
    on_demand_path,
    profile,
)
from fl_client.selector import feasible_freq_index, select_power_aware

NANO_FREQS_MHZ = tuple(round(76.8 * k, 1) for k in range(1, 13))  # 76.8 … 921.6
B6 = [4, 8, 16, 32, 64, 128]
WORKLOAD = Workload("cnn", (1, 8, 8), flops_per_sample=1e6)
SWITCH_S = 0.01  # device time a frequency change costs on the fake


class FakeMeter:
    def __init__(self, device: FakeDevice):
        self._device = device
        self._m = Measurement()

    def step(self, batch_size: int, fn: Callable[[], object]) -> None:
        fn()
        d = self._device
        cold = d.cold
        d.cold = False
        dt = batch_size * d.time_per_sample_s(batch_size, d.freq) * (10.0 if cold else 1.0)
        power_w = d.power_w(batch_size, d.freq) + (5.0 if cold else 0.0)
        d.clock_s += dt
        self._m.time_s += dt
        self._m.energy_j += power_w * dt
        self._m.peak_power_w = max(self._m.peak_power_w, power_w)
        self._m.steps += 1
        self._m.samples += batch_size
        self._m.power_samples_w.append(power_w)

    @property
    def measurement(self) -> Measurement:
        return self._m


class FakeDevice:
    """Deterministic twin: power = a + c·b·f (+ per-b offsets), time/sample falls with b and f.

    The first step after a frequency change is "cold": 10× slower and 5 W hotter, so a
    table that included warm-up steps would show it.
    """

    def __init__(
        self,
        freqs_mhz=NANO_FREQS_MHZ,
        a_w=1.0,
        c_w=4e-5,
        offsets_w=None,
        kind="fake-nano",
        backend="fake",
    ):
        self.freqs = tuple(freqs_mhz)
        self.a_w, self.c_w = a_w, c_w
        self.offsets_w = dict(offsets_w or {})
        self.kind, self.backend = kind, backend
        self.initial_freq = self.freqs[-1]
        self.freq = self.initial_freq
        self.clock_s = 0.0
        self.cold = True
        self.set_calls: list[float] = []
        self.restores = 0

    def power_w(self, b: int, freq_mhz: float) -> float:
        return self.a_w + self.c_w * b * freq_mhz + self.offsets_w.get(b, 0.0)

    def time_per_sample_s(self, b: int, freq_mhz: float) -> float:
        return (1.0 + 8.0 / b) / freq_mhz

    @property
    def info(self) -> DeviceInfo:
        return DeviceInfo(self.kind, self.backend, self.freqs, 4 << 30, "POM_5V_IN")

    @property
    def gpu_freqs_mhz(self) -> tuple[float, ...]:
        return self.freqs

    def current_gpu_freq_mhz(self) -> float:
        return self.freq

    def set_gpu_freq_mhz(self, freq_mhz: float) -> None:
        if freq_mhz not in self.freqs:
            raise InvalidFrequencyError(f"{freq_mhz} not in table")
        self.freq = freq_mhz
        self.cold = True
        self.clock_s += SWITCH_S
        self.set_calls.append(freq_mhz)

    def restore(self) -> None:
        self.freq = self.initial_freq
        self.restores += 1

    def now_s(self) -> float:
        return self.clock_s

    @contextmanager
    def measure(self, workload: Workload) -> Iterator[FakeMeter]:
        yield FakeMeter(self)

    def close(self) -> None:
        self.restore()


class CountingSteps:
    """A step_factory that counts factory calls and step calls per batch size."""

    def __init__(self, fail_after: int | None = None):
        self.built: Counter[int] = Counter()
        self.calls: Counter[int] = Counter()
        self.fail_after = fail_after

    def __call__(self, b: int) -> Callable[[], None]:
        self.built[b] += 1

        def step() -> None:
            self.calls[b] += 1
            if self.fail_after is not None and sum(self.calls.values()) > self.fail_after:
                raise RuntimeError("CUDA out of memory (fake)")

        return step


def _profile(device=None, p_max_w=None, **kw) -> LUT:
    return profile(
        device or FakeDevice(), WORKLOAD, B6, CountingSteps(), p_max_w=p_max_w, progress=False, **kw
    )


def test_fake_device_implements_the_protocol():
    assert isinstance(FakeDevice(), Device)


def test_full_grid_measures_every_cell_without_warmup_effects():
    dev = FakeDevice()
    steps = CountingSteps()
    lut = profile(dev, WORKLOAD, B6, steps, warmup_steps=1, steps=3, progress=False)
    assert lut.is_full_grid and lut.cells_profiled == 6 * 12 and lut.p_max_w is None
    for i, b in enumerate(B6):
        for j, f in enumerate(NANO_FREQS_MHZ):
            # warm-up discarded: the cold first step leaves no trace in the tables
            assert lut.time_per_sample_s[i, j] == pytest.approx(dev.time_per_sample_s(b, f))
            assert lut.peak_power_w[i, j] == pytest.approx(dev.power_w(b, f))
            assert lut.avg_power_w[i, j] == pytest.approx(dev.power_w(b, f))
    assert steps.built == dict.fromkeys(B6, 1)  # one step function per batch size
    assert steps.calls == dict.fromkeys(B6, 12 * (1 + 3))
    assert dev.restores == 1 and dev.freq == dev.initial_freq
    assert (lut.device_kind, lut.backend, lut.workload_key) == ("fake-nano", "fake", "cnn-1x8x8")


def test_without_warmup_the_cold_step_shows():
    dev = FakeDevice()
    lut = _profile(dev, warmup_steps=0, steps=2)
    b, f = B6[0], NANO_FREQS_MHZ[0]
    assert lut.peak_power_w[0, 0] == pytest.approx(dev.power_w(b, f) + 5.0)
    assert lut.time_per_sample_s[0, 0] == pytest.approx(dev.time_per_sample_s(b, f) * 11 / 2)


def test_profile_time_is_device_time_including_warmup_and_switches():
    dev = FakeDevice()
    lut = _profile(dev, warmup_steps=2, steps=3)
    expected = sum(
        SWITCH_S + b * dev.time_per_sample_s(b, f) * (10 + 1 + 3)  # cold + warm + 3 measured
        for b in B6
        for f in NANO_FREQS_MHZ
    )
    assert lut.profile_time_s == pytest.approx(expected)
    assert lut.profile_time_s == pytest.approx(dev.now_s())
    assert lut.profile_energy_j > 0


@pytest.mark.parametrize("p_max_w", [1.1, 1.5, 2.0, 2.7, 3.5, 4.5, 5.0, 7.0])
def test_efficient_mode_finds_the_full_grids_feasible_maxima_with_fewer_cells(p_max_w):
    full = _profile(FakeDevice())
    dev = FakeDevice()
    eff = _profile(dev, p_max_w=p_max_w)
    assert eff.p_max_w == p_max_w and not eff.is_full_grid
    assert eff.cells_profiled < full.cells_profiled
    for i in range(len(B6)):
        assert feasible_freq_index(eff.peak_power_w[i], p_max_w) == feasible_freq_index(
            full.peak_power_w[i], p_max_w
        )
    # profiled cells hold the same values as the full grid
    measured = ~np.isnan(eff.time_per_sample_s)
    np.testing.assert_allclose(eff.time_per_sample_s[measured], full.time_per_sample_s[measured])
    # and Eq. 4 picks the same configuration from either table
    r = [0.3, 0.4, 0.5, 0.7, 0.9, 1.0]
    args = (B6, NANO_FREQS_MHZ, r, p_max_w)
    a = select_power_aware(full.time_per_sample_s, full.peak_power_w, *args)
    b = select_power_aware(eff.time_per_sample_s, eff.peak_power_w, *args)
    assert (a.batch_size, a.freq_mhz) == (b.batch_size, b.freq_mhz)
    assert dev.restores == 1


def test_efficient_walk_order_matches_paper_section_4_1():
    dev = FakeDevice()
    lut = _profile(dev, p_max_w=3.0)

    def visited(b: int) -> list[float]:
        row = lut.time_per_sample_s[B6.index(b)]
        return [f for f, t in zip(NANO_FREQS_MHZ, row, strict=True) if not math.isnan(t)]

    # b=128: 1 + 4e-5·128·f < 3 ⇔ f < 390.6 MHz → 76.8…384 feasible, 460.8 the first not
    assert visited(128) == list(NANO_FREQS_MHZ[:6])
    assert dev.set_calls[:6] == list(NANO_FREQS_MHZ[:6])
    # b=64 starts at b=128's highest feasible f and stops at its own first infeasible f
    # (f < 781 MHz is feasible: 384…768, then 844.8 measured and over the cap)
    assert visited(64) == list(NANO_FREQS_MHZ[4:11])
    assert lut.peak_power_w[B6.index(64), 10] >= 3.0 > lut.peak_power_w[B6.index(64), 9]
    # b=32 starts at 768 and is feasible up to the top frequency
    assert visited(32) == list(NANO_FREQS_MHZ[9:])
    assert visited(4) == [921.6]


def test_efficient_mode_when_nothing_is_feasible_measures_lowest_frequencies_only():
    lut = _profile(FakeDevice(), p_max_w=0.5)
    assert lut.cells_profiled == 6
    assert np.all(~np.isnan(lut.peak_power_w[:, 0]))
    with pytest.raises(ValueError, match=r"lowest measured peak power is 1.012 W \(b=4, f=76.8"):
        select_power_aware(
            lut.time_per_sample_s, lut.peak_power_w, B6, NANO_FREQS_MHZ, [1.0] * 6, 0.5
        )


def test_efficient_mode_walks_down_when_a_smaller_batch_draws_more_power():
    # b=64 draws 1.5 W more than the linear model: its feasible range ends below b=128's.
    offsets = {64: 1.5}
    full = _profile(FakeDevice(offsets_w=offsets))
    eff = _profile(FakeDevice(offsets_w=offsets), p_max_w=4.0)
    for i in range(len(B6)):
        assert feasible_freq_index(eff.peak_power_w[i], 4.0) == feasible_freq_index(
            full.peak_power_w[i], 4.0
        )
    assert feasible_freq_index(eff.peak_power_w[B6.index(64)], 4.0) is not None


def test_restore_is_called_when_a_step_raises():
    dev = FakeDevice()
    with pytest.raises(RuntimeError, match="out of memory"):
        profile(dev, WORKLOAD, B6, CountingSteps(fail_after=10), progress=False)
    assert dev.restores == 1 and dev.freq == dev.initial_freq


def test_restore_is_called_when_the_step_factory_raises():
    dev = FakeDevice()

    def factory(b: int) -> Callable[[], None]:
        raise MemoryError(f"b={b} does not fit")

    with pytest.raises(MemoryError):
        profile(dev, WORKLOAD, B6, factory, progress=False)
    assert dev.restores == 1


def test_bad_arguments_name_the_key():
    with pytest.raises(ValueError, match="batch-sizes"):
        profile(FakeDevice(), WORKLOAD, [], CountingSteps(), progress=False)
    with pytest.raises(ValueError, match="p-max-w"):
        profile(FakeDevice(), WORKLOAD, B6, CountingSteps(), p_max_w=-3, progress=False)
    with pytest.raises(ValueError, match="steps"):
        profile(FakeDevice(), WORKLOAD, B6, CountingSteps(), steps=0, progress=False)


def test_progress_plain_lines_when_not_a_tty_and_silent_when_off(capsys):
    out = io.StringIO()
    profile(FakeDevice(), WORKLOAD, [4, 8], CountingSteps(), progress=True, progress_stream=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 * 12
    assert lines[0].startswith("profile fake-nano cnn-1x8x8 (full grid) [1/24] b=8 f=76.8 MHz")
    _profile(FakeDevice(), p_max_w=3.0)
    assert capsys.readouterr() == ("", "")


# --------------------------------------------------------------------------- LUT JSON


def test_json_round_trip_keeps_nan_cells_and_metadata():
    lut = _profile(FakeDevice(), p_max_w=3.5)
    text = lut.to_json()
    assert "NaN" not in text and json.loads(text)["p-max-w"] == 3.5
    back = LUT.from_json(text)
    for name in ("time_per_sample_s", "peak_power_w", "avg_power_w"):
        np.testing.assert_array_equal(getattr(back, name), getattr(lut, name))
    for name in (
        "device_kind",
        "backend",
        "model_name",
        "input_shape",
        "batch_sizes",
        "freqs_mhz",
        "p_max_w",
        "profile_time_s",
        "profile_energy_j",
        "created_utc",
        "warmup_steps",
        "steps",
    ):
        assert getattr(back, name) == getattr(lut, name), name
    assert not back.time_per_sample_s.flags.writeable


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.pop("steps"), "missing"),
        (lambda r: r.update(extra=1), "unknown"),
        (lambda r: r.update({"peak-power-w": r["peak-power-w"][:-1]}), "shape"),
        (lambda r: r.update({"freqs-mhz": r["freqs-mhz"][:-1]}), "shape"),
        (lambda r: r.update({"workload-key": "resnet18-3x32x32"}), "workload-key"),
        (lambda r: r.update({"version": 99}), "format"),
        (lambda r: r.update({"batch-sizes": [4, 8, 16, 32, 128, 64]}), "ascending"),
        (lambda r: r.update({"p-max-w": None}), "efficient-mode LUT needs the cap"),
        (lambda r: r.update({"p-max-w": None, "grid": "full"}), "full-grid"),
        (lambda r: (r.update({"p-max-w": None}), r.pop("grid")), "full-grid"),
        (lambda r: r.update({"grid": "highest"}), "without a cap"),
        (lambda r: r.update({"grid": "diagonal"}), "grid: unknown value"),
        (lambda r: r.update({"p-max-w": -1}), "p-max-w"),
        (lambda r: r.update({"batch-sizes": "4,8"}), "batch-sizes"),
        (lambda r: r["time-per-sample-s"][0].__setitem__(0, "x"), "numbers or null"),
        (lambda r: r["avg-power-w"][-1].__setitem__(0, None), "different cells"),
    ],
)
def test_from_json_is_strict(edit, message):
    rec = json.loads(_profile(FakeDevice(), p_max_w=3.5).to_json())
    edit(rec)
    with pytest.raises(LUTFormatError, match=message):
        LUT.from_json(json.dumps(rec))


def test_from_json_rejects_non_json():
    with pytest.raises(LUTFormatError, match="not valid JSON"):
        LUT.from_json("{not json")
    with pytest.raises(LUTFormatError, match="one JSON object"):
        LUT.from_json("[]")


# --------------------------------------------------------------------------- cache


def _cached(tmp_path, device, steps, p_max_w=None):
    return load_or_profile(device, WORKLOAD, B6, steps, tmp_path, p_max_w=p_max_w, progress=False)


def test_cache_miss_then_hit(tmp_path):
    steps = CountingSteps()
    lut, from_cache = _cached(tmp_path, FakeDevice(), steps)
    assert not from_cache and lut.profile_time_s > 0
    calls = sum(steps.calls.values())
    again, from_cache = _cached(tmp_path, FakeDevice(), steps)
    assert from_cache and sum(steps.calls.values()) == calls  # nothing ran again
    np.testing.assert_array_equal(again.peak_power_w, lut.peak_power_w)
    assert [p.name for p in tmp_path.iterdir()] == [
        lut_cache_path(tmp_path, "fake-nano", "fake", WORKLOAD, B6, None).name
    ]  # no temporary files left behind


def test_full_grid_cache_serves_any_cap_but_an_efficient_one_only_its_own(tmp_path):
    steps = CountingSteps()
    _cached(tmp_path / "a", FakeDevice(), steps)
    lut, from_cache = _cached(tmp_path / "a", FakeDevice(), steps, p_max_w=3.0)
    assert from_cache and lut.is_full_grid

    lut, from_cache = _cached(tmp_path / "b", FakeDevice(), steps, p_max_w=3.0)
    assert not from_cache and lut.p_max_w == 3.0
    assert _cached(tmp_path / "b", FakeDevice(), steps, p_max_w=3.0)[1]
    lut, from_cache = _cached(tmp_path / "b", FakeDevice(), steps, p_max_w=4.0)
    assert not from_cache and lut.p_max_w == 4.0
    lut, from_cache = _cached(tmp_path / "b", FakeDevice(), steps)
    assert not from_cache and lut.is_full_grid
    assert len(list((tmp_path / "b").iterdir())) == 3


def test_cache_keys_differ_by_device_backend_workload_and_batch_sizes(tmp_path):
    base = lut_cache_path(tmp_path, "jetson-nano", "simulated", WORKLOAD, B6, None)
    others = [
        lut_cache_path(tmp_path, "jetson-tx2", "simulated", WORKLOAD, B6, None),
        lut_cache_path(tmp_path, "jetson-nano", "jetson", WORKLOAD, B6, None),
        lut_cache_path(
            tmp_path, "jetson-nano", "simulated", Workload("cnn", (3, 32, 32), 1e6), B6, None
        ),
        lut_cache_path(tmp_path, "jetson-nano", "simulated", WORKLOAD, B6[:-1], None),
        lut_cache_path(tmp_path, "jetson-nano", "simulated", WORKLOAD, B6, 5.0),
    ]
    assert len({base, *others}) == 6
    assert base.name.startswith("lut_jetson-nano_simulated_cnn-1x8x8_b4-8-16-32-64-128_full_")


def test_corrupt_cache_is_set_aside_and_reprofiled(tmp_path, caplog):
    steps = CountingSteps()
    _cached(tmp_path, FakeDevice(), steps)
    path = lut_cache_path(tmp_path, "fake-nano", "fake", WORKLOAD, B6, None)
    path.write_text('{"format": "powerfl-lut", "truncated')
    with caplog.at_level(logging.WARNING, logger="fl_client.profiler"):
        _, from_cache = _cached(tmp_path, FakeDevice(), steps)
    assert not from_cache
    assert "corrupt or does not match" in caplog.text and "re-profiling" in caplog.text
    aside = list(tmp_path.glob(path.name + ".corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text().endswith("truncated")
    assert LUT.load(path).is_full_grid  # a good file again
    assert _cached(tmp_path, FakeDevice(), steps)[1]


def test_mismatching_cache_is_set_aside_and_reprofiled(tmp_path, caplog):
    steps = CountingSteps()
    _cached(tmp_path, FakeDevice(), steps)
    # same kind and backend, but the frequency table changed (e.g. a new JetPack)
    dev = FakeDevice(freqs_mhz=NANO_FREQS_MHZ[:-1])
    with caplog.at_level(logging.WARNING, logger="fl_client.profiler"):
        lut, from_cache = _cached(tmp_path, dev, steps)
    assert not from_cache and lut.freqs_mhz == NANO_FREQS_MHZ[:-1]
    assert "freqs-mhz" in caplog.text
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1


def test_rich_progress_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    lut = profile(FakeDevice(), WORKLOAD, [4, 8], CountingSteps(), progress_stream=out)
    assert lut.is_full_grid
    assert "profile fake-nano cnn-1x8x8" in out.getvalue()


def test_infinite_cap_profiles_the_full_grid():
    assert _profile(FakeDevice(), p_max_w=math.inf).is_full_grid


def test_uncapped_highest_profiles_one_cell_per_batch_size_and_matches_the_full_grid():
    full = _profile(FakeDevice())
    dev = FakeDevice()
    steps = CountingSteps()
    top = profile(dev, WORKLOAD, B6, steps, uncapped="highest", progress=False)
    assert top.grid == "highest" and top.p_max_w is None and not top.is_full_grid
    assert top.cells_profiled == len(B6)
    assert steps.calls == dict.fromkeys(B6, 1 + 3)  # one cell per b: warm-up + 3 measured
    assert dev.set_calls == [NANO_FREQS_MHZ[-1]] * len(B6)
    np.testing.assert_allclose(top.time_per_sample_s[:, -1], full.time_per_sample_s[:, -1])
    assert np.isnan(top.time_per_sample_s[:, :-1]).all()
    assert top.profile_time_s < full.profile_time_s / 10
    # without a cap Eq. 4 picks the same configuration from either table
    r = [0.3, 0.4, 0.5, 0.7, 0.9, 1.0]
    a = select_power_aware(full.time_per_sample_s, full.peak_power_w, B6, NANO_FREQS_MHZ, r, None)
    b = select_power_aware(top.time_per_sample_s, top.peak_power_w, B6, NANO_FREQS_MHZ, r, None)
    assert (a.batch_size, a.freq_mhz) == (b.batch_size, b.freq_mhz)
    # and the table survives a JSON round trip with its grid
    again = LUT.from_json(top.to_json())
    assert again.grid == "highest"
    np.testing.assert_array_equal(again.peak_power_w, top.peak_power_w)


def test_uncapped_highest_is_cached_apart_and_a_full_grid_serves_it(tmp_path):
    steps = CountingSteps()

    def cached(folder, p_max_w=None, uncapped="highest"):
        return load_or_profile(
            FakeDevice(),
            WORKLOAD,
            B6,
            steps,
            tmp_path / folder,
            p_max_w=p_max_w,
            uncapped=uncapped,
            progress=False,
        )

    lut, hit = cached("a")
    assert not hit and lut.grid == "highest"
    lut, hit = cached("a")
    assert hit and lut.grid == "highest"
    lut, hit = cached("a", uncapped="full")  # a full grid is not served by one column
    assert not hit and lut.grid == "full"
    _, hit = cached("b", uncapped="full")
    lut, hit = cached("b")
    assert hit and lut.grid == "full"
    with pytest.raises(ValueError, match="uncapped: unknown value"):
        cached("c", uncapped="diagonal")


def test_cells_measured_on_demand_accumulate_and_are_cached_apart(tmp_path):
    device, steps = FakeDevice(), CountingSteps()
    assert load_on_demand(tmp_path, device, WORKLOAD, B6) is None
    step = steps(32)
    cells, t1, e1 = add_measured_cell(None, device, WORKLOAD, B6, 32, step, 460.8)
    assert cells.grid == "on-demand" and cells.p_max_w is None and cells.cells_profiled == 1
    i, j = B6.index(32), NANO_FREQS_MHZ.index(460.8)
    assert cells.time_per_sample_s[i, j] == pytest.approx(device.time_per_sample_s(32, 460.8))
    assert cells.peak_power_w[i, j] == pytest.approx(device.power_w(32, 460.8))  # warm steps
    assert t1 > 0 and e1 > 0 and (cells.profile_time_s, cells.profile_energy_j) == (t1, e1)
    assert device.freq == device.initial_freq  # restored after the cell
    cells, t2, e2 = add_measured_cell(cells, device, WORKLOAD, B6, 32, step, 384.0)
    assert cells.cells_profiled == 2
    assert cells.profile_time_s == pytest.approx(t1 + t2)
    assert cells.profile_energy_j == pytest.approx(e1 + e2)
    with pytest.raises(ValueError, match="is not a cell"):
        add_measured_cell(cells, device, WORKLOAD, B6, 32, step, 400.0)
    path = on_demand_path(tmp_path, device, WORKLOAD, B6)
    cells.save(path)
    assert "on-demand" in path.name
    others = {
        lut_cache_path(tmp_path, "fake-nano", "fake", WORKLOAD, B6, None, grid)
        for grid in ("full", "highest")
    }
    assert path not in others and len(others) == 2
    again = load_on_demand(tmp_path, device, WORKLOAD, B6)
    assert again is not None and again.to_json() == cells.to_json()
    with pytest.raises(LUTFormatError, match="on-demand LUT is made without a cap"):
        LUT(**{**_lut_fields(cells), "p_max_w": 5.0})


def _lut_fields(lut: LUT) -> dict:
    names = ("device_kind", "backend", "model_name", "input_shape", "batch_sizes", "freqs_mhz")
    tables = ("time_per_sample_s", "peak_power_w", "avg_power_w", "grid")
    return {name: getattr(lut, name) for name in names + tables}
