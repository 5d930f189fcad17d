"""fl_client.feasibility: the paper's prefix rule of feasible frequencies, per row and
vectorised, against a plain scan."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fl_client.feasibility import feasible_knob_index, feasible_knob_indices

POS = st.floats(0.01, 10.0, allow_nan=False, allow_infinity=False)


def brute_force_prefix_index(row, p_max_w):
    """The documented rule, by a plain scan: last measured j before the running max hits P_max."""
    running, answer = -math.inf, None
    for j, p in enumerate(row):
        if math.isnan(p):
            continue
        running = max(running, p)
        if running >= p_max_w:
            break
        answer = j
    return answer


@settings(max_examples=200, deadline=None)
@given(
    row=st.lists(st.one_of(POS, st.just(math.nan)), min_size=1, max_size=20),
    cap=st.floats(0.005, 12.0),
)
def test_feasible_knob_index_is_the_prefix_max_rule(row, cap):
    assert feasible_knob_index(row, cap) == brute_force_prefix_index(row, cap)


@settings(max_examples=100, deadline=None)
@given(row=st.lists(POS, min_size=1, max_size=20), cap=st.floats(0.005, 12.0))
def test_feasible_knob_index_on_monotone_rows_is_eq4(row, cap):
    row = np.cumsum(row)
    literal = [j for j, p in enumerate(row) if p < cap]
    assert feasible_knob_index(row, cap) == (max(literal) if literal else None)


def test_feasible_knob_index_examples():
    assert feasible_knob_index([1.0, 2.0, 3.0, 4.0], 3.0) == 1  # strictly below the cap
    assert feasible_knob_index([1.0, 2.0, 3.0, 4.0], 3.0001) == 2
    assert feasible_knob_index([5.0, 6.0], 4.0) is None
    # a dip below the cap after a violation is not trusted
    assert feasible_knob_index([1.0, 4.5, 2.0, 2.5], 4.0) == 0
    # holes: the last measured cell before the boundary
    assert feasible_knob_index([np.nan, 1.0, np.nan, 2.0, np.nan, 5.0, np.nan], 4.0) == 3
    assert feasible_knob_index([np.nan, np.nan], 4.0) is None
    # no cap: the highest measured frequency
    assert feasible_knob_index([1.0, 9.0, np.nan], None) == 1
    assert feasible_knob_index([1.0, 9.0, 10.0], math.inf) == 2


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 6), st.integers(1, 14)),
        elements=st.one_of(st.floats(0.0, 20.0), st.just(math.nan)),
    ),
    st.one_of(st.none(), st.floats(0.1, 25.0)),
)
def test_vectorised_feasible_indices_equal_the_row_rule(power_w, p_max_w):
    rows = [feasible_knob_index(row, p_max_w) for row in power_w]
    assert feasible_knob_indices(power_w, p_max_w) == rows
