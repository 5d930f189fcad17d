"""Pre-trained weights (``initial-weights``): read safely, matched to the model, hashed."""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import pytest
import torch

from fl_client import checkpoint, data_splits, model_zoo
from fl_client.checkpoint import CheckpointError
from fl_client.r_estimation import InitialModel, ROptions, estimate_r


def _cnn_state(seed: int = 3, num_classes: int = 10) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return model_zoo.build_model("cnn", num_classes).state_dict()


def test_a_safetensors_checkpoint_loads_the_exact_weights(tmp_path: Path) -> None:
    state = _cnn_state()
    path = tmp_path / "w.safetensors"
    checkpoint.save(state, path, {"model": "cnn"})
    model = model_zoo.build_model("cnn")
    weights = checkpoint.load_into(model, path)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert weights.sha256 == checkpoint.file_sha256(path)
    assert weights.new_layers == ()
    assert checkpoint.read_metadata(path) == {"model": "cnn"}
    assert path.stat().st_mode & 0o777 == 0o644  # readable by the server's other users


def test_a_torch_state_dict_loads_with_weights_only(tmp_path: Path) -> None:
    state = _cnn_state()
    path = tmp_path / "w.pt"
    torch.save(state, path)
    model = model_zoo.build_model("cnn")
    checkpoint.load_into(model, path)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_a_pickle_that_needs_code_execution_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"head.weight": torch.zeros(1), "x": _Evil()}, path)
    with pytest.raises(CheckpointError, match=r"initial-weights: .*evil\.pt: refused: .*run code"):
        checkpoint.read_state(path)
    assert "this must never run" not in capsys.readouterr().out
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(CheckpointError, match=r"initial-weights: .*plain\.pkl"):
        checkpoint.read_state(plain)
    assert "this must never run" not in capsys.readouterr().out


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_truncated_checkpoint_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"w{suffix}"
    if suffix == ".pt":
        torch.save(_cnn_state(), path)
    else:
        checkpoint.save(_cnn_state(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"initial-weights: .*truncated or corrupt"):
        checkpoint.read_state(path)


def test_a_missing_or_unreadable_file_is_refused(tmp_path: Path) -> None:
    missing = r"initial-weights: .*nope\.safetensors: no such file"
    with pytest.raises(CheckpointError, match=missing):
        checkpoint.read_state(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointError, match=r"initial-weights: .*is a folder, not a file"):
        checkpoint.read_state(tmp_path)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=r"initial-weights: .*junk\.pt"):
        checkpoint.read_state(junk)


