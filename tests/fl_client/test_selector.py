"""fl_client.selector: Eq. 4 against brute force, the dispatch, choose_cell, the objective
and the round context, and input errors."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fl_client import selector
from fl_client.power import PowerLimit
from fl_client.selection import InfeasibleCapError, Tables
from fl_client.selector import METHODS, Method, Objective, choose_cell, select, select_eq4

NANO_FREQS_MHZ = [round(76.8 * k, 1) for k in range(1, 13)]  # 76.8 … 921.6
B6 = [4, 8, 16, 32, 64, 128]
F14 = [100.0 * k for k in range(1, 15)]


# --------------------------------------------------------------------------- brute force


def _key(score: float, power_w: float, b: int) -> tuple[float, float, int]:
    return (score, power_w, -b)


def brute_force_eq4_literal(time_s, power_w, batch_sizes, knob_values, r, p_max_w):
    """Eq. 4 as written: j_i = max{j : P[i, j] < P_max}; argmin T × r over C."""
    best = None
    for i, b in enumerate(batch_sizes):
        feasible = [j for j in range(len(knob_values)) if power_w[i][j] < p_max_w]
        if not feasible:
            continue
        j = max(feasible)
        key = _key(time_s[i][j] * r[i], power_w[i][j], b)
        if best is None or key < best[0]:
            best = (key, b, knob_values[j])
    return None if best is None else best[1:]


# --------------------------------------------------------------------------- strategies

POS = st.floats(0.01, 10.0, allow_nan=False, allow_infinity=False)
R_VALUE = st.floats(0.01, 1.0, allow_nan=False)
SHAPES = st.sampled_from([(1, 1), (2, 3), (3, 5), (4, 12), (6, 14)])


def _table(n_b: int, n_f: int, elements=POS):
    return hnp.arrays(np.float64, (n_b, n_f), elements=elements)


@st.composite
def monotone_tables(draw, shape=SHAPES):
    """The paper's premise: power rises and time per sample falls as f rises."""
    n_b, n_f = draw(shape)
    power = np.cumsum(draw(_table(n_b, n_f)), axis=1)
    time = np.cumsum(draw(_table(n_b, n_f)), axis=1)[:, ::-1].copy()
    r = draw(st.lists(R_VALUE, min_size=n_b, max_size=n_b))
    cap = draw(st.floats(0.005, float(power.max()) * 1.2 + 1, allow_nan=False))
    return time, power, B6[:n_b], F14[:n_f], r, cap


EXACT = Objective(tie_tolerance=0.0)


@st.composite
def noisy_tables(draw, shape=SHAPES):
    n_b, n_f = draw(shape)
    power, time = draw(_table(n_b, n_f)), draw(_table(n_b, n_f))
    holes = draw(_table(n_b, n_f, st.booleans()).map(lambda a: a.astype(bool)))
    holes[0, 0] = False  # at least one profiled cell
    power[holes] = np.nan
    time[holes] = np.nan
    r = draw(st.lists(R_VALUE, min_size=n_b, max_size=n_b))
    cap = draw(st.floats(0.005, 12.0, allow_nan=False))
    return time, power, B6[:n_b], F14[:n_f], r, cap


# --------------------------------------------------------------------------- Eq. 4


@settings(max_examples=150, deadline=None)
@given(monotone_tables())
def test_power_aware_equals_literal_eq4_where_the_papers_premise_holds(tables):
    # Changed with issue 13: Eq. 4 is now the fastest feasible cell of the whole table, so
    # it equals "each b at its highest feasible f" where time falls with f, and with no
    # tie tolerance (the default 2% would let a cheaper, nearly as fast cell win).
    time, power, b, f, r, cap = tables
    expected = brute_force_eq4_literal(time, power, b, f, r, cap)
    if expected is None:
        with pytest.raises(InfeasibleCapError):
            select_eq4(Tables(time, power), b, f, r, cap, method=Method(objective=EXACT))
        return
    sel = select_eq4(Tables(time, power), b, f, r, cap, method=Method(objective=EXACT))
    assert (sel.batch_size, sel.knob_value) == expected
    assert sel.peak_power_w < cap
    i, j = b.index(sel.batch_size), f.index(sel.knob_value)
    assert sel.time_per_sample_s == time[i, j]
    assert sel.score == pytest.approx(time[i, j] * r[i])


