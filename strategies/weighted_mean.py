"""The weighted mean of the nodes' arrays: the one every aggregation takes (``fedavg``'s
whole model, the state ``fednova`` does not normalise, ``fedavg-capped``'s every array).

It is Flower's FedAvg (``flwr.serverapp.strategy.strategy_utils.aggregate_arrayrecords``)
float for float, so that the default run aggregates exactly as Flower would. **The dtype
rule** (NumPy's for an array times a Python float):

* each node's factor is the Python float w_i / Σ w (Σ summed in node order);
* the mean is x_0·p_0, then += x_i·p_i in node order, each product and sum in the array's
  own floating dtype: float32 in, float32 out (the factor rounded to float32 for the
  product), float64 stays float64;
* an integer array (BatchNorm's step counter) comes out float64: the mean of counters is
  not a whole number, and a node that loads it casts it back.

Pure NumPy; ``strategies.aggregation`` applies it to a round's Flower replies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def check_weights(weights: Sequence[float], n: int) -> list[float]:
    """``weights`` as floats when there are ``n`` of them, each finite and ≥ 0 with a
    positive sum; else a ValueError naming ``weights``."""
    values = [float(w) for w in weights]
    if n == 0 or len(values) != n:
        raise ValueError(f"weights: expected {n} data weights, got {len(values)}")
    if not (all(math.isfinite(w) and w >= 0 for w in values) and sum(values) > 0):
        raise ValueError(f"weights: expected finite numbers ≥ 0 with a positive sum, got {values}")
    return values


def weighted_mean(arrays: Sequence[npt.NDArray[Any]], weights: Sequence[float]) -> npt.NDArray[Any]:
    """Σ (w_i / Σ w)·x_i of one array from each node, by the module's dtype rule (Flower's
    FedAvg exactly). ValueError for weights that are not one finite number ≥ 0 per array
    with a positive sum, or arrays of different shapes."""
    values = check_weights(weights, len(arrays))
    if len({np.shape(a) for a in arrays}) > 1:
        raise ValueError(f"arrays: the nodes' shapes differ: {[np.shape(a) for a in arrays]}")
    total = sum(values)
    mean: npt.NDArray[Any] | None = None
    for array, w in zip(arrays, values, strict=True):
        term = np.asarray(array) * (w / total)
        if mean is None:
            mean = term
        else:
            mean += term
    assert mean is not None
    return np.asarray(mean)  # a 0-d array's products are NumPy scalars
