"""Pre-trained weights for a run (the ``initial-weights`` run setting): read safely, hashed,
matched to the run's model.

A checkpoint is a safetensors file (preferred) or a PyTorch state dict saved with
``torch.save(model.state_dict(), path)``, read with ``torch.load(weights_only=True)``: a
pickle that needs code to run (any object but tensors and plain containers) is refused,
never executed. Its names and shapes must be the model's, with one exception: the
classifier head (the model's last ``nn.Linear``) may have another number of outputs (a
checkpoint pre-trained on another number of classes). Then the head keeps the model's own
seeded initialisation and its keys are recorded as the run's new layers
(``InitialWeights.new_layers``).

Everything here runs on the server (and in ``powerfl pretrain``); the clients get the
weights in the round's message, never from the file. No Flower import.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fl_client.contract import SettingsError

#: The run setting (and study key) naming the checkpoint.
KEY = "initial-weights"
#: What a checkpoint may be, for the errors.
ALLOWED = (
    "a safetensors file (.safetensors) or a PyTorch state dict saved with "
    "torch.save(model.state_dict(), path), whose tensor names and shapes are the model's"
)
#: The metadata key of a safetensors checkpoint written by ``powerfl pretrain``.
METADATA_KEY = "powerfl"


class CheckpointError(SettingsError):
    """A checkpoint that cannot be used; the message names the setting, the file and why."""


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of the file's bytes."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: How a file ``torch.save`` wrote begins: a zip archive (the default since PyTorch 1.6) or
#: a pickle's protocol opcode (the legacy format, protocol ≥ 2).
_TORCH_SAVE_HEADS = (b"PK\x03\x04", b"\x80")


def _is_safetensors(path: Path, head: bytes) -> bool:
    """By name, else by content: an 8-byte little-endian header length, then ``{``."""
    if path.suffix == ".safetensors":
        return True
    return len(head) >= 9 and head[8:9] == b"{" and not head.startswith(b"PK")


def read_state(path: str | Path, key: str = KEY) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file, on the CPU, by name.

    Raises
    ------
    CheckpointError
        Missing or unreadable file, a file that is no checkpoint at all (text, an empty
        file), a truncated or corrupt file, a pickle that needs code execution, or content
        that is not a flat mapping of names to tensors.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "no such file"
        raise CheckpointError(f"{key}: {p}: {what}; expected {ALLOWED}")
    try:
        with p.open("rb") as fh:
            head = fh.read(16)
    except OSError as err:
        raise CheckpointError(f"{key}: {p}: cannot be read ({err.strerror or err})") from None
    safetensors = _is_safetensors(p, head)
    if not safetensors and not head.startswith(_TORCH_SAVE_HEADS):
        # text, JSON, an empty file: torch.load would call it a pickle needing code, or fail
        # with a bare KeyError
        what = "an empty file" if not head else "neither a safetensors nor a torch.save file"
        raise CheckpointError(f"{key}: {p}: not a checkpoint ({what}); expected {ALLOWED}")
    if safetensors:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state: Any = load_file(str(p), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise CheckpointError(
                f"{key}: {p}: not a readable safetensors file, truncated or corrupt ({err})"
            ) from None
    else:
        try:
            state = torch.load(p, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckpointError(
                f"{key}: {p}: refused: loading it would run code (a pickle of arbitrary "
                f"objects: {first}); expected {ALLOWED}"
            ) from None
        except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckpointError(
                f"{key}: {p}: not a readable PyTorch checkpoint, truncated or corrupt "
                f"({first}); expected {ALLOWED}"
            ) from None
    if not isinstance(state, Mapping) or not state:
        raise CheckpointError(
            f"{key}: {p}: holds a {type(state).__name__}, not a mapping of tensor names to "
            f"tensors; expected {ALLOWED}"
        )
    bad = next((k for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise CheckpointError(
            f"{key}: {p}: entry {bad!r} is a {type(state[bad]).__name__}, not a tensor; "
            f"expected {ALLOWED}"
        )
    return {str(k): v for k, v in state.items()}


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``powerfl`` metadata of a safetensors checkpoint (``{}`` when it has none)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception:  # not safetensors, or not readable: no metadata to give
        return {}
    try:
        data = json.loads(meta.get(METADATA_KEY, "{}"))
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def head_keys(model: nn.Module) -> tuple[str, ...]:
    """The state-dict keys of the model's classifier head: its last ``nn.Linear``."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = name
    if last is None:
        return ()
    return tuple(f"{last}.{p}" for p, _ in model.get_submodule(last).named_parameters())


def _shape(t: torch.Tensor) -> str:
    return "×".join(map(str, t.shape)) or "scalar"


def match_state(
    model: nn.Module, loaded: Mapping[str, torch.Tensor], where: str, key: str = KEY
) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """``loaded`` checked against ``model``'s state dict: the full state to load (the
    model's own tensors for a new head) and the keys that are new.

    The head (``head_keys``) may differ in its number of outputs only (its first
    dimension); any other difference is refused, naming the first key (in the model's
    order, then the checkpoint's extra keys) with both shapes.
    """
    own = model.state_dict()
    head = set(head_keys(model))
    out: dict[str, torch.Tensor] = {}
    new: list[str] = []
    for name, mine in own.items():
        got = loaded.get(name)
        if got is None:
            raise CheckpointError(
                f"{key}: {where}: lacks {name} (the model's is {_shape(mine)}); the checkpoint "
                f"was made for another model ({len(loaded)} tensors, the model has {len(own)})"
            )
        if tuple(got.shape) == tuple(mine.shape):
            out[name] = got.to(dtype=mine.dtype).clone()
        elif name in head and got.dim() == mine.dim() and got.shape[1:] == mine.shape[1:]:
            out[name] = mine.detach().clone()
            new.append(name)
        else:
            raise CheckpointError(
                f"{key}: {where}: {name} is {_shape(got)} in the checkpoint but {_shape(mine)} "
                "in the model; the checkpoint was made for another model"
            )
    extra = next((k for k in loaded if k not in own), None)
    if extra is not None:
        raise CheckpointError(
            f"{key}: {where}: {extra} ({_shape(loaded[extra])} in the checkpoint) is not in "
            "the model; the checkpoint was made for another model"
        )
    return out, tuple(new)


@dataclass(frozen=True)
class InitialWeights:
    """A run's pre-trained weights: the file, its sha256, and the keys that are new (a head
    replaced because the checkpoint has another number of classes)."""

    path: Path
    sha256: str
    new_layers: tuple[str, ...]

    def to_record(self) -> dict[str, Any]:
        return {
            KEY: str(self.path),
            f"{KEY}-sha256": self.sha256,
            f"{KEY}-new-layers": list(self.new_layers),
        }


def check_finite(state: Mapping[str, torch.Tensor], where: str, key: str = KEY) -> None:
    """A CheckpointError naming the first tensor of ``state`` with a NaN or infinite value:
    a model started from it trains to nothing, and would be found out only after the whole
    r estimation."""
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"{key}: {where}: {name} holds {bad} of {tensor.numel()} values that are NaN "
                "or infinite; a checkpoint's weights must be finite numbers"
            )