@settings(max_examples=150, deadline=None)
@given(noisy_tables())
def test_power_aware_never_uses_a_cell_above_the_cap_on_noisy_tables_with_holes(tables):
    # Changed with issue 13: each cell is judged on its own (no running maximum), so a
    # row's cells above a noisy one stay usable; the full rule is checked against brute
    # force in test_selector_noisy.py.
    time, power, b, f, r, cap = tables
    if not (power < cap).any():
        with pytest.raises(InfeasibleCapError):
            select_eq4(Tables(time, power), b, f, r, cap)
        return
    sel = select_eq4(Tables(time, power), b, f, r, cap)
    assert sel.peak_power_w < cap  # never above the cap
    for i, c in enumerate(sel.candidates):
        if c.knob_value is None:
            assert not (power[i] < cap).any()
        else:
            assert power[i, f.index(c.knob_value)] < cap


@settings(max_examples=60, deadline=None)
@given(monotone_tables(shape=st.just((6, 14))))
def test_paper_sized_tables_6x14(tables):
    time, power, b, f, r, cap = tables
    expected = brute_force_eq4_literal(time, power, b, f, r, cap)
    if expected is None:
        with pytest.raises(InfeasibleCapError):
            select_eq4(Tables(time, power), b, f, r, cap, method=Method(objective=EXACT))
    else:
        sel = select_eq4(Tables(time, power), b, f, r, cap, method=Method(objective=EXACT))
        assert (sel.batch_size, sel.knob_value) == expected
        assert len(sel.candidates) == 6


def test_no_cap_picks_fastest_score_at_highest_frequency():
    time = np.array([[4.0, 2.0, 1.0], [3.0, 1.5, 0.6]])
    power = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]])
    sel = select_eq4(Tables(time, power), [8, 16], [100.0, 200.0, 300.0], [0.5, 1.0], "none")
    # scores at the top frequency: 1.0 × 0.5 = 0.5 vs 0.6 × 1.0 = 0.6
    assert (sel.batch_size, sel.knob_value, sel.p_max_w) == (8, 300.0, None)
    sel = select_eq4(Tables(time, power), [8, 16], [100.0, 200.0, 300.0], [0.5, 1.0], 3.5)
    # under 3.5 W: b=8 → 300 MHz (0.5); b=16 → 100 MHz (3.0)
    assert (sel.batch_size, sel.knob_value, sel.p_max_w) == (8, 300.0, 3.5)
    assert [c.knob_value for c in sel.candidates] == [300.0, 100.0]
    assert sel.to_dict()["candidates"][1]["score"] == pytest.approx(3.0)


def test_paper_figure_1_example_prefers_smaller_batch_at_higher_frequency():
    # Nano under 5 W: b=128 feasible to 307 MHz, b=64 to 460 MHz, 31.9 % faster per sample.
    freqs = [230.4, 307.2, 384.0, 460.8, 537.6]
    time = np.array([[1.5, 1.3, 1.1, 0.9, 0.8], [1.4, 1.3220, 1.1, 1.0, 0.9]]) * 1e-3
    time[0, 3] = time[1, 1] * (1 - 0.319)
    power = np.array([[3.5, 4.0, 4.5, 4.9, 5.4], [4.0, 4.8, 5.3, 5.9, 6.4]])
    sel = select_eq4(Tables(time, power), [64, 128], freqs, [1.0, 1.0], 5.0)
    assert (sel.batch_size, sel.knob_value) == (64, 460.8)


