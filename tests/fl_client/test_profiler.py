"""fl_client.profiler: full and efficient profiling on a fake device, the cap margin of the
efficient walk and ``load_or_profile``.

Cells measured one at a time are tested in ``test_cell_measure``; the LUT file format, the
cache files and merging in ``test_lut`` and ``test_lut_cells``.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_client.cell_measure import (
    MAX_WINDOW_S,
    CellOptions,
    CellWindow,
    measure_cell_with_sigma,
)
from fl_client.devices.base import (
    GPU_FREQ_MHZ,
    GPU_POWER_LIMIT_W,
    Device,
    DeviceInfo,
    InvalidFrequencyError,
    Measurement,
    SensorSpec,
    Workload,
)
from fl_client.feasibility import feasible_cells, feasible_knob_index
from fl_client.lut import LUT, LUTKey
from fl_client.power import PowerLimit
from fl_client.profiler import (
    WALK_EXTRA_INFEASIBLE,
    WALK_STOP_IN_A_ROW,
    ProfileOptions,
    _efficient_row,
    load_or_profile,
    profile,
)
from fl_client.selection import Tables
from fl_client.selector import select_eq4

REAL_SENSOR = SensorSpec("real", 0.0, 1, 0.1)
NANO_FREQS_MHZ = tuple(round(76.8 * k, 1) for k in range(1, 13))  # 76.8 … 921.6
B6 = [4, 8, 16, 32, 64, 128]
WORKLOAD = Workload("cnn", (1, 8, 8), flops_per_sample=1e6)
SWITCH_S = 0.01  # device time a frequency change costs on the fake


class AccountingMeter:
    """What the fake meters share: the accounting ``_m`` and the Meter's views of it."""

    _m: Measurement

    @property
    def measurement(self) -> Measurement:
        return self._m

    @property
    def time_s(self) -> float:
        return self._m.time_s

    def power_samples_since(self, index: int) -> list[float]:
        return self._m.power_samples_w[index:]


class FakeMeter(AccountingMeter):
    def __init__(self, device: FakeDevice) -> None:
        self._device = device
        self._m = Measurement()

    def step(self, batch_size: int, fn: Callable[[], object]) -> None:
        fn()
        d = self._device
        cold = d.cold
        d.cold = False
        dt = batch_size * d.time_per_sample_s(batch_size, d.freq) * (10.0 if cold else 1.0)
        power_w = d.power_w(batch_size, d.freq) + (5.0 if cold else 0.0)
        if d.jitter_w:  # per-step noise, the same cycle on every cell
            power_w += d.jitter_w[d.steps_run % len(d.jitter_w)]
        d.steps_run += 1
        d.clock_s += dt
        self._m.time_s += dt
        self._m.energy_j += power_w * dt
        self._m.peak_power_w = max(self._m.peak_power_w, power_w)
        self._m.steps += 1
        self._m.samples += batch_size
        self._m.power_samples_w.append(power_w)


class FakeDevice:
    """Deterministic twin: power = a + c·b·f (+ per-b offsets), time/sample falls with b and f.

    The first step after a frequency change is "cold": 10× slower and 5 W hotter, so a
    table that included warm-up steps would show it. ``spikes_w`` adds power to single
    cells (b, f) on every step (a noisy or non-binding cell); ``jitter_w`` is added to the
    steps' power in turn (per-step noise: σ of a cell's peaks).
    """

    def __init__(
        self,
        knob_values: tuple[float, ...] = NANO_FREQS_MHZ,
        a_w: float = 1.0,
        c_w: float = 4e-5,
        offsets_w: dict[int, float] | None = None,
        kind: str = "fake-nano",
        backend: str = "fake",
        spikes_w: dict[tuple[int, float], float] | None = None,
        jitter_w: tuple[float, ...] = (),
    ) -> None:
        self.freqs = tuple(knob_values)
        self.a_w, self.c_w = a_w, c_w
        self.offsets_w = dict(offsets_w or {})
        self.spikes_w = dict(spikes_w or {})
        self.jitter_w = tuple(jitter_w)
        self.steps_run = 0
        self.kind, self.backend = kind, backend
        self.initial_freq = self.freqs[-1]
        self.freq = self.initial_freq
        self.clock_s = 0.0
        self.cold = True
        self.set_calls: list[float] = []
        self.restores = 0

    def power_w(self, b: int, knob_value: float) -> float:
        spike = self.spikes_w.get((b, knob_value), 0.0)
        return self.a_w + self.c_w * b * knob_value + self.offsets_w.get(b, 0.0) + spike

    def time_per_sample_s(self, b: int, knob_value: float) -> float:
        return (1.0 + 8.0 / b) / knob_value

    @property
    def info(self) -> DeviceInfo:
        return DeviceInfo(self.kind, self.backend, self.freqs, 4 << 30, "POM_5V_IN")

    @property
    def knob_values(self) -> tuple[float, ...]:
        return self.freqs

    def current_knob_value(self) -> float:
        return self.freq

    def set_knob_value(self, knob_value: float) -> None:
        if knob_value not in self.freqs:
            raise InvalidFrequencyError(f"{knob_value} not in table")
        self.freq = knob_value
        self.cold = True
        self.clock_s += SWITCH_S
        self.set_calls.append(knob_value)

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

    def __init__(self, fail_after: int | None = None) -> None:
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


