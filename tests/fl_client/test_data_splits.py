"""fl_client.data_splits: the digits splits, the client data and the partition spec."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_client import data_splits, model_zoo, partitions
from fl_client.partitions import Partitioning

# --- digits splits -----------------------------------------------------------------------


def test_splits_shapes_sizes_and_dtypes() -> None:
    s = data_splits.load_digits_splits(seed=3)
    assert s.sizes() == {
        "proxy-train": data_splits.PROXY_TRAIN_SIZE,
        "proxy-eval": data_splits.PROXY_EVAL_SIZE,
        "test": data_splits.TEST_SIZE,
        "pool": 1797
        - data_splits.PROXY_TRAIN_SIZE
        - data_splits.PROXY_EVAL_SIZE
        - data_splits.TEST_SIZE,
    }
    for ds in (s.proxy_train, s.proxy_eval, s.test, s.pool):
        x, y = data_splits.as_tensors(ds)
        assert x.shape[1:] == model_zoo.IMAGE_SHAPE and x.dtype == torch.float32
        assert y.dtype == torch.int64 and set(y.unique().tolist()) == set(range(10))
        assert torch.isfinite(x).all()


def test_splits_disjoint_cover_everything_and_stratified() -> None:
    s = data_splits.load_digits_splits(seed=3)
    ids = np.concatenate(list(s.indices.values()))
    assert len(ids) == len(np.unique(ids)) == 1797
    # Stratified: every class holds about 10% of the test set.
    counts = np.bincount(data_splits.as_tensors(s.test)[1].numpy(), minlength=10)
    assert counts.min() >= 27 and counts.max() <= 33


def test_splits_deterministic_per_seed() -> None:
    a, b = (
        data_splits.load_digits_splits(seed=5),
        data_splits.load_digits_splits.__wrapped__(seed=5),
    )
    c = data_splits.load_digits_splits(seed=6)
    for name in a.indices:
        np.testing.assert_array_equal(a.indices[name], b.indices[name])
    assert torch.equal(a.test.tensors[0], b.test.tensors[0])
    assert not np.array_equal(a.indices["test"], c.indices["test"])


# --- partitions ---------------------------------------------------------------------------


def test_client_data_splits_partition_into_train_and_val() -> None:
    spec = data_splits.PartitionSpec("dirichlet", alpha=0.5, seed=7)
    train, val = data_splits.client_data(2, 8, spec=spec)
    train2, val2 = data_splits.client_data(2, 8, spec=data_splits.PartitionSpec(alpha=0.5, seed=7))
    assert torch.equal(train.tensors[0], train2.tensors[0])
    assert torch.equal(val.tensors[1], val2.tensors[1])
    assert len(val) == round(data_splits.VAL_FRACTION * (len(train) + len(val)))
    iid = data_splits.PartitionSpec("iid", seed=7)
    total = sum(sum(map(len, data_splits.client_data(p, 8, spec=iid))) for p in range(8))
    assert total == len(data_splits.load_digits_splits(seed=7).pool)


def test_partition_spec_defaults_and_the_run_settings() -> None:
    from fl_client.settings import RunSettings

    spec = data_splits.PartitionSpec()
    assert (spec.partitioning, spec.alpha, spec.seed, spec.dataset, spec.classes_per_node) == (
        "dirichlet",
        0.5,
        0,
        data_splits.DEFAULT_DATASET,
        data_splits.CLASSES_PER_NODE,
    )
    settings = RunSettings.from_config(
        {"partitioning": "pathological", "dirichlet-alpha": 0.3, "seed": 4, "classes-per-node": 3}
    )
    assert data_splits.PartitionSpec.of(settings) == data_splits.PartitionSpec(
        "pathological", alpha=0.3, seed=4, dataset="digits", classes_per_node=3
    )
    # The spec is the partitioner's input as it was: the same parts for the same values.
    labels = data_splits.as_tensors(data_splits.load_splits("digits", 4).pool)[1].numpy()
    expected = partitions.partition(
        labels, 5, Partitioning("pathological", seed=4, classes_per_node=3)
    )
    for got, want in zip(data_splits.PartitionSpec.of(settings).parts(5), expected, strict=True):
        assert np.array_equal(got, want)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"partitioning": "zipf"}, "partitioning"),
        ({"alpha": 0.0}, "dirichlet-alpha"),
        ({"alpha": -1.0}, "dirichlet-alpha"),
        ({"partition_id": 8}, "partition-id"),
        ({"partition_id": -1}, "partition-id"),
    ],
)
def test_client_data_errors_name_the_key(kwargs: dict, key: str) -> None:
    args = dict(kwargs)
    partition_id = args.pop("partition_id", 0)
    spec = data_splits.PartitionSpec(**args)
    with pytest.raises(ValueError, match=key):
        data_splits.client_data(partition_id, 8, spec=spec)
    if partition_id == 0:  # the split report checks the same settings
        with pytest.raises(ValueError, match=key):
            data_splits.split_report(8, spec=spec)