def test_ties_go_to_lower_power_then_larger_batch():
    time = np.array([[1.0], [1.0]])
    sel = select_eq4(Tables(time, np.array([[2.0], [2.0]])), [8, 16], [500.0], [1.0, 1.0], 5.0)
    assert sel.batch_size == 16
    sel = select_eq4(Tables(time, np.array([[1.5], [2.0]])), [8, 16], [500.0], [1.0, 1.0], 5.0)
    assert sel.batch_size == 8


def test_infeasible_cap_names_cap_and_lowest_measured_power():
    power = np.array([[np.nan, 3.2, 3.9], [3.6, 4.0, np.nan]])
    time = np.where(np.isnan(power), np.nan, 1.0)
    with pytest.raises(InfeasibleCapError) as info:
        select_eq4(Tables(time, power), [4, 8], [76.8, 153.6, 230.4], [1.0, 1.0], 3.0)
    err = info.value
    assert (err.limit.p_max_w, err.min_power_w, err.batch_size, err.knob_value) == (
        3.0,
        3.2,
        4,
        153.6,
    )
    msg = str(err)
    assert "p-max-w" in msg and "3 W" in msg and "3.200 W" in msg
    assert "b=4" in msg and "153.6 MHz" in msg
    assert isinstance(err, ValueError)


def test_cap_margin_keeps_profiled_peaks_below_the_reduced_cap():
    # b=8 peaks at 4.9 W at 300 MHz and 4.6 W at 200 MHz under a 5 W cap
    time = np.array([[3.0, 2.0, 1.5], [2.5, 1.2, 0.9]])
    power = np.array([[3.0, 4.6, 4.9], [4.0, 5.5, 6.0]])
    args = (Tables(time, power), [8, 16], [100.0, 200.0, 300.0], [1.0, 1.0])
    bare = select_eq4(*args, 5.0)
    assert (bare.batch_size, bare.knob_value) == (8, 300.0)
    # 5 % of 5 W leaves 4.75 W: 4.9 W no longer fits, 4.6 W does
    kept = select_eq4(*args, PowerLimit(5.0, 0.05))
    assert (kept.batch_size, kept.knob_value, kept.p_max_w) == (8, 200.0, 5.0)
    assert (
        select(
            "power-aware",
            batch_sizes=[8, 16],
            knob_values=[100.0, 200.0, 300.0],
            tables=Tables(time, power),
            r=[1.0, 1.0],
            limit=PowerLimit(5.0, 0.05),
        )
        == kept
    )
    # without a cap the margin changes nothing
    assert select_eq4(*args, PowerLimit(math.inf, 0.5)) == select_eq4(*args, math.inf)
    with pytest.raises(InfeasibleCapError) as info:
        select_eq4(*args, PowerLimit(3.1, 0.05))
    assert info.value.limit == PowerLimit(3.1, 0.05)
    assert "less cap-margin 5% (2.945 W)" in str(info.value)
    assert "Raise p-max-w above 3.158 W, lower cap-margin" in str(info.value)


def test_oracle_is_eq4_with_its_own_r():
    time = np.array([[2.0, 1.0], [1.2, 0.55]])
    power = np.array([[1.0, 2.0], [2.0, 4.0]])
    args = (Tables(time, power), [8, 16], [100.0, 200.0])
    proxy = select_eq4(*args, [0.5, 1.0], 5.0)
    oracle = select_eq4(*args, [1.0, 0.4], 5.0, method=Method(name="oracle"))
    assert (proxy.method, proxy.batch_size) == ("power-aware", 8)
    assert (oracle.method, oracle.batch_size, oracle.knob_value) == ("oracle", 16, 200.0)