def load_into(model: nn.Module, path: str | Path, key: str = KEY) -> InitialWeights:
    """Load the checkpoint at ``path`` into ``model`` (in place); see ``match_state``;
    a tensor with a NaN or infinite value is refused (``check_finite``)."""
    p = Path(path).expanduser().resolve()
    loaded = read_state(p, key)
    check_finite(loaded, str(p), key)
    sha = file_sha256(p)
    state, new = match_state(model, loaded, str(p), key)
    model.load_state_dict(state, strict=True)
    return InitialWeights(path=p, sha256=sha, new_layers=new)


def check(path: str | Path, model_name: str, key: str = KEY) -> InitialWeights:
    """Refuse a checkpoint that cannot be used for ``model_name``, before anything starts."""
    from fl_client import model_zoo

    return load_into(model_zoo.build_model(model_name), path, key)


def save(
    state: Mapping[str, torch.Tensor], path: str | Path, metadata: Mapping[str, Any] | None = None
) -> None:
    """Write ``state`` as a safetensors file (atomically), with ``metadata`` as JSON."""
    from safetensors.torch import save_file

    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}
    meta = {METADATA_KEY: json.dumps(dict(metadata or {}), sort_keys=True)}
    save_file(tensors, str(tmp), metadata=meta)
    tmp.chmod(0o644)  # safetensors writes 0600; a checkpoint is data others may read
    tmp.replace(p)
