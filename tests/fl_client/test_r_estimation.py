"""fl_client.r_estimation: Eq. 3 on a tiny task, the budget rule, validation and the cache.

The run's settings (``r-eval-every-samples``, ``r-max-samples``) are documented in
pyproject.toml; these tests use a tiny two-class task so they run in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from fl_client import data_splits, model_zoo, r_cache, r_estimation, task
from fl_client.r_cache import REstimate
from fl_client.r_estimation import (
    InitialModel,
    ROptions,
    TargetNotReachedError,
    TargetRun,
    estimate_r,
)


def blobs(n: int, seed: int) -> TensorDataset:
    """Two separable classes of 3×32×32 images (mean +1 vs −1, plus noise)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, *model_zoo.IMAGE_SHAPE, generator=gen) * 0.5
    x += (1.0 - 2.0 * y.float()).view(-1, 1, 1, 1)
    return TensorDataset(x, y)


@pytest.fixture(scope="module")
def init_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return dict(model_zoo.build_model("cnn").state_dict())


SETTINGS: dict[str, Any] = {
    "target_accuracy": 0.9,
    "lr_ref": 3e-3,
    "b_ref": 16,
    "eval_every_samples": 16,
    "max_samples": 256,
    "progress": False,
}


def run(init_state: dict[str, torch.Tensor], **overrides: Any) -> REstimate:
    kwargs = {**SETTINGS, **overrides}
    batch_sizes = kwargs.pop("batch_sizes", (4, 16))
    cache_dir = kwargs.pop("cache_dir", None)
    start = InitialModel("cnn", init_state)
    options = ROptions(**kwargs)
    return estimate_r(start, blobs(48, 1), blobs(24, 2), batch_sizes, options, cache_dir)


