"""fl_client.selector on measured, noisy tables (issue 13): per-cell feasibility with k·σ,
the fastest feasible cell to accuracy, energy among near-ties; against brute force."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fl_client.devices.base import GPU_FREQ_MHZ, GPU_POWER_LIMIT_W
from fl_client.feasibility import feasible_cells, feasible_knob_indices
from fl_client.power import PowerLimit
from fl_client.selection import InfeasibleCapError, Tables
from fl_client.selector import Method, Objective, select, select_eq4

B6 = [4, 8, 16, 32, 64, 128]
F14 = [100.0 * k for k in range(1, 15)]


# --------------------------------------------------------------------------- brute force


def robust_peak(peak, sigma, i, j, k):
    s = 0.0 if sigma is None or math.isnan(sigma[i][j]) else sigma[i][j]
    return peak[i][j] + k * s if k else peak[i][j]


def feasible_list(time, peak, cap, margin, sigma, k):
    """Every (i, j) whose own robust peak is below P_max · (1 − margin), by a plain scan."""
    limit = math.inf if cap is None or math.isinf(cap) else cap * (1.0 - margin)
    return [
        (i, j)
        for i in range(len(time))
        for j in range(len(time[0]))
        if not math.isnan(time[i][j]) and robust_peak(peak, sigma, i, j, k) < limit
    ]


class Opts(NamedTuple):
    """The rule's settings and the optional tables, as the brute force takes them."""

    margin: float = 0.0
    sigma: np.ndarray | None = None
    k: float = 2.0
    tol: float = 0.02
    avg: np.ndarray | None = None


DEFAULTS = Opts()


def brute_force_rule(time, peak, b, f, r, cap, opts=DEFAULTS):
    """The documented rule written out: best score, ties within tol, least energy × r."""
    cells = feasible_list(time, peak, cap, opts.margin, opts.sigma, opts.k)
    if not cells:
        return None
    power = peak if opts.avg is None else opts.avg

    def score(i, j):
        return time[i][j] * r[i]

    def to_acc(i, j):
        return power[i][j] * time[i][j] * r[i]

    threshold = min(score(i, j) for i, j in cells) * (1 + opts.tol)
    tied = [(i, j) for i, j in cells if score(i, j) <= threshold]
    rows = sorted({i for i, _ in tied})
    pick = {i: min((to_acc(i, j), j) for ii, j in tied if ii == i)[1] for i in rows}
    i = min(rows, key=lambda i: (to_acc(i, pick[i]), score(i, pick[i]), -b[i]))
    return b[i], f[pick[i]]


def literal_eq4_score(time, peak, r, cap, *, margin=0.0, sigma=None, k=2.0):
    """Eq. 4 as the paper states it, on the same feasible cells: each b at its highest
    feasible f; the best time × r over those (None: no feasible cell)."""
    cells = feasible_list(time, peak, cap, margin, sigma, k)
    highest: dict[int, int] = {}
    for i, j in cells:
        highest[i] = max(highest.get(i, -1), j)
    return min((time[i][j] * r[i] for i, j in highest.items()), default=None)


# --------------------------------------------------------------------------- strategies

SHAPES = st.sampled_from([(1, 1), (1, 6), (2, 3), (3, 5), (4, 12), (6, 14)])
R_VALUE = st.floats(0.01, 1.0)
TIME = st.floats(0.1, 10.0)
STEP = st.floats(0.0, 2.0)