def _options(p_max_w: Any = None, cap_margin: float = 0.0, **kw: Any) -> ProfileOptions:
    """Profiling options from the flat keywords the CLI and run settings give."""
    return ProfileOptions(PowerLimit(p_max_w, cap_margin), **kw)


def _profile(
    device: FakeDevice | None = None, p_max_w: float | str | None = None, **kw: Any
) -> LUT:
    return profile(
        device or FakeDevice(),
        WORKLOAD,
        B6,
        CountingSteps(),
        _options(p_max_w, progress=False, **kw),
    )


def test_fake_device_implements_the_protocol() -> None:
    assert isinstance(FakeDevice(), Device)


def test_full_grid_measures_every_cell_without_warmup_effects() -> None:
    dev = FakeDevice()
    steps = CountingSteps()
    lut = profile(dev, WORKLOAD, B6, steps, ProfileOptions(warmup_steps=1, steps=3, progress=False))
    assert lut.grid == "full" and lut.cells_profiled == 6 * 12 and lut.limit.cap_w is None
    assert lut.grid == "full" and lut.limit.cap_margin == 0.0
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


def test_without_warmup_the_cold_step_shows() -> None:
    dev = FakeDevice()
    lut = _profile(dev, warmup_steps=0, steps=2, sizing="fixed")
    b, f = B6[0], NANO_FREQS_MHZ[0]
    assert lut.peak_power_w[0, 0] == pytest.approx(dev.power_w(b, f) + 5.0)
    assert lut.time_per_sample_s[0, 0] == pytest.approx(dev.time_per_sample_s(b, f) * 11 / 2)
    assert (lut.settled == 1).all() and (lut.power_samples == 2).all()
    # sized by the sensor, the cold step keeps the cell going until the running means
    # settle: its share of the cell's time shrinks (its peak stays: a warm-up is needed)
    sized = _profile(FakeDevice(), warmup_steps=0, steps=2)
    assert lut.time_per_sample_s[0, 0] > sized.time_per_sample_s[0, 0]
    assert sized.time_per_sample_s[0, 0] < 1.1 * dev.time_per_sample_s(b, f)
    assert sized.power_samples[0, 0] > 100 and sized.settled[0, 0] == 1
    # the slowest cells (1.8 s steps) reach the 30 s cap first: marked unsettled
    at_cap = sized.window_s >= MAX_WINDOW_S
    assert at_cap.any() and (sized.settled[at_cap] == 0).all()
    assert (sized.settled[~at_cap] == 1).all() and int((sized.settled == 0).sum()) == at_cap.sum()


