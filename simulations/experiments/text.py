"""The paper's next-character task: data kit lookup, vocabulary rule, a 6-layer transformer.

Data (``--data-root``, default ``../shared/data`` relative to the repository; see
``shared/data/MANIFEST.md``)::

    <data-root>/text/tinyshakespeare.txt     proxy
    <data-root>/text/austen/*.txt            target (Jane Austen, NLTK's Gutenberg texts)
    <data-root>/text/dickens/*.txt           target (Charles Dickens)

Vocabulary rule (paper §5.1): English letters, digits, punctuation, space and newline.
Typographic quotes, dashes and ellipses are mapped to their ASCII forms, tabs and other
whitespace to a space, everything else is dropped. Split 90 % train / 10 % test (by
position, so no test text leaks into training windows).

Model: the paper's 6 layers, 256-dim embeddings, sequence length 64 — with **8** heads
instead of the paper's 6: 256 is not divisible by 6, and PyTorch's multi-head attention
needs ``embed_dim % num_heads == 0``; 8 heads of 32 dims is the nearest valid choice.
Pre-norm encoder layers with a causal mask, learned positional embeddings, GELU, 4×
feed-forward. AdamW at lr 1e-3 for b = 128 with square-root scaling (``lr_for``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from fl_client.text_model import (
    EMBED_DIM,
    NUM_HEADS,
    NUM_LAYERS,
    SEQ_LEN,
    VOCAB,
    CharTransformer,
    build_text_model,
)
from simulations.experiments.units import TargetRun, TrainingResult

__all__ = [
    "B_REF",
    "DEFAULT_DATA_ROOT",
    "EMBED_DIM",
    "LAYOUT",
    "LR_REF",
    "NUM_HEADS",
    "NUM_LAYERS",
    "SEQ_LEN",
    "TEXT_DATASETS",
    "VOCAB",
    "CharTransformer",
    "TextDataError",
    "TextSplits",
    "build_text_model",
    "char_accuracy",
    "decode",
    "encode",
    "load_text",
    "locate_text",
    "lr_for",
    "normalize_text",
    "samples_to_target_text",
    "windows",
]

#: The repository's sibling ``shared/data`` (the data kit), the default ``--data-root``.
DEFAULT_DATA_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TEXT_DATASETS: dict[str, str] = {
    "tinyshakespeare": "text/tinyshakespeare.txt",
    "austen": "text/austen/*.txt",
    "dickens": "text/dickens/*.txt",
}
LAYOUT = (
    "<data-root>/text/tinyshakespeare.txt, <data-root>/text/austen/*.txt and "
    "<data-root>/text/dickens/*.txt (see shared/data/MANIFEST.md)"
)
_CHAR_TO_ID = {c: i for i, c in enumerate(VOCAB)}
_MAP = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2013": "-",
    "\u2014": "--",
    "\u2026": "...",
    "\t": " ",
    "\r": "",
    "\u00a0": " ",
}

LR_REF = 1e-3
B_REF = 128


class TextDataError(FileNotFoundError):
    """A text dataset that is not where the data kit should be; names path and layout."""


def locate_text(name: str, data_root: str | Path | None = None) -> list[Path]:
    """The files of text dataset ``name`` under ``data_root`` (sorted).

    Raises
    ------
    ValueError
        ``name`` is not one of ``TEXT_DATASETS``.
    TextDataError
        The files are missing; the message names the path looked at and the layout.
    """
    if name not in TEXT_DATASETS:
        raise ValueError(f"text dataset: unknown {name!r}; allowed: {', '.join(TEXT_DATASETS)}")
    root = Path(data_root) if data_root is not None else DEFAULT_DATA_ROOT
    pattern = TEXT_DATASETS[name]
    files = sorted(root.glob(pattern))
    if not files:
        raise TextDataError(
            f"--data-root: no {pattern} under {root.resolve()} for dataset {name!r}; "
            f"expected {LAYOUT}"
        )
    return files


def normalize_text(text: str) -> str:
    """Apply the vocabulary rule: map typographic characters, drop what is not in VOCAB."""
    out: list[str] = []
    for ch in text:
        ch = _MAP.get(ch, ch)
        out.extend(c for c in ch if c in _CHAR_TO_ID)
    return "".join(out)


def encode(text: str) -> torch.Tensor:
    """Character ids (int64) of already normalised text."""
    return torch.tensor([_CHAR_TO_ID[c] for c in text], dtype=torch.int64)


def decode(ids: torch.Tensor) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


@dataclass(frozen=True)
class TextSplits:
    """A dataset's character ids, 90/10 split by position."""

    name: str
    train: torch.Tensor
    test: torch.Tensor
    chars_dropped: int


