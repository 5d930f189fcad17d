"""When a run has reached its target accuracy: the window rule and the first round.

A run reaches ``target-accuracy`` at the first round whose mean global accuracy over its
last ``target-window`` evaluated rounds (that round and the ``target-window`` − 1 before
it: a full window, so never before round ``target-window``) reaches the target. With a
window of 1 that is the first round at the target, the rule of earlier runs. The run's
summary reports both: ``round-to-target`` (the window rule) and ``first-round-at-target``.

One home for both rules: the server's round loop stops by them, the run recorder writes
them, and the robustness study's report applies them to per-round records. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: A window's mean counts as reaching the target when it is below it by no more than this
#: (the float rounding of a mean; accuracies are ratios of whole images, never this close).
MEAN_TOLERANCE = 1e-12


def window_round(accuracies: Sequence[float], target: float, window: int) -> int | None:
    """The first round (1-based) whose mean accuracy over it and the ``window`` − 1 rounds
    before it (a full window) reaches ``target``; None if none does."""
    if window < 1:
        raise ValueError(f"target-window: must be an integer ≥ 1, got {window!r}")
    for end in range(window, len(accuracies) + 1):
        if math.fsum(accuracies[end - window : end]) / window >= target - MEAN_TOLERANCE:
            return end
    return None


def first_round_at(accuracies: Sequence[float], target: float) -> int | None:
    """The first round (1-based) at or over ``target`` (the window rule with a window of 1);
    None if none is."""
    return window_round(accuracies, target, 1)


@dataclass(frozen=True)
class Target:
    """A run's target: ``accuracy`` of the global model, reached by the mean over a window
    of ``window`` evaluated rounds (1: the first round at it)."""

    accuracy: float
    window: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"target-window: must be an integer ≥ 1, got {self.window!r}")

    def round_reached(self, accuracies: Sequence[float]) -> int | None:
        """The round (1-based) at which ``accuracies`` reach the target by the window rule."""
        return window_round(accuracies, self.accuracy, self.window)

    def first_round(self, accuracies: Sequence[float]) -> int | None:
        """The first round (1-based) at or over the target."""
        return first_round_at(accuracies, self.accuracy)