@st.composite
def noisy_tables(draw):
    """Rows that are non-monotone, flat, with holes and with a noisy low-f spike."""
    n_b, n_f = draw(SHAPES)
    # time: falling with f, then noise of up to ±30% (so not monotone), or a flat row
    fall = np.cumsum(draw(hnp.arrays(np.float64, (n_b, n_f), elements=STEP)), axis=1)[:, ::-1]
    noise = draw(hnp.arrays(np.float64, (n_b, n_f), elements=st.floats(0.7, 1.3)))
    time = (1.0 + fall) * noise
    # power: rising with f plus noise (so not monotone either)
    rise = np.cumsum(draw(hnp.arrays(np.float64, (n_b, n_f), elements=STEP)), axis=1)
    power = 1.0 + rise + draw(hnp.arrays(np.float64, (n_b, n_f), elements=st.floats(-0.5, 0.5)))
    for i in range(n_b):
        kind = draw(st.sampled_from(["noisy", "noisy", "flat-time", "flat-both", "spike"]))
        if kind in ("flat-time", "flat-both"):
            time[i] = time[i, 0]
        if kind == "flat-both":
            power[i] = power[i, 0]
        if kind == "spike":  # the lowest f reads far above everything else in its row
            power[i, 0] = power[i].max() + draw(st.floats(0.1, 5.0))
    if draw(st.booleans()):  # coarse readings: many exact and near ties
        time = np.round(time, 1)
    holes = draw(hnp.arrays(np.bool_, (n_b, n_f), elements=st.booleans()))
    holes[draw(st.integers(0, n_b - 1)), draw(st.integers(0, n_f - 1))] = False
    time[holes] = np.nan
    power[holes] = np.nan
    r = draw(st.lists(R_VALUE, min_size=n_b, max_size=n_b))
    cap = draw(st.one_of(st.just(math.inf), st.floats(0.5, float(np.nanmax(power)) + 1.0)))
    return time, power, B6[:n_b], F14[:n_f], r, cap


@st.composite
def extras(draw, shape):
    """Optional σ of per-step peaks (with NaN = not recorded) and average power tables."""
    sigma = draw(
        st.one_of(
            st.none(),
            hnp.arrays(np.float64, shape, elements=st.one_of(st.floats(0.0, 0.5), st.just(np.nan))),
        )
    )
    share = draw(st.one_of(st.none(), hnp.arrays(np.float64, shape, elements=st.floats(0.3, 1.0))))
    rule = Objective(
        peak_sigma_k=draw(st.sampled_from([0.0, 1.0, 2.0])),
        tie_tolerance=draw(st.sampled_from([0.0, 0.02, 0.1])),
    )
    margin = draw(st.sampled_from([0.0, 0.05]))
    return sigma, share, rule, margin


def run(tables, opts):
    time, power, b, f, r, cap = tables
    rule = Objective(peak_sigma_k=opts.k, tie_tolerance=opts.tol)
    return select_eq4(
        Tables(time, power, opts.avg, opts.sigma),
        b,
        f,
        r,
        PowerLimit(cap, opts.margin),
        method=Method(objective=rule),
    )


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(data=st.data(), tables=noisy_tables())
def test_rule_properties_on_noisy_tables(data, tables):
    time, power, b, f, r, cap = tables
    sigma, share, rule, margin = data.draw(extras(time.shape))
    avg = None if share is None else power * share
    opts = Opts(margin, sigma, rule.peak_sigma_k, rule.tie_tolerance, avg)
    cells = feasible_list(time, power, cap, margin, sigma, opts.k)
    if not cells:  # never "infeasible" while a feasible cell exists, and only then
        with pytest.raises(InfeasibleCapError):
            run(tables, opts)
        return
    sel = run(tables, opts)
    i, j = b.index(sel.batch_size), f.index(sel.knob_value)
    assert (i, j) in cells  # the choice is feasible by its own robust peak
    eq4 = literal_eq4_score(time, power, r, cap, margin=margin, sigma=sigma, k=opts.k)
    assert sel.score <= eq4 * (1 + opts.tol)  # never slower than Eq. 4 beyond the tolerance
    assert (sel.batch_size, sel.knob_value) == brute_force_rule(time, power, b, f, r, cap, opts)
    # the candidate set: one feasible cell per b that has one, the choice among them
    for ci, c in enumerate(sel.candidates):
        has = any(ii == ci for ii, _ in cells)
        assert (c.knob_value is not None) == has
        if has:
            assert (ci, f.index(c.knob_value)) in cells
    assert sel.candidates[i].knob_value == sel.knob_value
    limit = None if math.isinf(cap) else cap * (1 - margin)
    mask = feasible_cells(power, limit, peak_sigma_w=sigma, peak_sigma_k=opts.k)
    assert mask.tolist() == [[(ii, jj) in cells for jj in range(len(f))] for ii in range(len(b))]


