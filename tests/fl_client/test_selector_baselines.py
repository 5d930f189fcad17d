"""fl_client.selector_baselines: B1, B2 and a fixed (b, f), against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_client.devices.base import FREQ_TOLERANCE_MHZ
from fl_client.selection import Tables
from fl_client.selector_baselines import select_b1, select_b2, select_fixed

NANO_FREQS_MHZ = [round(76.8 * k, 1) for k in range(1, 13)]  # 76.8 … 921.6
B6 = [4, 8, 16, 32, 64, 128]
R_VALUE = st.floats(0.01, 1.0, allow_nan=False)


def test_b1_largest_batch_at_fixed_cap_with_whole_mhz_tolerance():
    for cap_mhz, expected in [
        (307, 307.2),
        (614, 614.4),
        (921.6, 921.6),
        (921, 921.6),
        (300, 230.4),
        (10_000, 921.6),
    ]:
        sel = select_b1(B6, NANO_FREQS_MHZ, cap_mhz)
        assert (sel.method, sel.batch_size, sel.knob_value) == ("b1", 128, expected), cap_mhz
        assert math.isnan(sel.time_per_sample_s) and math.isnan(sel.score)
    with pytest.raises(ValueError, match="b1-freq-cap-mhz"):
        select_b1(B6, NANO_FREQS_MHZ, 50.0)


def test_b1_and_b2_predictions_come_from_the_lut():
    freqs = [100.0, 200.0, 300.0]
    time = np.array([[3.0, 2.0, 1.0], [2.0, np.nan, np.nan], [1.5, 1.0, 0.5]])
    power = np.where(np.isnan(time), np.nan, 4.0 - time)
    sel = select_b1([8, 16, 32], freqs, 250.0, Tables(time, power), r=[0.2, 0.5, 1.0])
    assert (sel.batch_size, sel.knob_value) == (32, 200.0)
    assert (sel.time_per_sample_s, sel.peak_power_w, sel.score) == (1.0, 3.0, 1.0)
    assert [c.knob_value for c in sel.candidates] == [200.0] * 3
    b2 = select_b2([8, 16, 32], freqs, [0.5, 0.2, 1.0], 250.0, Tables(time, power))
    assert (b2.method, b2.batch_size, b2.knob_value) == ("b2", 16, 200.0)
    assert math.isnan(b2.time_per_sample_s)  # that cell was not profiled
    assert b2.to_dict()["predicted-time-per-sample-s"] is None


def test_b2_smallest_r_ties_to_larger_batch():
    assert select_b2(B6, NANO_FREQS_MHZ, [1.0, 0.3, 0.3, 0.5, 0.8, 1.0], 614).batch_size == 16
    assert select_b2(B6, NANO_FREQS_MHZ, [0.2, 0.3, 0.3, 0.5, 0.8, 1.0], 614).batch_size == 4
    assert select_b2(B6, NANO_FREQS_MHZ, [1.0] * 6, 614).batch_size == 128


@settings(max_examples=100, deadline=None)
@given(r=st.lists(R_VALUE, min_size=6, max_size=6), cap=st.floats(76.8, 2000.0))
def test_baselines_against_brute_force(r, cap):
    f_expected = max(f for f in NANO_FREQS_MHZ if f <= cap + FREQ_TOLERANCE_MHZ)
    b1 = select_b1(B6, NANO_FREQS_MHZ, cap)
    assert (b1.batch_size, b1.knob_value) == (max(B6), f_expected)
    b2 = select_b2(B6, NANO_FREQS_MHZ, r, cap)
    best = min(range(6), key=lambda i: (r[i], -B6[i]))
    assert (b2.batch_size, b2.knob_value) == (B6[best], f_expected)


def test_fixed_validates_membership():
    sel = select_fixed(32, 614, B6, NANO_FREQS_MHZ)
    assert (sel.method, sel.batch_size, sel.knob_value) == ("fixed", 32, 614.4)
    assert [c.batch_size for c in sel.candidates] == [32]
    with pytest.raises(ValueError, match=r"fixed-batch-size: 12 is not one of batch-sizes"):
        select_fixed(12, 614.4, B6, NANO_FREQS_MHZ)
    with pytest.raises(ValueError, match=r"fixed-freq-mhz: 600 is not one of the device's knob"):
        select_fixed(32, 600, B6, NANO_FREQS_MHZ)
