"""The one weighted mean every aggregation takes: Flower's FedAvg float for float on the
default path, and its dtype rule."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from strategies.aggregation import aggregate_round
from strategies.weighted_mean import weighted_mean

DTYPES = (np.float32, np.float64, np.float16, np.int64, np.int32)


def _replies(seed: int, nodes: int) -> list[RecordDict]:
    """``nodes`` replies of random arrays in every dtype (0-d to 3-d), weighed by integer
    or fractional ``num-examples``."""
    rng = np.random.default_rng(seed)
    shapes = [(), (3,), (4, 5), (2, 3, 4)]
    weights: list[float] = [int(w) for w in rng.integers(1, 5000, nodes)]
    if seed % 2:
        weights = [w * float(rng.uniform(0.1, 3.0)) for w in weights]
    replies = []
    for w in weights:
        arrays = {}
        for i, dtype in enumerate(DTYPES):
            shape = shapes[i % len(shapes)]
            if np.issubdtype(dtype, np.integer):
                value = rng.integers(0, 10_000, shape).astype(dtype)
            else:
                value = (rng.normal(size=shape) * 10.0 ** rng.integers(-3, 3)).astype(dtype)
            arrays[f"layer{i}.{np.dtype(dtype).name}"] = Array(np.asarray(value))
        metrics = MetricRecord({"num-examples": w})
        replies.append(RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics}))
    return replies


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("nodes", [1, 2, 5])
def test_fedavg_is_flowers_aggregation_bit_for_bit(seed: int, nodes: int) -> None:
    replies = _replies(seed, nodes)
    flower = aggregate_arrayrecords(replies, "num-examples")
    ours, warning = aggregate_round("fedavg", None, replies, "num-examples")
    assert warning is None and list(ours.keys()) == list(flower.keys())
    for name in flower:
        a, b = ours[name].numpy(), flower[name].numpy()
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name  # exact, NaN-free bytes


def test_the_dtype_rule_floats_keep_theirs_integers_become_float64() -> None:
    x32 = [np.array([1.0, 2.0], np.float32), np.array([3.0, 5.0], np.float32)]
    mean = weighted_mean(x32, [1, 3])
    assert mean.dtype == np.float32
    expected = x32[0] * 0.25
    expected += x32[1] * 0.75  # in float32, node order, the factor as a Python float
    assert mean.tobytes() == expected.tobytes()
    counters = weighted_mean([np.array(3), np.array(4)], [1.0, 1.0])
    assert counters.dtype == np.float64 and counters.shape == () and float(counters) == 3.5


def test_float32_means_are_not_accumulated_in_float64() -> None:
    """The rule is Flower's, not a float64 sum cast back: on values where the two differ,
    it gives float32's."""
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=1000).astype(np.float32) for _ in range(7)]
    weights = [float(w) for w in rng.uniform(1, 100, 7)]
    total = sum(weights)
    wide = sum(a.astype(np.float64) * (w / total) for a, w in zip(arrays, weights, strict=True))
    mean = weighted_mean(arrays, weights)
    assert mean.dtype == np.float32
    assert not np.array_equal(mean, np.asarray(wide).astype(np.float32))
    np.testing.assert_allclose(mean, wide, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("weights", "match"),
    [([1.0], "expected 2 data weights"), ([1.0, -1.0], "≥ 0"), ([0.0, 0.0], "positive sum")],
)
def test_bad_weights_are_refused_naming_them(weights: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=f"weights: .*{match}"):
        weighted_mean([np.ones(2), np.ones(2)], weights)


def test_arrays_of_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        weighted_mean([np.ones(2), np.ones(3)], [1.0, 1.0])