@settings(max_examples=200, deadline=None)
@given(noisy_tables())
def test_defaults_against_literal_eq4_and_the_old_prefix_rule(tables):
    """With the defaults (k·σ without σ is the profiled peak), the choice is at least as
    fast as literal Eq. 4 within 2%, and feasible wherever the old running-maximum rule
    found a row feasible."""
    time, power, b, f, r, cap = tables
    old_rows = feasible_knob_indices(power, None if math.isinf(cap) else cap)
    if not (power < cap).any():
        assert all(j is None for j in old_rows)
        with pytest.raises(InfeasibleCapError):
            select_eq4(Tables(time, power), b, f, r, cap)
        return
    sel = select_eq4(Tables(time, power), b, f, r, cap)
    assert sel.peak_power_w < cap
    assert sel.score <= literal_eq4_score(time, power, r, cap) * 1.02
    for c, old_j in zip(sel.candidates, old_rows, strict=True):
        if old_j is not None:  # a row the old rule could use stays usable
            assert c.knob_value is not None


@settings(max_examples=150, deadline=None)
@given(tables=noisy_tables(), over=st.floats(0.01, 3.0))
def test_a_cell_above_the_cap_at_every_rows_lowest_f(tables, over):
    """Issue 13's refusals: each row's lowest measured f reads above the cap."""
    time, power, b, f, r, cap = tables
    if math.isinf(cap):
        cap = float(np.nanmax(power))
    for i in range(len(b)):
        measured = np.flatnonzero(~np.isnan(power[i]))
        if measured.size:
            power[i, measured[0]] = cap + over
    cells = feasible_list(time, power, cap, 0.0, None, 0.0)
    if not cells:
        with pytest.raises(InfeasibleCapError):
            select_eq4(Tables(time, power), b, f, r, cap)
        return
    sel = select_eq4(Tables(time, power), b, f, r, cap)
    assert (b.index(sel.batch_size), f.index(sel.knob_value)) in cells
    assert sel.score <= literal_eq4_score(time, power, r, cap) * 1.02


# --------------------------------------------------------------------------- fixtures

FREQS = [100.0, 200.0, 300.0, 400.0]


def test_a_spike_at_the_lowest_f_no_longer_removes_the_row():
    # Every row reads above the 5 W cap at its lowest f (noise, or a knob that does not
    # bind there): the old running-maximum rule refused to train; each cell on its own
    # leaves the rest of the row.
    time = np.array([[4.0, 3.0, 2.0, 1.5], [3.0, 2.0, 1.4, 1.0]])
    power = np.array([[5.6, 3.0, 3.5, 4.0], [6.0, 3.5, 4.2, 5.2]])
    assert feasible_knob_indices(power, 5.0) == [None, None]
    sel = select_eq4(Tables(time, power), [8, 16], FREQS, [1.0, 1.0], 5.0)
    assert (sel.batch_size, sel.knob_value) == (16, 300.0)
    assert [c.knob_value for c in sel.candidates] == [400.0, 300.0]


def test_a_flat_row_takes_its_least_energy_cell():
    # b=8's time does not change with f while its power rises: all four cells tie, and the
    # lowest f uses the least energy; b=16 is 10% slower, outside the tolerance.
    time = np.array([[1.0, 1.0, 1.0, 1.0], [1.1, 1.1, 1.1, 1.1]])
    power = np.array([[2.0, 2.5, 3.0, 3.5], [1.0, 1.0, 1.0, 1.0]])
    sel = select_eq4(Tables(time, power), [8, 16], FREQS, [1.0, 1.0], 5.0)
    assert (sel.batch_size, sel.knob_value) == (8, 100.0)
    assert sel.energy_per_sample_j == pytest.approx(2.0)
    # literal Eq. 4 would run b=8 at 400 MHz: as fast, 75% more energy
    exact = select_eq4(
        Tables(time, power),
        [8, 16],
        FREQS,
        [1.0, 1.0],
        5.0,
        method=Method(objective=Objective(tie_tolerance=0.0)),
    )
    assert (exact.batch_size, exact.knob_value) == (8, 100.0)  # exact tie: the lower f
    # a flat row in both time and power: every cell equal, the lowest f
    flat = select_eq4(Tables(time[:1], np.full((1, 4), 2.0)), [8], FREQS, [1.0], 5.0)
    assert flat.knob_value == 100.0


