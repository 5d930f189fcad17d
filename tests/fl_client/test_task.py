"""fl_client.task: digits splits, client data, train/evaluate, profiler step, memory, hashes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from fl_client import task


def tiny_data(n: int = 40, seed: int = 0) -> TensorDataset:
    """Two easily separable classes of 3×32×32 images (mean +1 vs −1, plus noise)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, *task.IMAGE_SHAPE, generator=gen) * 0.5
    x += (1.0 - 2.0 * y.float()).view(-1, 1, 1, 1)
    return TensorDataset(x, y)


# --- digits splits -----------------------------------------------------------------------


def test_splits_shapes_sizes_and_dtypes() -> None:
    s = task.load_digits_splits(seed=3)
    assert s.sizes() == {
        "proxy-train": task.PROXY_TRAIN_SIZE,
        "proxy-eval": task.PROXY_EVAL_SIZE,
        "test": task.TEST_SIZE,
        "pool": 1797 - task.PROXY_TRAIN_SIZE - task.PROXY_EVAL_SIZE - task.TEST_SIZE,
    }
    for ds in (s.proxy_train, s.proxy_eval, s.test, s.pool):
        x, y = task.as_tensors(ds)
        assert x.shape[1:] == task.IMAGE_SHAPE and x.dtype == torch.float32
        assert y.dtype == torch.int64 and set(y.unique().tolist()) == set(range(10))
        assert torch.isfinite(x).all()


def test_splits_disjoint_cover_everything_and_stratified() -> None:
    s = task.load_digits_splits(seed=3)
    ids = np.concatenate(list(s.indices.values()))
    assert len(ids) == len(np.unique(ids)) == 1797
    # Stratified: every class holds about 10% of the test set.
    counts = np.bincount(task.as_tensors(s.test)[1].numpy(), minlength=10)
    assert counts.min() >= 27 and counts.max() <= 33


def test_splits_deterministic_per_seed() -> None:
    a, b = task.load_digits_splits(seed=5), task.load_digits_splits.__wrapped__(seed=5)
    c = task.load_digits_splits(seed=6)
    for name in a.indices:
        np.testing.assert_array_equal(a.indices[name], b.indices[name])
    assert torch.equal(a.test.tensors[0], b.test.tensors[0])
    assert not np.array_equal(a.indices["test"], c.indices["test"])


# --- partitions ---------------------------------------------------------------------------


def test_client_data_splits_partition_into_train_and_val() -> None:
    spec = task.PartitionSpec("dirichlet", alpha=0.5, seed=7)
    train, val = task.client_data(2, 8, spec=spec)
    train2, val2 = task.client_data(2, 8, spec=task.PartitionSpec(alpha=0.5, seed=7))
    assert torch.equal(train.tensors[0], train2.tensors[0])
    assert torch.equal(val.tensors[1], val2.tensors[1])
    assert len(val) == round(task.VAL_FRACTION * (len(train) + len(val)))
    iid = task.PartitionSpec("iid", seed=7)
    total = sum(sum(map(len, task.client_data(p, 8, spec=iid))) for p in range(8))
    assert total == len(task.load_digits_splits(seed=7).pool)


def test_partition_spec_defaults_and_the_run_settings() -> None:
    from fl_client.settings import RunSettings

    spec = task.PartitionSpec()
    assert (spec.partitioning, spec.alpha, spec.seed, spec.dataset, spec.classes_per_node) == (
        "dirichlet",
        0.5,
        0,
        task.DEFAULT_DATASET,
        task.CLASSES_PER_NODE,
    )
    settings = RunSettings.from_config(
        {"partitioning": "pathological", "dirichlet-alpha": 0.3, "seed": 4, "classes-per-node": 3}
    )
    assert task.PartitionSpec.of(settings) == task.PartitionSpec(
        "pathological", alpha=0.3, seed=4, dataset="digits", classes_per_node=3
    )
    # The spec is the partitioner's input as it was: the same parts for the same values.
    labels = task.as_tensors(task.load_splits("digits", 4).pool)[1].numpy()
    expected = task.partitions.partition(labels, 5, "pathological", seed=4, classes_per_node=3)
    for got, want in zip(task.PartitionSpec.of(settings).parts(5), expected, strict=True):
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
    spec = task.PartitionSpec(**args)
    with pytest.raises(ValueError, match=key):
        task.client_data(partition_id, 8, spec=spec)
    if partition_id == 0:  # the split report checks the same settings
        with pytest.raises(ValueError, match=key):
            task.split_report(8, spec=spec)


