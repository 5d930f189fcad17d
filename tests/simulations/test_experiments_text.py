"""The next-character task's data rules and model, on a synthetic data root (no data kit)."""

from __future__ import annotations

import pytest
import torch

from simulations.experiments import text
from simulations.experiments.units import TargetRun


def _kit(root, body: str = "") -> None:
    body = body or ("It is a truth universally acknowledged, that a single man. " * 40)
    (root / "text" / "austen").mkdir(parents=True)
    (root / "text" / "dickens").mkdir(parents=True)
    (root / "text" / "tinyshakespeare.txt").write_text("First Citizen:\nSpeak.\n" * 200)
    (root / "text" / "austen" / "a.txt").write_text(body)
    (root / "text" / "dickens" / "d.txt").write_text("\u201cPip,\u201d said he\u2014\u00e9" * 200)


def test_missing_data_root_names_path_and_layout(tmp_path):
    with pytest.raises(text.TextDataError) as err:
        text.locate_text("austen", tmp_path / "nowhere")
    msg = str(err.value)
    assert str((tmp_path / "nowhere").resolve()) in msg
    assert "text/austen/*.txt" in msg and "tinyshakespeare.txt" in msg
    with pytest.raises(ValueError, match="allowed: tinyshakespeare, austen, dickens"):
        text.locate_text("wikitext", tmp_path)


def test_vocabulary_rule_maps_typography_and_drops_the_rest():
    assert text.normalize_text("\u201cPip,\u201d said he\u2014caf\u00e9\ttab\r\n") == (
        '"Pip," said he--caf tab\n'
    )
    assert len(text.VOCAB) == 52 + 10 + 32 + 2
    s = "Hello, World! 42\n"
    assert text.decode(text.encode(s)) == s


def test_load_text_splits_90_10_by_position(tmp_path):
    _kit(tmp_path)
    d = text.load_text("dickens", tmp_path)
    n = len(d.train) + len(d.test)
    assert len(d.train) == int(0.9 * n)
    assert text.decode(d.train[:6]) == '"Pip,"'
    assert d.chars_dropped == 200  # only the é; curly quotes and dashes are mapped


def test_transformer_shape_heads_and_causality():
    model = text.CharTransformer(num_layers=2)
    layer = model.blocks.layers[0]
    assert layer.self_attn.num_heads == 8 and layer.self_attn.embed_dim == 256
    x = torch.randint(0, len(text.VOCAB), (2, text.SEQ_LEN))
    logits = model(x)
    assert logits.shape == (2, len(text.VOCAB), text.SEQ_LEN)
    # Causal: changing the last character changes no earlier prediction.
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % len(text.VOCAB)
    model.eval()
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert torch.allclose(a[:, :, :-1], b[:, :, :-1], atol=1e-5)
    with pytest.raises(ValueError, match="num-heads: 6 does not divide embed-dim 256"):
        text.CharTransformer(num_heads=6)
    assert text.lr_for(32) == pytest.approx(5e-4)


def test_small_transformer_learns_a_repetitive_text(tmp_path):
    _kit(tmp_path, body="abcabcabc " * 400)
    d = text.load_text("austen", tmp_path)
    torch.manual_seed(0)
    model = text.CharTransformer(embed_dim=32, num_layers=1, num_heads=4)
    tx, ty = text.windows(d.test, 16, seed=1)
    before = text.char_accuracy(model, tx, ty)
    run = TargetRun(
        batch_size=16, lr=3e-3, target_accuracy=0.9, eval_every_samples=64, max_samples=4096, seed=0
    )
    n, curve, used = text.samples_to_target_text(model, d.train, tx, ty, run)
    assert n is not None and n == used and curve[-1][1] >= 0.9 > before