def test_dispatcher_matches_the_functions_and_rejects_unknown_methods():
    time = np.array([[2.0, 1.0], [1.2, 0.55]])
    power = np.array([[1.0, 2.0], [2.0, 4.0]])
    common: dict[str, Any] = {
        "tables": Tables(time, power),
        "batch_sizes": [8, 16],
        "knob_values": [100.0, 200.0],
    }
    assert select("power-aware", **common, r=[0.5, 1.0], limit=5.0) == select_eq4(
        Tables(time, power), [8, 16], [100.0, 200.0], [0.5, 1.0], 5.0
    )
    assert select("oracle", **common, r=[1.0, 0.4], limit=math.inf).batch_size == 16
    assert select(Method("b1", b1_max_knob_value=150.0), **common).knob_value == 100.0
    assert select(Method("b2", b1_max_knob_value=200.0), **common, r=[0.5, 1.0]).batch_size == 8
    assert (
        select(Method("fixed", fixed_batch_size=16, fixed_knob_value=200.0), **common).batch_size
        == 16
    )
    assert {m for m in METHODS} == {"power-aware", "b1", "b2", "oracle", "fixed"}
    with pytest.raises(ValueError, match=r"method: unknown value 'fast'; allowed: power-aware, b1"):
        select("fast", **common)
    with pytest.raises(ValueError, match=r"p-max-w: required by method 'power-aware'"):
        select("power-aware", r=[0.5, 1.0], **common)
    with pytest.raises(ValueError, match=r"b1-freq-cap-mhz: required by method 'b2'"):
        select("b2", r=[0.5, 1.0], **common)


def test_table_errors_name_the_table():
    f = [100.0, 200.0]
    with pytest.raises(ValueError, match=r"lut_time_s: shape \(1, 2\) does not match"):
        select_eq4(Tables([[1.0, 1.0]], [[1.0, 1.0]]), [4, 8], f, [1.0, 1.0], 5.0)
    with pytest.raises(ValueError, match=r"NaN \(not profiled\) at different cells"):
        select_eq4(Tables([[1.0, np.nan]], [[1.0, 1.0]]), [4], f, [1.0], 5.0)
    with pytest.raises(ValueError, match=r"lut_time_s: profiled cells must be finite and > 0"):
        select_eq4(Tables([[1.0, -1.0]], [[1.0, 1.0]]), [4], f, [1.0], 5.0)
    with pytest.raises(ValueError, match=r"no cell was profiled"):
        select_eq4(Tables([[np.nan, np.nan]], [[np.nan, np.nan]]), [4], f, [1.0], 5.0)
    with pytest.raises(ValueError, match=r"freqs-mhz: .* not strictly ascending"):
        select_eq4(Tables([[1.0, 1.0]], [[1.0, 1.0]]), [4], [200.0, 100.0], [1.0], 5.0)


# --------------------------------------------------------------------------- choose_cell


def test_choose_cell_is_eq4_on_bare_tables() -> None:
    time_s = np.array([[4.0, 2.0, 1.00], [3.0, 1.5, 1.01]])
    peak = np.array([[1.0, 2.0, 3.0], [1.0, 2.5, 5.0]])
    r = [1.0, 1.0]
    exact = Objective(tie_tolerance=0.0)
    assert choose_cell(Tables(time_s, peak, peak), r, math.inf, objective=exact) == (0, 2)
    # within the tie tolerance the lower energy wins: 1.01 × 5 > 1.00 × 3
    assert choose_cell(Tables(time_s, peak, peak), r, math.inf) == (0, 2)
    assert choose_cell(Tables(time_s, peak, peak), r, 4.0) == (0, 2)
    assert choose_cell(Tables(time_s, peak, peak), r, 2.9) == (1, 1)
    assert choose_cell(Tables(time_s, peak, peak), r, 0.5) is None
    # the cap with its margin: 3.0 W less 5% leaves 2.85 W, which 3.0 W breaks
    assert choose_cell(Tables(time_s, peak, peak), r, PowerLimit(3.0, 0.05)) == (1, 1)
    nan = np.where(peak > 2.0, np.nan, time_s)
    assert choose_cell(Tables(nan, np.where(np.isnan(nan), np.nan, peak), peak), r, math.inf) == (
        0,
        1,
    )
    # σ of the per-step peaks: 3.0 + 2·0.6 W is over 4 W
    sigma = np.full_like(peak, 0.6)
    assert choose_cell(Tables(time_s, peak, peak, sigma), r, 4.0) == (1, 1)