# --- train / evaluate ---------------------------------------------------------------------


def test_scaled_lr_is_sqrt_scaling() -> None:
    assert task.scaled_lr(1e-3, 128, 128) == pytest.approx(1e-3)
    assert task.scaled_lr(1e-3, 128, 32) == pytest.approx(5e-4)
    assert task.scaled_lr(2e-3, 16, 64) == pytest.approx(4e-3)
    with pytest.raises(ValueError, match="lr-ref"):
        task.scaled_lr(0.0, 128, 32)
    with pytest.raises(ValueError, match="b-ref"):
        task.scaled_lr(1e-3, 0, 32)


def test_train_reduces_loss_and_runs_every_minibatch_through_step_runner() -> None:
    torch.manual_seed(0)
    model = task.build_model("cnn")
    data = tiny_data(40)
    loss0, _ = task.evaluate(model, data)
    calls: list[int] = []

    def runner(batch_size: int, fn) -> None:
        calls.append(batch_size)
        fn()

    res = task.train(model, data, batch_size=16, lr=3e-3, epochs=3, seed=1, step_runner=runner)
    assert calls == [16, 16, 8] * 3
    assert (res.num_examples, res.steps, res.samples) == (40, 9, 120)
    assert math.isfinite(res.mean_loss)
    loss1, acc1 = task.evaluate(model, data)
    assert loss1 < 0.5 * loss0 and acc1 > 0.9


def test_train_is_seeded_and_respects_max_samples() -> None:
    data = tiny_data(40)
    states = []
    for _ in range(2):
        torch.manual_seed(0)
        model = task.build_model("cnn")
        res = task.train(model, data, batch_size=8, lr=1e-3, epochs=5, seed=4, max_samples=20)
        assert (res.steps, res.samples) == (3, 24)
        states.append(task.state_hash(model))
    assert states[0] == states[1]


def test_evaluate_accuracy_in_unit_interval_and_restores_mode() -> None:
    model = task.build_model("cnn")
    model.train()
    loss, acc = task.evaluate(model, tiny_data(10), batch_size=3)
    assert 0.0 <= acc <= 1.0 and loss > 0 and model.training
    empty = TensorDataset(torch.zeros(0, *task.IMAGE_SHAPE), torch.zeros(0, dtype=torch.long))
    assert all(math.isnan(v) for v in task.evaluate(model, empty))


def test_make_train_step_runs_and_leaves_global_rng_alone() -> None:
    before = torch.get_rng_state()
    step = task.make_train_step("cnn", task.IMAGE_SHAPE, 4, device="cpu")
    step()
    step()
    assert torch.equal(before, torch.get_rng_state())


def test_estimate_train_memory_grows_with_batch_size() -> None:
    model = task.build_model("cnn")
    model.train()
    weights = 4 * sum(p.numel() * 4 for p in model.parameters())
    m1, m8, m64 = (task.estimate_train_memory_bytes(model, task.IMAGE_SHAPE, b) for b in (1, 8, 64))
    assert weights < m1 < m8 < m64
    assert (m64 - m8) * 7 == (m8 - m1) * 56  # linear in b
    assert model.training


def test_state_hash_follows_the_weights() -> None:
    torch.manual_seed(0)
    a = task.build_model("cnn")
    torch.manual_seed(1)
    b = task.build_model("cnn")
    assert task.state_hash(a) != task.state_hash(b)
    b.load_state_dict(a.state_dict())  # how a node takes the global model's weights
    assert task.state_hash(a) == task.state_hash(b) == task.state_hash(a.state_dict())