@pytest.mark.parametrize(
    ("name", "content", "what"),
    [
        ("hello.pt", b"hello", "neither a safetensors nor a torch.save file"),
        ("hello.txt", b"hello\n", "neither a safetensors nor a torch.save file"),
        ("w.json", b'{"features.0.weight": [1, 2]}', "neither a safetensors nor a torch.save file"),
        ("empty.pt", b"", "an empty file"),
    ],
)
def test_a_file_that_is_no_checkpoint_at_all_is_named_as_such(
    tmp_path: Path, name: str, content: bytes, what: str
) -> None:
    """Text given as ``initial-weights`` is not a checkpoint: not a pickle needing code (what
    torch.load says of ``{``), nor a bare KeyError (what it raises for ``hello``)."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        checkpoint.read_state(path)
    message = str(info.value)
    assert message.startswith(f"initial-weights: {path}: not a checkpoint ({what}); expected ")
    assert "safetensors" in message and "state dict" in message and "pickle" not in message


def test_a_non_tensor_entry_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.pt"
    torch.save({"head.weight": torch.zeros(2), "epoch": 3}, path)
    with pytest.raises(CheckpointError, match="'epoch' is a int, not a tensor"):
        checkpoint.read_state(path)


def test_the_first_mismatched_key_is_named_with_both_shapes(tmp_path: Path) -> None:
    state = _cnn_state()
    state["features.3.weight"] = torch.zeros(32, 16, 5, 5)
    path = tmp_path / "w.safetensors"
    checkpoint.save(state, path)
    with pytest.raises(
        CheckpointError,
        match=r"initial-weights: .*: features\.3\.weight is 32×16×5×5 in the checkpoint but "
        r"32×16×3×3 in the model",
    ):
        checkpoint.check(path, "cnn")


def test_another_models_checkpoint_is_refused_naming_a_missing_key(tmp_path: Path) -> None:
    path = tmp_path / "resnet.safetensors"
    checkpoint.save(model_zoo.build_model("resnet18").state_dict(), path)
    with pytest.raises(CheckpointError, match=r"lacks features\.0\.weight \(the model's is "):
        checkpoint.check(path, "cnn")
    extra = _cnn_state()
    extra["adapter.weight"] = torch.zeros(4, 4)
    checkpoint.save(extra, path)
    with pytest.raises(CheckpointError, match=r"adapter\.weight \(4×4 in the checkpoint\) is not"):
        checkpoint.check(path, "cnn")


def test_a_head_for_other_classes_is_replaced_and_recorded(tmp_path: Path) -> None:
    five = _cnn_state(num_classes=5)
    path = tmp_path / "five.safetensors"
    checkpoint.save(five, path)
    torch.manual_seed(11)
    model = model_zoo.build_model("cnn")
    own_head = model.state_dict()["head.weight"].clone()
    weights = checkpoint.load_into(model, path)
    assert weights.new_layers == ("head.weight", "head.bias")
    after = model.state_dict()
    assert torch.equal(after["head.weight"], own_head)  # the model's own seeded init
    assert torch.equal(after["features.0.weight"], five["features.0.weight"])
    assert weights.to_record()["initial-weights-new-layers"] == ["head.weight", "head.bias"]
    assert checkpoint.head_keys(model_zoo.build_model("resnet18")) == ("fc.weight", "fc.bias")
    assert checkpoint.head_keys(model_zoo.build_model("mobilenetv2")) == (
        "classifier.1.weight",
        "classifier.1.bias",
    )


def test_the_checkpoints_sha256_keys_the_r_cache(tmp_path: Path) -> None:
    """Another checkpoint, even with the same tensors, never reuses a cached r."""
    splits = data_splits.load_digits_splits(0)
    state = _cnn_state()
    options = ROptions(
        target_accuracy=0.3,
        lr_ref=0.005,
        b_ref=64,
        eval_every_samples=64,
        max_samples=640,
        seeds=(0,),
        progress=False,
    )
    data = (splits.proxy_train, splits.proxy_eval, [32, 64], options)
    cache_dir = tmp_path / "r"
    a = estimate_r(InitialModel("cnn", state, "a" * 64), *data, cache_dir=cache_dir)
    again = estimate_r(InitialModel("cnn", state, "a" * 64), *data, cache_dir=cache_dir)
    other = estimate_r(InitialModel("cnn", state, "b" * 64), *data, cache_dir=cache_dir)
    assert again.from_cache and again.cache_key == a.cache_key
    assert not other.from_cache and other.cache_key != a.cache_key


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_checkpoint_with_non_finite_weights_is_refused_naming_the_tensor(
    tmp_path: Path, value: float
) -> None:
    """Named before start: it used to pass, spend the whole r estimation, then blame
    r-max-samples."""
    state = {k: torch.full_like(v, value) if v.is_floating_point() else v
             for k, v in _cnn_state().items()}  # fmt: skip
    path = tmp_path / "nan.safetensors"
    checkpoint.save(state, path)
    with pytest.raises(CheckpointError) as err:
        checkpoint.check(path, "cnn")
    found = re.search(r"^initial-weights: .*: (\S+) holds (\d+) of (\d+) values that are NaN "
                      "or infinite", str(err.value))  # fmt: skip
    assert found is not None, err.value
    name, bad, total = found.groups()
    assert name in state and int(bad) == int(total) == state[name].numel()