def test_profile_time_is_device_time_including_warmup_and_switches() -> None:
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
def test_efficient_mode_finds_the_full_grids_feasible_maxima_with_fewer_cells(
    p_max_w: float,
) -> None:
    full = _profile(FakeDevice())
    dev = FakeDevice()
    eff = _profile(dev, p_max_w=p_max_w)
    assert eff.limit.cap_w == p_max_w and eff.limit.cap_margin == 0.0 and eff.grid != "full"
    assert eff.grid == "efficient"
    assert eff.cells_profiled < full.cells_profiled
    for i in range(len(B6)):
        assert feasible_knob_index(eff.peak_power_w[i], p_max_w) == feasible_knob_index(
            full.peak_power_w[i], p_max_w
        )
    # profiled cells hold the same values as the full grid
    measured = ~np.isnan(eff.time_per_sample_s)
    np.testing.assert_allclose(eff.time_per_sample_s[measured], full.time_per_sample_s[measured])
    # and Eq. 4 picks the same configuration from either table
    r = [0.3, 0.4, 0.5, 0.7, 0.9, 1.0]
    a = select_eq4(
        Tables(full.time_per_sample_s, full.peak_power_w), B6, NANO_FREQS_MHZ, r, p_max_w
    )
    b = select_eq4(Tables(eff.time_per_sample_s, eff.peak_power_w), B6, NANO_FREQS_MHZ, r, p_max_w)
    assert (a.batch_size, a.knob_value) == (b.batch_size, b.knob_value)
    assert dev.restores == 1


def test_efficient_walk_order_matches_paper_section_4_1() -> None:
    dev = FakeDevice()
    lut = _profile(dev, p_max_w=3.0)

    def visited(b: int) -> list[float]:
        row = lut.time_per_sample_s[B6.index(b)]
        return [f for f, t in zip(NANO_FREQS_MHZ, row, strict=True) if not math.isnan(t)]

    # b=128: 1 + 4e-5·128·f < 3 ⇔ f < 390.6 MHz → 76.8…384 feasible, 460.8 the first not,
    # 537.6 the second in a row: the walk stops there
    assert visited(128) == list(NANO_FREQS_MHZ[:7])
    assert dev.set_calls[:7] == list(NANO_FREQS_MHZ[:7])
    # b=64 starts at b=128's highest feasible f and stops at its second infeasible f in a
    # row (f < 781 MHz is feasible: 384…768, then 844.8 and 921.6 measured and over the cap)
    assert visited(64) == list(NANO_FREQS_MHZ[4:12])
    assert lut.peak_power_w[B6.index(64), 10] >= 3.0 > lut.peak_power_w[B6.index(64), 9]
    # b=32 starts at 768 and is feasible up to the top frequency
    assert visited(32) == list(NANO_FREQS_MHZ[9:])
    assert visited(4) == [921.6]


def test_efficient_walk_stops_below_the_cap_less_its_margin_and_stores_the_bare_cap() -> None:
    # 5% of 3.5 W kept free: the walk compares peaks with 3.325 W. b=128 draws
    # 1 + 4e-5·128·f: 2.97 W at 384 MHz, 3.36 W at 460.8 MHz and 3.75 W at 537.6 MHz (both
    # over 3.325 W: the walk stops at the second), while under the bare 3.5 W 460.8 MHz is
    # feasible and it goes on to 614.4 MHz (4.15 W).
    dev = FakeDevice()
    lut = _profile(dev, p_max_w=3.5, cap_margin=0.05)
    assert lut.limit.cap_w == 3.5 and lut.limit.cap_margin == 0.05  # the bare cap, and the margin
    assert lut.limit.limit_w == pytest.approx(3.325)
    i = B6.index(128)
    row = lut.time_per_sample_s[i]
    visited = [f for f, t in zip(NANO_FREQS_MHZ, row, strict=True) if not math.isnan(t)]
    assert visited == list(NANO_FREQS_MHZ[:7])  # up to 537.6 MHz
    # the same cells as a walk under the reduced cap with no margin
    reduced = _profile(FakeDevice(), p_max_w=3.325)
    np.testing.assert_array_equal(
        np.isnan(lut.time_per_sample_s), np.isnan(reduced.time_per_sample_s)
    )
    bare = _profile(FakeDevice(), p_max_w=3.5)
    assert math.isnan(lut.time_per_sample_s[i, 7]) and not math.isnan(bare.time_per_sample_s[i, 7])
    j = feasible_knob_index(lut.peak_power_w[i], 3.325)
    assert j == 4 and lut.peak_power_w[i, j] < 3.325 <= lut.peak_power_w[i, j + 1]
    # without the margin, that next cell is feasible under 3.5 W
    assert feasible_knob_index(bare.peak_power_w[i], 3.5) == j + 1
    # Eq. 4 under the cap less the margin picks the same from either table
    r = [0.3, 0.4, 0.5, 0.7, 0.9, 1.0]
    full = _profile(FakeDevice())
    limit = PowerLimit(3.5, 0.05)
    a = select_eq4(Tables(full.time_per_sample_s, full.peak_power_w), B6, NANO_FREQS_MHZ, r, limit)
    b = select_eq4(Tables(lut.time_per_sample_s, lut.peak_power_w), B6, NANO_FREQS_MHZ, r, limit)
    assert (a.batch_size, a.knob_value) == (b.batch_size, b.knob_value)
    assert a.peak_power_w < 3.325


