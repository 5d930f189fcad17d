"""fl_client.selector_inputs: batch sizes and r are checked, naming the key."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fl_client.selector_inputs import validate_batch_sizes, validate_r


def test_validate_batch_sizes():
    assert validate_batch_sizes([4, 8.0, np.int64(16)]) == [4, 8, 16]
    cases: list[tuple[Any, str]] = [
        ([], "empty"),
        ([8, 4], "not strictly ascending"),
        ([4, 4], "ascending"),
        ([0, 4], "positive"),
        ([4, 8.5], "positive integer"),
        (["8"], "integer"),
        ([True], "integer"),
        ("4,8", "list"),
    ]
    for bad, what in cases:
        with pytest.raises(ValueError, match=r"batch-sizes") as info:
            validate_batch_sizes(bad)
        assert what in str(info.value)


def test_validate_r():
    assert validate_r([0.5, 1], [4, 8]) == [0.5, 1.0]
    assert validate_r(np.array([0.5, 1.0]), np.array([4, 8])) == [0.5, 1.0]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"r: has 1 values but batch-sizes has 2"):
        validate_r([0.5], [4, 8])
    for bad in ([0.0, 1.0], [0.5, 1.01], [math.nan, 1.0], ["x", 1.0], [-0.1, 1.0]):
        with pytest.raises(ValueError, match=r"r: value .* is not in \(0, 1\]"):
            validate_r(bad, [4, 8])
