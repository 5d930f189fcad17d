"""fl_client.model_zoo: the models and what a node knows of them before training."""

from __future__ import annotations

from fl_client import model_zoo


def test_estimate_train_memory_grows_with_batch_size() -> None:
    model = model_zoo.build_model("cnn")
    model.train()
    weights = 4 * sum(p.numel() * 4 for p in model.parameters())
    m1, m8, m64 = (
        model_zoo.estimate_train_memory_bytes(model, model_zoo.IMAGE_SHAPE, b) for b in (1, 8, 64)
    )
    assert weights < m1 < m8 < m64
    assert (m64 - m8) * 7 == (m8 - m1) * 56  # linear in b
    assert model.training