def test_the_fastest_feasible_cell_can_be_below_the_highest_feasible_f():
    # Memory-bound past 200 MHz: time stops falling and rises again while power climbs.
    time = np.array([[2.0, 1.0, 1.2, 1.3]])
    power = np.array([[2.0, 2.5, 3.0, 3.5]])
    sel = select_eq4(Tables(time, power), [8], FREQS, [1.0], 5.0)
    assert sel.knob_value == 200.0  # literal Eq. 4 takes 400 MHz, 30% slower


def test_energy_ties_use_average_power_when_given():
    # Two cells within 2%: by peak power × time b=8@400 MHz wins, by average power b=16.
    time = np.array([[np.nan, np.nan, np.nan, 1.00], [np.nan, np.nan, np.nan, 1.01]])
    peak = np.where(np.isnan(time), np.nan, np.array([[0, 0, 0, 3.0], [0, 0, 0, 3.2]]))
    avg = np.where(np.isnan(time), np.nan, np.array([[0, 0, 0, 2.9], [0, 0, 0, 2.0]]))
    by_peak = select_eq4(Tables(time, peak), [8, 16], FREQS, [1.0, 1.0], 5.0)
    by_avg = select_eq4(Tables(time, peak, avg), [8, 16], FREQS, [1.0, 1.0], 5.0)
    assert (by_peak.batch_size, by_avg.batch_size) == (8, 16)
    assert by_avg.energy_per_sample_j == pytest.approx(2.0 * 1.01)


def test_energy_to_accuracy_weighs_each_b_by_r():
    # Same time × r; b=8 draws less power per sample but needs twice the samples.
    time = np.array([[0.5], [1.0]])
    power = np.array([[3.0], [2.0]])
    sel = select_eq4(Tables(time, power), [8, 16], [500.0], [1.0, 0.5], 5.0)
    assert sel.batch_size == 16  # 3.0 × 0.5 × 1.0 = 1.5 J > 2.0 × 1.0 × 0.5 = 1.0 J


def test_sigma_makes_a_cell_infeasible_and_the_error_says_so():
    time = np.array([[2.0, 1.0]])
    power = np.array([[3.0, 4.6]])
    sigma = np.array([[0.05, 0.3]])
    sel = select_eq4(Tables(time, power, peak_sigma_w=sigma), [8], [100.0, 200.0], [1.0], 5.0)
    assert sel.knob_value == 100.0  # 4.6 + 2 × 0.3 = 5.2 W is not below 5 W
    lenient = Objective(peak_sigma_k=1.0)
    assert (
        select_eq4(
            Tables(time, power, peak_sigma_w=sigma),
            [8],
            [100.0, 200.0],
            [1.0],
            5.0,
            method=Method(objective=lenient),
        ).knob_value
        == 200.0
    )
    with pytest.raises(InfeasibleCapError) as info:
        select_eq4(Tables(time, power, peak_sigma_w=sigma), [8], [100.0, 200.0], [1.0], 3.05)
    err = info.value
    assert err.min_power_w == pytest.approx(3.1) and err.sigma_term_w == pytest.approx(0.1)
    assert "peak + peak-sigma-k·σ" in str(err) and "lower peak-sigma-k" in str(err)
    # NaN σ (not recorded) counts as 0
    nan_sigma = np.array([[np.nan, np.nan]])
    sel = select_eq4(Tables(time, power, peak_sigma_w=nan_sigma), [8], [100.0, 200.0], [1.0], 5.0)
    assert sel.knob_value == 200.0


def test_feasible_cells():
    peak = np.array([[5.5, 3.0, np.nan, 4.9]])
    assert feasible_cells(peak, 5.0).tolist() == [[False, True, False, True]]
    assert feasible_cells(peak, None).tolist() == [[True, True, False, True]]
    sigma = np.array([[0.0, 0.0, 0.0, 0.1]])
    assert feasible_cells(peak, 5.0, peak_sigma_w=sigma).tolist() == [[False, True, False, False]]
    assert feasible_cells(peak[0], math.inf).tolist() == [True, True, False, True]
    with pytest.raises(ValueError, match="peak-sigma-k"):
        feasible_cells(peak, 5.0, peak_sigma_k=-1.0)


