"""fl_client.task: train/evaluate, the profiler's step, hashes."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from fl_client import model_zoo, task


def tiny_data(n: int = 40, seed: int = 0) -> TensorDataset:
    """Two easily separable classes of 3×32×32 images (mean +1 vs −1, plus noise)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, *model_zoo.IMAGE_SHAPE, generator=gen) * 0.5
    x += (1.0 - 2.0 * y.float()).view(-1, 1, 1, 1)
    return TensorDataset(x, y)


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
    model = model_zoo.build_model("cnn")
    data = tiny_data(40)
    loss0, _ = task.evaluate(model, data)
    calls: list[int] = []

    def runner(batch_size: int, fn) -> None:
        calls.append(batch_size)
        fn()

    res = task.train(
        model, data, task.TrainOptions(batch_size=16, lr=3e-3, epochs=3, seed=1), step_runner=runner
    )
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
        model = model_zoo.build_model("cnn")
        res = task.train(
            model, data, task.TrainOptions(batch_size=8, lr=1e-3, epochs=5, seed=4, max_samples=20)
        )
        assert (res.steps, res.samples) == (3, 24)
        states.append(task.state_hash(model))
    assert states[0] == states[1]


def test_evaluate_accuracy_in_unit_interval_and_restores_mode() -> None:
    model = model_zoo.build_model("cnn")
    model.train()
    loss, acc = task.evaluate(model, tiny_data(10), batch_size=3)
    assert 0.0 <= acc <= 1.0 and loss > 0 and model.training
    empty = TensorDataset(torch.zeros(0, *model_zoo.IMAGE_SHAPE), torch.zeros(0, dtype=torch.long))
    assert all(math.isnan(v) for v in task.evaluate(model, empty))


# --- host_layout: channels_last input batches on the CPU ---------------------------------


def test_host_layout_makes_cnn_batches_channels_last_without_changing_values() -> None:
    model = model_zoo.build_model("cnn")
    x = tiny_data(6).tensors[0]
    out = task.host_layout(model, x)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    assert out.shape == x.shape and torch.equal(out, x)
    assert task.host_layout(model, out) is out  # already channels_last: no copy


def test_host_layout_leaves_text_and_other_image_models_batches_alone() -> None:
    text = model_zoo.build_model("char-transformer-mini")
    ids = torch.randint(0, 10, (4, *model_zoo.input_shape_for("char-transformer-mini")))
    assert task.host_layout(text, ids) is ids
    x = tiny_data(4).tensors[0]
    for name in ("resnet18", "mobilenetv2"):
        assert task.host_layout(model_zoo.build_model(name), x) is x


def test_channels_last_step_matches_the_contiguous_one_and_weights_stay_contiguous() -> None:
    data = tiny_data(16)
    x, y = data.tensors
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_zoo.build_model("cnn")
    model.train()
    seen: list[bool] = []
    first_conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
    )
    loss = task.train_step(model, task.make_optimizer(model, lr=1e-3), x, y)
    assert seen == [True] and x.is_contiguous()  # converted for the step, not in place
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    # The pre-change step: the same forward and backward on the contiguous batch.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ref = model_zoo.build_model("cnn")
    ref.train()
    ref_loss = torch.nn.functional.cross_entropy(ref(x), y)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-4, atol=1e-6)
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys() and grads
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    task.train(model, data, task.TrainOptions(batch_size=4, lr=1e-3, epochs=2))
    for name, t in model.state_dict().items():
        assert t.is_contiguous(), name


def test_make_train_step_runs_and_leaves_global_rng_alone() -> None:
    before = torch.get_rng_state()
    step = task.make_train_step("cnn", model_zoo.IMAGE_SHAPE, 4, device="cpu")
    step()
    step()
    assert torch.equal(before, torch.get_rng_state())


def test_state_hash_follows_the_weights() -> None:
    torch.manual_seed(0)
    a = model_zoo.build_model("cnn")
    torch.manual_seed(1)
    b = model_zoo.build_model("cnn")
    assert task.state_hash(a) != task.state_hash(b)
    b.load_state_dict(a.state_dict())  # how a node takes the global model's weights
    assert task.state_hash(a) == task.state_hash(b) == task.state_hash(a.state_dict())
