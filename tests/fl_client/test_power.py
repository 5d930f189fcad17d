"""fl_client.power: the one parser of ``p-max-w`` and ``cap-margin``, and the cap with its
margin; every other door (the contract's ``Cap``, the devices' B1 bands and cap guard,
profiling, LUTs) parses a cap through it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_client.contract import Cap, SettingsError
from fl_client.devices.guard import CapGuard
from fl_client.power import PowerLimit, check_cap_margin, parse_p_max_w


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4.5, 4.5),
        (7, 7.0),
        ("5", 5.0),
        ("4.5 W", 4.5),
        (" 4.5w ", 4.5),
        (np.float64(3.0), 3.0),
        (None, math.inf),
        ("none", math.inf),
        ("None", math.inf),
        ("", math.inf),
        ("inf", math.inf),
        (math.inf, math.inf),
    ],
)
def test_a_cap_is_parsed_from_any_door(value: object, expected: float) -> None:
    assert parse_p_max_w(value) == expected
    assert Cap.parse(value).watts == expected
    assert PowerLimit(value).p_max_w == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be > 0 W"),
        (-1.0, "must be > 0 W"),
        (math.nan, "must be > 0 W"),
        ("nan", "must be > 0 W"),
        (-math.inf, "must be > 0 W"),
        ("abc", "expected a number of watts > 0 or 'none'"),
        (True, "expected a number of watts > 0 or 'none'"),
        ([5.0], "expected a number of watts > 0 or 'none'"),
    ],
)
def test_a_bad_cap_is_refused_naming_the_key_at_every_door(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^p-max-w: {message}"):
        parse_p_max_w(value)
    with pytest.raises(ValueError, match=f"^caps-w: {message}"):
        parse_p_max_w(value, "caps-w")
    with pytest.raises(SettingsError, match=f"^p-max-w: {message}"):
        Cap.parse(value)
    with pytest.raises(ValueError, match=f"^p-max-w: {message}"):
        PowerLimit(value)  # type: ignore[arg-type]


def test_the_cap_guard_takes_a_finite_cap_through_the_parser() -> None:
    assert CapGuard(4.5).p_max_w == 4.5
    with pytest.raises(ValueError, match="p-max-w: must be > 0 W"):
        CapGuard(-1.0)
    with pytest.raises(ValueError, match="the cap guard needs a finite cap"):
        CapGuard(math.inf)


@pytest.mark.parametrize("value", [-0.01, 1.0, 2, float("nan"), "0.1", True, None])
def test_bad_cap_margin_is_refused_with_the_key(value: object) -> None:
    with pytest.raises(ValueError, match=r"cap-margin: must be a number in \[0, 1\)"):
        check_cap_margin(value)


def test_the_cap_with_its_margin_is_one_value() -> None:
    assert PowerLimit(4.5, 0.05).limit_w == pytest.approx(4.275)
    assert PowerLimit(4.5, 0.0).limit_w == 4.5
    none = PowerLimit(math.inf, 0.05)
    assert math.isinf(none.limit_w) and none.cap_margin == 0.0 and none.cap_w is None
    assert PowerLimit.of("none") == PowerLimit() == PowerLimit.of(None)
    assert PowerLimit.of(4.5) == PowerLimit(4.5, 0.0)
    assert Cap(4.5).with_margin(0.05) == PowerLimit(4.5, 0.05)
    with pytest.raises(ValueError, match="cap-margin"):
        PowerLimit(4.5, 1.0)
    with pytest.raises(ValueError, match="p-max-w"):
        PowerLimit(-1.0)