@pytest.fixture
def count_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Batch sizes of every (seed, b) training run that really happens."""
    calls: list[int] = []
    real = r_estimation.samples_to_target

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3].batch_size)
        return real(*args, **kwargs)

    monkeypatch.setattr(r_estimation, "samples_to_target", counting)
    return calls


def same_result(a: REstimate, b: REstimate) -> bool:
    """Equal up to the wall time it took."""
    return {**a.to_json(), "cost_time_s": 0} == {**b.to_json(), "cost_time_s": 0}


def fake_samples_to_target(table: dict[int, int | None]) -> Any:
    """A stand-in for ``samples_to_target`` returning N_s_acc(b) from ``table``."""

    def fake(*args: Any, **_kw: Any) -> Any:
        run: TargetRun = args[3]
        n = table[run.batch_size]
        used = run.max_samples if n is None else n
        return n, [(used, 0.95 if n is not None else 0.2)], used

    return fake


def test_r_on_tiny_task_is_in_unit_interval_with_max_one(init_state: Any) -> None:
    est = run(init_state, seeds=(0, 1))
    assert est.batch_sizes == (4, 16) and est.unreached == () and all(est.reached)
    assert all(0.0 < r <= 1.0 for r in est.r) and max(est.r) == 1.0
    per_seed = [[int(s or 0) for s in v] for v in est.samples_to_target.values()]
    assert all(len(v) == 2 for v in per_seed)
    assert all(s is not None for v in est.samples_to_target.values() for s in v)
    n = {b: float(v or 0) for b, v in est.mean_samples_to_target.items()}
    assert est.r == tuple(n[b] / max(n.values()) for b in est.batch_sizes)
    # N_s_acc lies on the shared evaluation schedule and is at least one evaluation period.
    assert all(s % 16 == 0 and s >= 16 for v in per_seed for s in v)
    assert est.cost_samples >= sum(map(sum, per_seed))
    assert est.settings["lr_by_batch_size"] == {"4": pytest.approx(1.5e-3), "16": 3e-3}


def test_eq3_and_budget_rule_exclude_unreached_batch_size(
    init_state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {4: 64, 8: 96, 16: 128, 32: None}
    monkeypatch.setattr(r_estimation, "samples_to_target", fake_samples_to_target(table))
    est = run(init_state, batch_sizes=(4, 8, 16, 32))
    assert est.batch_sizes == (4, 8, 16)
    assert est.r == pytest.approx((0.5, 0.75, 1.0))
    assert est.unreached == (32,)
    assert est.reached == (True, True, True, False)
    assert [row["r"] for row in est.table()] == [0.5, 0.75, 1.0, None]


def test_b_reached_for_only_some_seeds_counts_as_unreached(
    init_state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake(*args: Any, **_kw: Any) -> Any:
        run: TargetRun = args[3]
        n = None if (run.batch_size == 16 and run.seed == 1) else 32 * run.batch_size
        return n, [], run.max_samples if n is None else n

    monkeypatch.setattr(r_estimation, "samples_to_target", fake)
    est = run(init_state, batch_sizes=(4, 16), seeds=(0, 1))
    assert est.batch_sizes == (4,) and est.r == (1.0,) and est.unreached == (16,)
    assert est.samples_to_target[16] == (512, None)


def test_unreachable_target_raises_with_advice(init_state: Any) -> None:
    # Labels of the evaluation set are random: no model gets 99% on them.
    x, _ = data_splits.as_tensors(blobs(24, 2))
    noise = TensorDataset(
        x, torch.randint(0, 10, (24,), generator=torch.Generator().manual_seed(3))
    )
    with pytest.raises(TargetNotReachedError, match="proxy-target-accuracy") as err:
        estimate_r(
            InitialModel("cnn", init_state), blobs(48, 1), noise, (16, 32),
            ROptions(**{**SETTINGS, "target_accuracy": 0.99, "max_samples": 32}),
        )  # fmt: skip
    assert "max-samples" in str(err.value)
    assert err.value.estimate.unreached == (16, 32)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"batch_sizes": ()}, "batch-sizes"),
        ({"batch_sizes": (16, 4)}, "batch-sizes"),
        ({"batch_sizes": (0, 4)}, "batch-sizes"),
        ({"target_accuracy": 1.0}, "proxy-target-accuracy"),
        ({"target_accuracy": 0.0}, "proxy-target-accuracy"),
        ({"lr_ref": 0.0}, "lr-ref"),
        ({"b_ref": 0}, "b-ref"),
        ({"eval_every_samples": 0}, "eval-every-samples"),
        ({"max_samples": 8}, "max-samples"),
        ({"seeds": ()}, "r-seeds"),
    ],
)
def test_invalid_settings_name_the_key(init_state: Any, overrides: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        run(init_state, **overrides)


def test_cache_hit_returns_identical_result_without_training(
    init_state: Any, tmp_path: Path, count_runs: list[int]
) -> None:
    first = run(init_state, cache_dir=tmp_path)
    assert count_runs == [4, 16] and not first.from_cache
    second = run(init_state, cache_dir=tmp_path)
    assert count_runs == [4, 16]  # no new training
    assert second.from_cache and second == first and second.to_json() == first.to_json()
    assert [p.name for p in tmp_path.iterdir()] == [f"r-cnn-{first.cache_key[:24]}.json"]


def test_cache_key_changes_with_every_setting(init_state: Any) -> None:
    def cache_key(*args: Any) -> str:
        return r_cache.cache_key(r_cache.cache_inputs(*args))

    data = (blobs(48, 1), blobs(24, 2))
    base = {"target_accuracy": 0.9, "lr_ref": 3e-3, "b_ref": 16}
    key = cache_key("cnn", init_state, *data, [4, 16], base)
    assert key == cache_key("cnn", init_state, *data, [4, 16], dict(base))
    other_state = {k: v + 1 if v.is_floating_point() else v for k, v in init_state.items()}
    variants = [
        cache_key("cnn", init_state, *data, [4, 16], {**base, "lr_ref": 1e-3}),
        cache_key("cnn", init_state, *data, [4, 16], {**base, "target_accuracy": 0.8}),
        cache_key("cnn", init_state, *data, [4, 8], base),
        cache_key("resnet18", init_state, *data, [4, 16], base),
        cache_key("cnn", other_state, *data, [4, 16], base),
        cache_key("cnn", init_state, blobs(48, 5), data[1], [4, 16], base),
    ]
    assert len({key, *variants}) == len(variants) + 1


def test_changed_setting_misses_the_cache(
    init_state: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(r_estimation, "samples_to_target", fake_samples_to_target({4: 32, 16: 64}))
    a = run(init_state, cache_dir=tmp_path)
    b = run(init_state, cache_dir=tmp_path, max_samples=512)
    assert a.cache_key != b.cache_key and not b.from_cache
    assert len(list(tmp_path.glob("r-cnn-*.json"))) == 2


@pytest.mark.parametrize("garbage", ["{not json", '{"r": [1.0]}', "corrupt-key"])
def test_corrupt_cache_is_moved_aside_and_recomputed(
    init_state: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    garbage: str,
) -> None:
    monkeypatch.setattr(r_estimation, "samples_to_target", fake_samples_to_target({4: 32, 16: 64}))
    first = run(init_state, cache_dir=tmp_path)
    (path,) = tmp_path.glob("r-cnn-*.json")
    if garbage == "corrupt-key":  # valid JSON for another key: must not be trusted
        data = json.loads(path.read_text())
        data["cache_key"] = "0" * 64
        garbage = json.dumps(data)
    path.write_text(garbage)
    with caplog.at_level("WARNING", logger="fl_client.r_estimation"):
        again = run(init_state, cache_dir=tmp_path)
    assert f"r cache {path} refused" in caplog.text
    assert not again.from_cache and same_result(again, first)
    assert len(list(tmp_path.glob(f"{path.name}.corrupt-*"))) == 1
    assert same_result(cached_estimate(path), first)  # rewritten, valid


def cached_estimate(path: Path) -> REstimate:
    return REstimate.from_json(json.loads(path.read_text())["estimate"])


def refused_and_recomputed(
    init_state: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, path: Path, why: str
) -> REstimate:
    """Run again on the cache folder: the file at ``path`` must be refused for ``why`` (one
    warning line naming it), set aside, and r recomputed and written anew."""
    with caplog.at_level("WARNING", logger="fl_client.r_estimation"):
        again = run(init_state, cache_dir=tmp_path, **CACHED)
    (line,) = [r.getMessage() for r in caplog.records if "r cache" in r.getMessage()]
    assert line.startswith(f"r cache {path} refused: ") and why in line, line
    assert not again.from_cache
    assert len(list(tmp_path.glob(f"{path.name}.corrupt-*"))) == 1
    assert same_result(cached_estimate(path), again)  # rewritten, valid
    return again


CACHED: dict[str, Any] = {"batch_sizes": (4, 16, 32), "seeds": (0, 1)}


@pytest.fixture
def cached(
    init_state: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[REstimate, Path]:
    """A cache file written by a run whose training is faked: b4 and b16 reach the target
    at 32 and 64 samples (seeds 0 and 1 alike), b32 never."""
    monkeypatch.setattr(
        r_estimation, "samples_to_target", fake_samples_to_target({4: 32, 16: 64, 32: None})
    )
    est = run(init_state, cache_dir=tmp_path, **CACHED)
    assert est.r == (0.5, 1.0) and est.unreached == (32,)
    (path,) = tmp_path.glob("r-cnn-*.json")
    return est, path


def test_cache_round_trip_records_inputs_and_checksum(
    init_state: Any, tmp_path: Path, cached: tuple[REstimate, Path], count_runs: list[int]
) -> None:
    first, path = cached
    data = json.loads(path.read_text())
    assert data["format"] == r_cache.CACHE_FORMAT
    assert data["cache_key"] == first.cache_key
    inputs = data["inputs"]
    assert inputs["model_name"] == "cnn" and inputs["batch_sizes"] == [4, 16, 32]
    assert inputs["initial_state"] == task.state_hash(init_state)
    assert inputs["proxy_train"] == task.data_hash(blobs(48, 1))
    assert inputs["proxy_eval"] == task.data_hash(blobs(24, 2))
    assert inputs["settings"] == first.settings
    assert len(data["checksum"]) == 64 and data["estimate"] == first.to_json()
    again = run(init_state, cache_dir=tmp_path, **CACHED)
    assert again.from_cache and again == first and count_runs == []  # verified, no training
    assert r_cache.read_cache(path, inputs) == first


def test_cache_with_a_tampered_r_is_refused_and_recomputed(
    init_state: Any, tmp_path: Path, cached: tuple[REstimate, Path], caplog: Any
) -> None:
    _, path = cached
    data = json.loads(path.read_text())
    data["estimate"]["r"] = [0.9, 1.0]  # b4 made to look better than its samples say
    del data["checksum"]
    data["checksum"] = r_cache._checksum(data)  # a consistent checksum: only r lies
    path.write_text(json.dumps(data))
    again = refused_and_recomputed(
        init_state, tmp_path, caplog, path, "r contradicts its stored samples: r of b4 is 0.9"
    )
    assert again.r == (0.5, 1.0)


def test_cache_with_r_of_an_unreached_batch_size_is_refused(
    init_state: Any, tmp_path: Path, cached: tuple[REstimate, Path], caplog: Any
) -> None:
    _, path = cached
    data = json.loads(path.read_text())
    est = data["estimate"]
    est["batch_sizes"], est["r"], est["reached"] = [4, 16, 32], [0.5, 1.0, 0.25], [True] * 3
    est["unreached"] = []
    del data["checksum"]
    data["checksum"] = r_cache._checksum(data)
    path.write_text(json.dumps(data))
    refused_and_recomputed(init_state, tmp_path, caplog, path, "r contradicts its stored samples")


def test_cache_with_a_bad_checksum_is_refused_and_recomputed(
    init_state: Any, tmp_path: Path, cached: tuple[REstimate, Path], caplog: Any
) -> None:
    first, path = cached
    data = json.loads(path.read_text())
    data["estimate"]["samples_to_target"]["4"] = [16, 16]  # r 0.25 would follow; no new sum
    data["estimate"]["mean_samples_to_target"]["4"] = 16.0
    data["estimate"]["r"] = [0.25, 1.0]
    path.write_text(json.dumps(data))
    again = refused_and_recomputed(init_state, tmp_path, caplog, path, "checksum mismatch")
    assert again.r == first.r


def test_cache_made_from_other_inputs_is_refused(
    init_state: Any, tmp_path: Path, cached: tuple[REstimate, Path], caplog: Any
) -> None:
    _, path = cached
    data = json.loads(path.read_text())
    data["inputs"]["proxy_eval"] = "0" * 64
    del data["checksum"]
    data["checksum"] = r_cache._checksum(data)
    path.write_text(json.dumps(data))
    refused_and_recomputed(init_state, tmp_path, caplog, path, "other inputs (proxy_eval differ)")


def test_old_format_cache_is_stale_and_recomputed(
    init_state: Any,
    tmp_path: Path,
    cached: tuple[REstimate, Path],
    caplog: Any,
    count_runs: list[int],
) -> None:
    first, path = cached
    old = {**first.to_json(), "r": [0.9, 1.0]}  # the bare estimate, as before: never trusted
    path.write_text(json.dumps(old))
    with caplog.at_level("WARNING", logger="fl_client.r_estimation"):
        again = run(init_state, cache_dir=tmp_path, **CACHED)
    assert f"r cache {path} is of the older format" in caplog.text
    assert not again.from_cache and again.r == (0.5, 1.0) and count_runs == [4, 16, 32] * 2
    assert json.loads(path.read_text())["format"] == r_cache.CACHE_FORMAT


def test_json_roundtrip(init_state: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        r_estimation, "samples_to_target", fake_samples_to_target({4: 32, 16: None})
    )
    est = run(init_state)
    text = json.dumps(est.to_json())
    assert REstimate.from_json(text) == est
    assert REstimate.from_json(json.loads(text)).unreached == (16,)
    with pytest.raises(ValueError, match="malformed"):
        REstimate.from_json({**est.to_json(), "r": [1.5]})


def test_progress_falls_back_to_log_lines(
    init_state: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(r_estimation, "samples_to_target", fake_samples_to_target({4: 32, 16: 64}))
    with caplog.at_level("INFO", logger="fl_client.r_estimation"):
        run(init_state, progress=True)  # pytest captures stderr: not a terminal
    assert "seed 0 b=4" in caplog.text and "seed 0 b=16" in caplog.text
    assert "cost" in caplog.text