# ----------------------------------------------------------------- objective, round context


def _context_case() -> tuple[Tables, list[int], list[float], list[float]]:
    # b = 8 (r 0.3) is slow and sample-efficient; b = 32 (r 1.0) fast; avg power per cell
    time = np.array([[0.04, 0.03, 0.025], [0.02, 0.012, 0.010]])
    peak = np.array([[2.0, 3.0, 4.0], [3.0, 4.0, 5.0]])
    avg = np.array([[1.0, 1.6, 2.5], [1.5, 2.4, 3.6]])
    return Tables(time, peak, avg), [8, 32], [300.0, 600.0, 900.0], [0.3, 1.0]


def _within(budget_s: float, batch_size: int | None = None) -> selector.RoundContext:
    """A round of 100 samples within ``budget_s``."""
    return selector.RoundContext(budget_s=budget_s, samples=100, batch_size=batch_size)


def test_the_default_objective_and_round_context_are_eq4() -> None:
    tables, b, f, r = _context_case()
    plain = selector.select_eq4(tables, b, f, r, 6.0)
    assert (
        selector.select_eq4(
            tables, b, f, r, 6.0, method=Method(objective=selector.EQ4, context=selector.ANY_ROUND)
        )
        == plain
    )
    assert (plain.batch_size, plain.knob_value) == (8, 900.0)  # 0.025 × 0.3 < 0.010 × 1.0


def test_the_pace_setter_takes_its_fastest_cell_whatever_its_r() -> None:
    tables, b, f, r = _context_case()
    pace = selector.EQ4.for_pace()
    assert (pace.time_weight, pace.r_weight, pace.energy_weight) == (1.0, 0.0, 0.0)
    fastest = selector.select_eq4(tables, b, f, r, 6.0, method=Method(objective=pace))
    assert (fastest.batch_size, fastest.knob_value) == (32, 900.0)


def test_samples_and_energy_modes_meet_the_deadline() -> None:
    tables, b, f, r = _context_case()
    # 100 samples within 3.1 s: only cells of ≤ 0.031 s per sample meet it
    samples = Objective(time_weight=0.0)
    pick = selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=samples, context=_within(3.1))
    )
    # the least r that meets it (b = 8), at its least energy to accuracy among those
    assert (pick.batch_size, pick.knob_value) == (8, 600.0)  # 1.6 × 0.03 < 2.5 × 0.025
    energy = Objective(energy_weight=1.0)
    pick = selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=energy, context=_within(1.3))
    )
    # within 1.3 s only b = 32 at 600 / 900 MHz; 2.4 × 0.012 < 3.6 × 0.010
    assert (pick.batch_size, pick.knob_value) == (32, 600.0)