def test_extra_tables_are_checked():
    time = np.array([[1.0, np.nan]])
    power = np.array([[2.0, np.nan]])
    with pytest.raises(ValueError, match=r"lut_avg_power_w: NaN \(not profiled\) at different"):
        select_eq4(Tables(time, power, avg_w=[[np.nan, np.nan]]), [8], [1.0, 2.0], [1.0], 5.0)
    with pytest.raises(ValueError, match=r"lut_peak_sigma_w: profiled cells must be finite"):
        select_eq4(Tables(time, power, peak_sigma_w=[[-1.0, 0.0]]), [8], [1.0, 2.0], [1.0], 5.0)
    with pytest.raises(ValueError, match=r"lut_peak_sigma_w: shape \(1, 1\)"):
        select_eq4(Tables(time, power, peak_sigma_w=[[0.1]]), [8], [1.0, 2.0], [1.0], 5.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"peak_sigma_k": -0.5}, "peak-sigma-k"),
        ({"peak_sigma_k": math.inf}, "peak-sigma-k"),
        ({"tie_tolerance": 1.0}, "tie-tolerance"),
        ({"tie_tolerance": -0.01}, "tie-tolerance"),
        ({"tie_tolerance": True}, "tie-tolerance"),
    ],
)
def test_selection_rule_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Objective(**kwargs)


def test_selection_rule_from_config():
    assert Objective.from_config({}) == Objective()
    rule = Objective.from_config({"peak-sigma-k": 3.0, "tie-tolerance": 0.05, "x": 1})
    assert (rule.peak_sigma_k, rule.tie_tolerance) == (3.0, 0.05)


def test_select_passes_the_rule_and_extra_tables():
    time = np.array([[1.0, 1.0, 1.0, 1.0]])
    power = np.array([[2.0, 2.5, 3.0, 3.5]])
    common: dict[str, Any] = {"batch_sizes": [8], "knob_values": FREQS, "r": [1.0], "limit": 5.0}
    grouped = select("power-aware", tables=Tables(time, power), **common)
    assert grouped.knob_value == 100.0
    sigma = np.array([[0.0, 0.0, 0.0, 0.0]])
    avg = power[:, ::-1].copy()  # the average makes the highest f the cheapest
    sel = select("oracle", tables=Tables(time, power, avg, sigma), **common)
    assert (sel.method, sel.knob_value) == ("oracle", 400.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lut_time_s'"):
        select("power-aware", tables=Tables(time, power), lut_time_s=time, **common)  # type: ignore[call-arg]


def test_the_knob_labels_every_method():
    time = np.array([[2.0, 1.0]])
    power = np.array([[100.0, 150.0]])
    limits = [100.0, 150.0]
    watts = Tables(time, power, knob=GPU_POWER_LIMIT_W)
    sel = select(
        "power-aware", batch_sizes=[8], knob_values=limits, tables=watts, r=[1.0], limit=200.0
    )
    assert (sel.knob_value, sel.knob) == (150.0, GPU_POWER_LIMIT_W)
    d = sel.to_dict()
    assert d["gpu-power-limit-w"] == 150.0 and "gpu-freq-mhz" not in d
    assert d["candidates"][0]["gpu-power-limit-w"] == 150.0 and d["knob-unit"] == "W"
    b1 = select(
        Method("b1", b1_max_knob_value=120.0), batch_sizes=[8], knob_values=limits, tables=watts
    )
    assert (b1.knob_value, b1.knob) == (100.0, GPU_POWER_LIMIT_W)
    fixed = select(
        Method("fixed", knob=GPU_POWER_LIMIT_W, fixed_batch_size=8, fixed_knob_value=150.0),
        batch_sizes=[8],
        knob_values=limits,
    )
    assert fixed.knob is GPU_POWER_LIMIT_W
    mhz = select(
        "power-aware",
        batch_sizes=[8],
        knob_values=limits,
        tables=Tables(time, power),
        r=[1.0],
        limit=200.0,
    )
    assert mhz.knob is GPU_FREQ_MHZ and mhz.to_dict()["gpu-freq-mhz"] == 150.0
    assert mhz.to_dict()["predicted-energy-per-sample-j"] == pytest.approx(150.0)