def test_efficient_mode_when_nothing_is_feasible_measures_lowest_frequencies_only() -> None:
    lut = _profile(FakeDevice(), p_max_w=0.5)
    assert lut.cells_profiled == 6 * 2  # each b: the two lowest f, both over the cap
    assert np.all(~np.isnan(lut.peak_power_w[:, :2])) and np.all(np.isnan(lut.peak_power_w[:, 2:]))
    with pytest.raises(ValueError, match=r"lowest measured peak power is 1.012 W \(b=4, f=76.8"):
        select_eq4(
            Tables(lut.time_per_sample_s, lut.peak_power_w), B6, NANO_FREQS_MHZ, [1.0] * 6, 0.5
        )


def test_efficient_mode_walks_down_when_a_smaller_batch_draws_more_power() -> None:
    # b=64 draws 1.5 W more than the linear model: its feasible range ends below b=128's.
    offsets = {64: 1.5}
    full = _profile(FakeDevice(offsets_w=offsets))
    eff = _profile(FakeDevice(offsets_w=offsets), p_max_w=4.0)
    for i in range(len(B6)):
        assert feasible_knob_index(eff.peak_power_w[i], 4.0) == feasible_knob_index(
            full.peak_power_w[i], 4.0
        )
    assert feasible_knob_index(eff.peak_power_w[B6.index(64)], 4.0) is not None


def _visited(lut: LUT, b: int) -> list[int]:
    """Column indices of b's measured cells."""
    return [j for j, t in enumerate(lut.time_per_sample_s[B6.index(b)]) if not math.isnan(t)]


R6 = [0.3, 0.4, 0.5, 0.7, 0.9, 1.0]


def test_a_noisy_spike_at_the_lowest_f_above_the_cap_does_not_stop_the_walk() -> None:
    # b=128 reads 3 W too high at 76.8 MHz (noise, or a clock that does not bind there).
    # The paper's walk stopped at that first cell and left the row without a feasible f;
    # this walk goes past it to the row's boundary: 1 + 4e-5·128·f < 3 W up to 384 MHz
    # (index 4), then 460.8 and 537.6 MHz are the two infeasible cells in a row.
    spikes = {(128, NANO_FREQS_MHZ[0]): 3.0}
    eff = _profile(FakeDevice(spikes_w=spikes), p_max_w=3.0)
    i = B6.index(128)
    assert eff.peak_power_w[i, 0] >= 3.0
    assert _visited(eff, 128) == list(range(7))
    assert feasible_cells(eff.peak_power_w[i], 3.0).tolist()[:6] == [False] + [True] * 4 + [False]
    # the smaller b start where b=128's highest feasible f is, as without the spike
    clean = _profile(FakeDevice(), p_max_w=3.0)
    assert all(_visited(eff, b) == _visited(clean, b) for b in B6[:-1])
    # and the selection from it is the full grid's
    full = _profile(FakeDevice(spikes_w=spikes))
    a = select_eq4(Tables(full.time_per_sample_s, full.peak_power_w), B6, NANO_FREQS_MHZ, R6, 3.0)
    b = select_eq4(
        Tables(eff.time_per_sample_s, eff.peak_power_w, eff.avg_power_w, eff.peak_sigma_w),
        B6,
        NANO_FREQS_MHZ,
        R6,
        3.0,
    )
    assert (a.batch_size, a.knob_value) == (b.batch_size, b.knob_value)