def test_the_energy_mode_scores_the_energy_above_idle() -> None:
    tables, b, f, r = _context_case()
    # within 2.1 s only b = 32 meets it, at 300, 600 and 900 MHz (2.0, 1.2 and 1.0 s)
    total = Objective(energy_weight=1.0)
    pick = selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=total, context=_within(2.1))
    )
    # total energy per sample: 1.5 × 0.02 = 0.030, 2.4 × 0.012 = 0.0288, 3.6 × 0.010 = 0.036
    assert (pick.batch_size, pick.knob_value) == (32, 600.0)
    above = total.but(idle_power_w=1.2)
    pick = selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=above, context=_within(2.1))
    )
    # above 1.2 W idle: 0.3 × 0.02 = 0.006, 1.2 × 0.012 = 0.0144, 2.4 × 0.010 = 0.024
    assert (pick.batch_size, pick.knob_value) == (32, 300.0)
    # batch_size keeps one b's row: the energy mode at the node's own b* (here b = 8, whose
    # cells all miss 2.1 s: the fallback is that row's fastest cell, not b = 32's)
    pick = selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=above, context=_within(2.1, 8))
    )
    assert (pick.batch_size, pick.knob_value) == (8, 900.0)
    roomy = total.but(idle_power_w=0.9)
    pick = selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=roomy, context=_within(5.0, 8))
    )
    # b = 8 above 0.9 W idle: 0.04 × 0.1 = 0.004, 0.03 × 0.7 = 0.021, 0.025 × 1.6 = 0.04
    assert (pick.batch_size, pick.knob_value) == (8, 300.0)
    with pytest.raises(ValueError, match=r"^batch-size: 16 is not one of"):
        selector.select_eq4(
            tables, b, f, r, 6.0, method=Method(context=selector.RoundContext(batch_size=16))
        )
    # idle power alone does nothing without an energy weight
    plain = Objective(idle_power_w=1.2)
    assert selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=plain, context=_within(2.1))
    ) == selector.select_eq4(tables, b, f, r, 6.0, method=Method(context=_within(2.1)))


def test_a_deadline_no_cell_meets_gives_the_fastest_cell() -> None:
    tables, b, f, r = _context_case()
    least_r = Objective(time_weight=0.0)
    pick = selector.select_eq4(
        tables, b, f, r, 6.0, method=Method(objective=least_r, context=_within(0.1))
    )
    assert (pick.batch_size, pick.knob_value) == (32, 900.0)
    # under a 4.5 W cap the fastest feasible cell is b = 32 at 600 MHz
    pick = selector.select_eq4(
        tables, b, f, r, 4.5, method=Method(objective=least_r, context=_within(0.1))
    )
    assert (pick.batch_size, pick.knob_value) == (32, 600.0)


def test_objective_scores_are_eq4_by_default_and_weigh_each_term() -> None:
    time = np.array([[0.04, np.nan], [0.02, 0.01]])
    r = [0.5, 1.0]
    power = np.array([[2.0, np.nan], [3.0, 4.0]])
    np.testing.assert_array_equal(selector.EQ4.scores(time, r), time * np.array([[0.5], [1.0]]))
    fastest = selector.EQ4.for_pace().scores(time, r)
    np.testing.assert_array_equal(fastest, time)
    energy = Objective(energy_weight=1.0, idle_power_w=1.0).scores(time, r, power)
    np.testing.assert_allclose(energy, time * np.array([[0.5], [1.0]]) * (power - 1.0))
    with pytest.raises(ValueError, match=r"^energy-weight: needs the cells' power"):
        Objective(energy_weight=1.0).scores(time, r)


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"energy_weight": 1.5}, "energy-weight"),
        ({"time_weight": -0.1}, "time-weight"),
        ({"r_weight": True}, "r-weight"),
        ({"budget_s": 0.0, "samples": 10}, "budget-s"),
        ({"budget_s": 1.0}, "samples"),
        ({"idle_power_w": -1.0}, "idle-power-w"),
        ({"idle_power_w": math.nan}, "idle-power-w"),
        ({"tie_tolerance": 1.0}, "tie-tolerance"),
        ({"peak_sigma_k": -1.0}, "peak-sigma-k"),
        ({"batch_size": 0}, "batch-size"),
        ({"batch_size": 8.0}, "batch-size"),
    ],
)
def test_a_bad_objective_or_round_context_is_refused_naming_the_key(
    kw: dict[str, Any], key: str
) -> None:
    objective_keys = {f.name for f in dataclasses.fields(Objective)}
    with pytest.raises(ValueError, match=f"^{key}:"):
        if kw.keys() <= objective_keys:
            Objective(**kw)
        else:
            selector.RoundContext(**kw)