def load_text(
    name: str, data_root: str | Path | None = None, train_fraction: float = 0.9
) -> TextSplits:
    """Read, normalise, encode and split dataset ``name`` (files concatenated, sorted)."""
    if not 0 < train_fraction < 1:
        raise ValueError(f"train-fraction: must be in (0, 1), got {train_fraction!r}")
    raw = "\n".join(p.read_text(encoding="utf-8") for p in locate_text(name, data_root))
    text = normalize_text(raw)
    ids = encode(text)
    cut = int(len(ids) * train_fraction)
    if cut <= SEQ_LEN or len(ids) - cut <= SEQ_LEN:
        raise TextDataError(f"text dataset {name!r}: too short ({len(ids)} characters)")
    dropped = sum(1 for ch in raw if not any(c in _CHAR_TO_ID for c in _MAP.get(ch, ch)))
    return TextSplits(name, ids[:cut], ids[cut:], dropped)


def windows(
    ids: torch.Tensor, count: int, seed: int, seq_len: int = SEQ_LEN
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random (input, next-character target) windows of ``seq_len``, seeded."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len - 1, (count,), generator=gen)
    offsets = torch.arange(seq_len)
    x = ids[starts[:, None] + offsets]
    y = ids[starts[:, None] + offsets + 1]
    return x, y


def lr_for(batch_size: int, lr_ref: float = LR_REF, b_ref: int = B_REF) -> float:
    """AdamW learning rate for ``batch_size``: lr_ref·sqrt(b / b_ref) (the paper's rule)."""
    return lr_ref * math.sqrt(batch_size / b_ref)


@torch.no_grad()
def char_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    """Share of next characters predicted correctly over all positions of all windows."""
    was = model.training
    model.eval()
    correct = 0
    try:
        for s in range(0, len(x), batch):
            logits = model(x[s : s + batch])
            correct += int((logits.argmax(dim=1) == y[s : s + batch]).sum())
    finally:
        model.train(was)
    return correct / max(1, y.numel())


def samples_to_target_text(
    model: nn.Module,
    train_ids: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    run: TargetRun,
    on_eval: Callable[[int], None] | None = None,
) -> TrainingResult:
    """Train with AdamW on random windows until the character accuracy target.

    Same contract as ``fl_client.r_estimation.samples_to_target``: (samples when the
    target was first reached or None, evaluation curve, samples processed). A sample is
    one window of ``SEQ_LEN`` characters.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=run.lr)
    gen = torch.Generator().manual_seed(run.seed)
    model.train()
    samples, next_eval = 0, run.eval_every_samples
    curve: list[tuple[int, float]] = []
    offsets = torch.arange(SEQ_LEN)
    while samples < run.max_samples:
        starts = torch.randint(0, len(train_ids) - SEQ_LEN - 1, (run.batch_size,), generator=gen)
        x = train_ids[starts[:, None] + offsets]
        y = train_ids[starts[:, None] + offsets + 1]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        samples += run.batch_size
        if samples >= next_eval or samples >= run.max_samples:
            acc = char_accuracy(model, test_x, test_y)
            curve.append((samples, acc))
            if on_eval is not None:
                on_eval(samples)
            if acc >= run.target_accuracy:
                return samples, curve, samples
            next_eval = (samples // run.eval_every_samples + 1) * run.eval_every_samples
    return None, curve, samples