def test_the_walk_stops_at_its_third_infeasible_cell_even_when_they_are_apart() -> None:
    # Under 4 W, b=128 is feasible up to 537.6 MHz (index 6); spikes at indices 0, 2 and 4
    # make three infeasible cells that are never two in a row: the walk stops at the
    # third (the bound on what noise can cost) and keeps index 3 as b=128's highest.
    spikes = {(128, NANO_FREQS_MHZ[j]): 5.0 for j in (0, 2, 4)}
    eff = _profile(FakeDevice(spikes_w=spikes), p_max_w=4.0)
    assert _visited(eff, 128) == [0, 1, 2, 3, 4]
    assert _visited(eff, 64)[0] == 3  # the next b starts at b=128's highest feasible f


def test_sigma_of_the_per_step_peaks_is_recorded_for_every_measured_cell() -> None:
    # 1 warm-up + 3 measured steps per cell: the measured steps get three consecutive
    # values of the jitter's cycle, whose σ (ddof = 1) is 0.3 W.
    # (fixed: sized by settling, the jitter of ±0.3 W on ~1-7 W keeps cells going)
    jitter = (0.0, 0.3, -0.3)
    full = _profile(FakeDevice(jitter_w=jitter), sizing="fixed")
    np.testing.assert_allclose(full.peak_sigma_w, 0.3)
    eff = _profile(FakeDevice(jitter_w=jitter), p_max_w=5.0, sizing="fixed")
    measured = ~np.isnan(eff.time_per_sample_s)
    np.testing.assert_allclose(eff.peak_sigma_w[measured], 0.3)
    assert np.isnan(eff.peak_sigma_w[~measured]).all()
    back = LUT.from_json(eff.to_json())
    np.testing.assert_array_equal(back.peak_sigma_w, eff.peak_sigma_w)
    # a steady device: σ 0; a single measured step: σ not recorded (NaN, counts as 0)
    assert (_profile(FakeDevice()).peak_sigma_w == 0).all()
    assert np.isnan(_profile(FakeDevice(), steps=1, sizing="fixed").peak_sigma_w).all()
    # a cell measured on its own gets its σ too
    m = measure_cell_with_sigma(
        FakeDevice(jitter_w=jitter),
        WORKLOAD,
        8,
        lambda: None,
        76.8,
        CellOptions(window=CellWindow.fixed(3)),
    )
    assert m.peak_sigma_w == pytest.approx(0.3) and m.measurement.steps == 3


def test_the_walk_judges_each_cell_by_peak_plus_k_sigma() -> None:
    # σ = 0.3 W and the peak is the base + 0.3 W. b=128's base is 1 + 0.00512·f W.
    jitter = (0.0, 0.3, -0.3)
    robust = _profile(FakeDevice(jitter_w=jitter), p_max_w=3.0)
    bare = _profile(FakeDevice(jitter_w=jitter), p_max_w=3.0, peak_sigma_k=0.0)
    # k = 2: 1.3 + 0.00512·f + 0.6 < 3 up to 153.6 MHz (index 1); 230.4, 307.2 end the walk
    assert _visited(robust, 128) == [0, 1, 2, 3]
    # k = 0: 1.3 + 0.00512·f < 3 up to 307.2 MHz (index 3); 384, 460.8 end the walk
    assert _visited(bare, 128) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="peak-sigma-k"):
        ProfileOptions(PowerLimit(3.0), peak_sigma_k=-1.0)


