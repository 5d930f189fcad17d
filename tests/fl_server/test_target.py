"""When a run reaches its target (``fl_server.target``): the first round whose mean accuracy
over a full window of rounds reaches it, and the first round at it."""

from __future__ import annotations

import random

import pytest

from fl_server.target import Target, first_round_at, window_round

#: A lucky round 2; the 3-round means are 0.7800, 0.8267, 0.8333 and, over rounds 4–6,
#: (0.84 + 0.88 + 0.87) / 3 = 0.8633, the first at or over 0.85.
LUCKY = [0.70, 0.86, 0.78, 0.84, 0.88, 0.87]


def _old_rule(accuracies: list[float], target: float) -> int | None:
    """The rule of record version 3: the first round whose accuracy is at the target."""
    return next((i + 1 for i, a in enumerate(accuracies) if a >= target), None)


def test_the_window_rule_on_a_lucky_sequence() -> None:
    assert first_round_at(LUCKY, 0.85) == 2
    assert window_round(LUCKY, 0.85, 3) == 6
    assert window_round(LUCKY, 0.85, 2) == 5  # rounds 4–5: 0.86
    assert window_round(LUCKY, 0.85, 4) is None  # best 4-round mean: rounds 3–6, 0.8425
    target = Target(0.85, 3)
    assert (target.round_reached(LUCKY), target.first_round(LUCKY)) == (6, 2)


def test_a_window_needs_as_many_rounds_as_it_is_long() -> None:
    assert window_round([0.9, 0.9], 0.8, 3) is None  # never a full window
    assert window_round([0.9, 0.9, 0.9], 0.8, 3) == 3  # not before round 3
    assert window_round([], 0.8, 1) is None


def test_a_mean_exactly_at_the_target_reaches_it() -> None:
    # 0.84, 0.86, 0.85 average 0.85 up to float rounding
    assert window_round([0.84, 0.86, 0.85], 0.85, 3) == 3
    assert window_round([0.84, 0.86, 0.849], 0.85, 3) is None


def test_a_window_of_one_is_the_first_round_at_the_target() -> None:
    rng = random.Random(3)
    for _ in range(200):
        accs = [round(rng.uniform(0.5, 0.95), 3) for _ in range(rng.randint(0, 12))]
        target = round(rng.uniform(0.6, 0.9), 2)
        assert window_round(accs, target, 1) == _old_rule(accs, target)
        assert first_round_at(accs, target) == _old_rule(accs, target)
        assert Target(target).round_reached(accs) == _old_rule(accs, target)


def test_the_first_round_is_decided_once_the_window_is() -> None:
    """A window whose mean reaches the target holds a round that does: the first round at
    the target is never after the window's round."""
    rng = random.Random(5)
    for _ in range(200):
        accs = [rng.uniform(0.6, 0.95) for _ in range(12)]
        reached = window_round(accs, 0.85, 3)
        if reached is not None:
            first = first_round_at(accs, 0.85)
            assert first is not None and first <= reached


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "3"])
def test_a_bad_window_is_refused_naming_the_key(window: object) -> None:
    with pytest.raises(ValueError, match="target-window: must be an integer ≥ 1"):
        Target(0.85, window)  # type: ignore[arg-type]
    if isinstance(window, int) and not isinstance(window, bool):
        with pytest.raises(ValueError, match="target-window"):
            window_round(LUCKY, 0.85, window)
