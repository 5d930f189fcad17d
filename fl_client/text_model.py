"""The paper's next-character model: a decoder-only character transformer (pure PyTorch).

It lives in ``fl_client`` so a node can profile and train it like the image models
(``fl_client.model_zoo.build_model("char-transformer")``); the text data rules (vocabulary,
corpora) are in ``simulations.experiments.text``.

The paper's model has 6 layers, 256-dim embeddings, 6 heads and sequence length 64. 256 is
not divisible by 6, and PyTorch's multi-head attention needs ``embed_dim % num_heads == 0``;
**8** heads of 32 dims is the nearest valid choice (``char-transformer``).
``char-transformer-mini`` (2 layers, 64 dims, 4 heads) is the width the ``mini`` experiment
scale trains on a 2-core CPU.
"""

from __future__ import annotations

import string

import torch
from torch import nn

#: The paper's vocabulary: English letters, digits, punctuation, space and newline.
VOCAB = string.ascii_letters + string.digits + string.punctuation + " \n"
SEQ_LEN = 64
EMBED_DIM = 256
NUM_LAYERS = 6
NUM_HEADS = 8  # the paper's 6 does not divide 256

#: name → (embed_dim, num_layers, num_heads) of the text models ``fl_client.model_zoo`` builds.
TEXT_MODELS: dict[str, tuple[int, int, int]] = {
    "char-transformer": (EMBED_DIM, NUM_LAYERS, NUM_HEADS),
    "char-transformer-mini": (64, 2, 4),
}


class CharTransformer(nn.Module):
    """Decoder-only character transformer; ``forward`` returns logits (B, V, T).

    The class dimension comes second so ``F.cross_entropy(logits, y)`` works on (B, T)
    targets directly.
    """

    def __init__(
        self,
        vocab_size: int = len(VOCAB),
        seq_len: int = SEQ_LEN,
        embed_dim: int = EMBED_DIM,
        num_layers: int = NUM_LAYERS,
        num_heads: int = NUM_HEADS,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"num-heads: {num_heads} does not divide embed-dim {embed_dim}")
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab_size, embed_dim)
        self.pos = nn.Embedding(seq_len, embed_dim)
        layer = nn.TransformerEncoderLayer(
            embed_dim,
            num_heads,
            4 * embed_dim,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size)
        self.register_buffer(
            "mask", torch.triu(torch.full((seq_len, seq_len), float("-inf")), 1), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.seq_len:
            raise ValueError(f"sequence length {t} > {self.seq_len}")
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        mask: torch.Tensor = self.mask  # type: ignore[assignment]
        h = self.blocks(h, mask=mask[:t, :t], is_causal=True)
        return self.head(self.norm(h)).transpose(1, 2)


def build_text_model(name: str) -> CharTransformer:
    """``char-transformer`` (the paper's size) or ``char-transformer-mini``."""
    if name not in TEXT_MODELS:
        raise ValueError(f"model: unknown text model {name!r}; allowed: {', '.join(TEXT_MODELS)}")
    embed_dim, num_layers, num_heads = TEXT_MODELS[name]
    return CharTransformer(embed_dim=embed_dim, num_layers=num_layers, num_heads=num_heads)