@settings(max_examples=300, deadline=None)
@given(
    pattern=st.lists(st.booleans(), min_size=1, max_size=14),
    start_share=st.floats(0.0, 1.0, exclude_max=True),
)
def test_the_walk_measures_at_most_two_infeasible_cells_beyond_the_first(
    pattern: list[bool], start_share: float
) -> None:
    """The documented bound, on every pattern of feasible (True) and infeasible cells."""
    n_f = len(pattern)
    start = int(start_share * n_f)
    asked: list[int] = []

    def feasible(j: int) -> bool:
        asked.append(j)
        return pattern[j]

    highest = _efficient_row(feasible, start, n_f)
    assert len(set(asked)) == len(asked)  # no cell measured twice
    up = [j for j in asked if j >= start]
    down = [j for j in asked if j < start]
    assert up == list(range(start, start + len(up)))  # up from the start, one f at a time
    bad = [j for j in up if not pattern[j]]
    assert len(bad) <= 1 + WALK_EXTRA_INFEASIBLE
    # it stops only at the top, at two infeasible cells in a row, or at the bound
    last = up[-1]
    two_in_a_row = len(up) >= WALK_STOP_IN_A_ROW and not any(pattern[j] for j in up[-2:])
    assert last == n_f - 1 or two_in_a_row or len(bad) == 1 + WALK_EXTRA_INFEASIBLE
    # never more than 2 cells up beyond what stopping at the first infeasible f measures
    # that are not feasible (every other extra cell is a candidate of the selector)
    first_bad = bad[0] if bad else n_f
    extra = [j for j in up if j > first_bad]
    assert sum(not pattern[j] for j in extra) <= WALK_EXTRA_INFEASIBLE
    feasible_up = [j for j in up if pattern[j]]
    if feasible_up:
        assert highest == max(feasible_up) and not down
    else:  # down from below the start until a feasible f
        assert down == list(range(start - 1, (highest if highest is not None else 0) - 1, -1))
        assert highest is None or pattern[highest]


def test_the_lut_names_the_devices_knob() -> None:
    """A device whose columns are GPU power limits (a replay table of NVML or Zeus
    measurements) gives a LUT that says so; the progress lines give the unit."""

    class PowerLimitDevice(FakeDevice):
        knob = GPU_POWER_LIMIT_W

    out = io.StringIO()
    dev = PowerLimitDevice(knob_values=(100.0, 150.0, 200.0))
    lut = profile(
        dev, WORKLOAD, [4, 8], CountingSteps(), ProfileOptions(progress=True, progress_stream=out)
    )
    assert lut.knob == GPU_POWER_LIMIT_W and LUT.from_json(lut.to_json()).knob == lut.knob
    assert "b=8 f=100 W:" in out.getvalue()
    assert _profile(FakeDevice()).knob == GPU_FREQ_MHZ


def test_restore_is_called_when_a_step_raises() -> None:
    dev = FakeDevice()
    with pytest.raises(RuntimeError, match="out of memory"):
        profile(dev, WORKLOAD, B6, CountingSteps(fail_after=10), ProfileOptions(progress=False))
    assert dev.restores == 1 and dev.freq == dev.initial_freq


def test_restore_is_called_when_the_step_factory_raises() -> None:
    dev = FakeDevice()

    def factory(b: int) -> Callable[[], None]:
        raise MemoryError(f"b={b} does not fit")

    with pytest.raises(MemoryError):
        profile(dev, WORKLOAD, B6, factory, ProfileOptions(progress=False))
    assert dev.restores == 1


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"p_max_w": -3}, "p-max-w"),
        ({"p_max_w": "lots"}, "p-max-w"),
        ({"steps": 0}, "steps"),
        ({"warmup_steps": -1}, "warmup-steps"),
        ({"warmup_steps": 1.5}, "warmup-steps"),
        ({"uncapped": "diagonal"}, "uncapped: unknown value"),
        ({"p_max_w": 5.0, "cap_margin": 1.0}, "cap-margin"),
        ({"p_max_w": 5.0, "cap_margin": -0.1}, "cap-margin"),
    ],
)
def test_bad_settings_name_the_key(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        _options(**settings)
    with pytest.raises(ValueError, match=key):
        profile(FakeDevice(), WORKLOAD, B6, CountingSteps(), _options(progress=False, **settings))


def test_bad_batch_sizes_name_the_key() -> None:
    with pytest.raises(ValueError, match="batch-sizes"):
        profile(FakeDevice(), WORKLOAD, [], CountingSteps(), ProfileOptions(progress=False))


def test_options_object_and_keywords_are_the_same_settings() -> None:
    opts = _options("3.5", 0.1, steps=2, progress=False)
    assert (opts.limit.p_max_w, opts.limit.cap_w, opts.grid) == (3.5, 3.5, "efficient")
    assert opts.limit.limit_w == pytest.approx(3.15)
    a = profile(FakeDevice(), WORKLOAD, B6, CountingSteps(), opts)
    b = profile(
        FakeDevice(),
        WORKLOAD,
        B6,
        CountingSteps(),
        ProfileOptions(PowerLimit(3.5, 0.1), steps=2, progress=False),
    )
    assert a.to_json().replace(a.created_utc, "") == b.to_json().replace(b.created_utc, "")
    # no cap, in any spelling: no margin either (there is nothing to keep it from)
    for none in (None, "none", math.inf):
        uncapped = _options(none, 0.05)
        assert uncapped.limit.cap_w is None and uncapped.limit.cap_margin == 0.0
        assert not uncapped.limit.capped and uncapped.grid == "full"
    assert ProfileOptions(uncapped="highest").grid == "highest"


def test_progress_plain_lines_when_not_a_tty_and_silent_when_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = io.StringIO()
    profile(
        FakeDevice(),
        WORKLOAD,
        [4, 8],
        CountingSteps(),
        ProfileOptions(progress=True, progress_stream=out),
    )
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 * 12
    assert lines[0].startswith("profile fake-nano cnn-1x8x8 (full grid) [1/24] b=8 f=76.8 MHz")
    out = io.StringIO()
    profile(
        FakeDevice(),
        WORKLOAD,
        [4, 8],
        CountingSteps(),
        ProfileOptions(PowerLimit(3.0, 0.05), progress_stream=out),
    )
    assert out.getvalue().startswith("profile fake-nano cnn-1x8x8 (efficient, P_max 3 W less 5%)")
    _profile(FakeDevice(), p_max_w=3.0)
    assert capsys.readouterr() == ("", "")


def test_rich_progress_bar_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    lut = profile(
        FakeDevice(), WORKLOAD, [4, 8], CountingSteps(), ProfileOptions(progress_stream=out)
    )
    assert lut.grid == "full"
    assert "profile fake-nano cnn-1x8x8" in out.getvalue()


def test_infinite_cap_profiles_the_full_grid() -> None:
    assert _profile(FakeDevice(), p_max_w=math.inf).grid == "full"
    assert _profile(FakeDevice(), p_max_w="none").grid == "full"


def test_uncapped_highest_profiles_one_cell_per_batch_size_and_matches_the_full_grid() -> None:
    full = _profile(FakeDevice())
    dev = FakeDevice()
    steps = CountingSteps()
    top = profile(dev, WORKLOAD, B6, steps, ProfileOptions(uncapped="highest", progress=False))
    assert top.grid == "highest" and top.limit.cap_w is None and top.grid != "full"
    assert top.cells_profiled == len(B6)
    assert steps.calls == dict.fromkeys(B6, 1 + 3)  # one cell per b: warm-up + 3 measured
    assert dev.set_calls == [NANO_FREQS_MHZ[-1]] * len(B6)
    np.testing.assert_allclose(top.time_per_sample_s[:, -1], full.time_per_sample_s[:, -1])
    assert np.isnan(top.time_per_sample_s[:, :-1]).all()
    assert top.profile_time_s < full.profile_time_s / 10
    # without a cap Eq. 4 picks the same configuration from either table
    r = [0.3, 0.4, 0.5, 0.7, 0.9, 1.0]
    a = select_eq4(Tables(full.time_per_sample_s, full.peak_power_w), B6, NANO_FREQS_MHZ, r, None)
    b = select_eq4(Tables(top.time_per_sample_s, top.peak_power_w), B6, NANO_FREQS_MHZ, r, None)
    assert (a.batch_size, a.knob_value) == (b.batch_size, b.knob_value)
    # and the table survives a JSON round trip with its grid
    again = LUT.from_json(top.to_json())
    assert again.grid == "highest"
    np.testing.assert_array_equal(again.peak_power_w, top.peak_power_w)


# --------------------------------------------------------------------------- load_or_profile


def _cached(
    folder: Path,
    device: FakeDevice,
    steps: CountingSteps,
    p_max_w: float | None = None,
    **kw: Any,
) -> tuple[LUT, bool]:
    return load_or_profile(
        device, WORKLOAD, B6, steps, folder, _options(p_max_w, progress=False, **kw)
    )


def test_cache_miss_then_hit(tmp_path: Path) -> None:
    steps = CountingSteps()
    lut, from_cache = _cached(tmp_path, FakeDevice(), steps)
    assert not from_cache and lut.profile_time_s > 0
    calls = sum(steps.calls.values())
    again, from_cache = _cached(tmp_path, FakeDevice(), steps)
    assert from_cache and sum(steps.calls.values()) == calls  # nothing ran again
    np.testing.assert_array_equal(again.peak_power_w, lut.peak_power_w)
    assert [p.name for p in tmp_path.iterdir()] == [
        LUTKey.of(FakeDevice(), WORKLOAD, B6).path(tmp_path).name
    ]  # no temporary files left behind
    assert lut.key.path(tmp_path) == LUTKey.of(FakeDevice(), WORKLOAD, B6).path(tmp_path)


def test_full_grid_cache_serves_any_cap_but_an_efficient_one_only_its_own(tmp_path: Path) -> None:
    steps = CountingSteps()
    _cached(tmp_path / "a", FakeDevice(), steps)
    lut, from_cache = _cached(tmp_path / "a", FakeDevice(), steps, p_max_w=3.0)
    assert from_cache and lut.grid == "full"
    lut, from_cache = _cached(tmp_path / "a", FakeDevice(), steps, p_max_w=3.0, cap_margin=0.05)
    assert from_cache and lut.grid == "full"

    lut, from_cache = _cached(tmp_path / "b", FakeDevice(), steps, p_max_w=3.0)
    assert not from_cache and lut.limit.cap_w == 3.0
    assert _cached(tmp_path / "b", FakeDevice(), steps, p_max_w=3.0)[1]
    lut, from_cache = _cached(tmp_path / "b", FakeDevice(), steps, p_max_w=4.0)
    assert not from_cache and lut.limit.cap_w == 4.0
    lut, from_cache = _cached(tmp_path / "b", FakeDevice(), steps)
    assert not from_cache and lut.grid == "full"
    assert len(list((tmp_path / "b").iterdir())) == 3


def test_an_efficient_cache_serves_only_its_own_cap_margin(tmp_path: Path) -> None:
    steps = CountingSteps()
    lut, hit = _cached(tmp_path, FakeDevice(), steps, p_max_w=5.0, cap_margin=0.05)
    assert not hit and (lut.limit.cap_w, lut.limit.cap_margin) == (5.0, 0.05)
    lut, hit = _cached(tmp_path, FakeDevice(), steps, p_max_w=5.0, cap_margin=0.05)
    assert hit and (lut.limit.cap_w, lut.limit.cap_margin) == (5.0, 0.05)
    # another margin walks to another cap: profiled and cached apart
    lut, hit = _cached(tmp_path, FakeDevice(), steps, p_max_w=5.0, cap_margin=0.1)
    assert not hit and (lut.limit.cap_w, lut.limit.cap_margin) == (5.0, 0.1)
    # nor does the bare cap 4.75 W serve 5 W less 5%, though both walk below 4.75 W
    lut, hit = _cached(tmp_path, FakeDevice(), steps, p_max_w=4.75)
    assert not hit and (lut.limit.cap_w, lut.limit.cap_margin) == (4.75, 0.0)
    assert len(list(tmp_path.glob("lut_*.json"))) == 3
    assert _cached(tmp_path, FakeDevice(), steps, p_max_w=5.0, cap_margin=0.1)[1]


def test_uncapped_highest_is_cached_apart_and_a_full_grid_serves_it(tmp_path: Path) -> None:
    steps = CountingSteps()

    def cached(folder: str, p_max_w: float | None = None, uncapped: str = "highest") -> Any:
        return load_or_profile(
            FakeDevice(),
            WORKLOAD,
            B6,
            steps,
            tmp_path / folder,
            ProfileOptions(PowerLimit.of(p_max_w), uncapped=uncapped, progress=False),
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


def test_a_cache_that_cannot_be_written_only_costs_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level("WARNING", logger="fl_client.profiler"):
        lut, hit = _cached(blocker / "cache", FakeDevice(), CountingSteps())
    assert not hit and lut.grid == "full"
    assert "could not write the LUT cache" in caplog.text
