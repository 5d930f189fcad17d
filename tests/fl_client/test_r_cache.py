"""fl_client.r_cache: Eq. 3 from samples to target, the estimate's JSON form and its cache
file, without any training (the estimates are built from made-up samples to target)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fl_client import r_cache
from fl_client.r_cache import REstimate, derive_r, r_from_samples, read_cache, write_cache

INPUTS = {"code_version": r_cache.CODE_VERSION, "model_name": "cnn", "batch_sizes": [4, 16, 32]}
PER_B: dict[int, tuple[int | None, ...]] = {4: (40, 60), 16: (100, 100), 32: (None, 80)}


def estimate(per_b: dict[int, tuple[int | None, ...]] = PER_B) -> REstimate:
    """An estimate as ``estimate_r`` makes one from these samples to target."""
    sizes = sorted(per_b)
    eq3 = derive_r(sizes, per_b)
    return REstimate(
        model_name="cnn",
        batch_sizes=eq3.batch_sizes,
        r=eq3.r,
        all_batch_sizes=tuple(sizes),
        reached=eq3.reached,
        samples_to_target=dict(per_b),
        mean_samples_to_target=eq3.mean_samples_to_target,
        unreached=eq3.unreached,
        curves={b: ((((n or 8), 0.5),),) for b, (n, *_) in per_b.items()},
        cost_time_s=1.5,
        cost_samples=400,
        settings={"target_accuracy": 0.9},
        cache_key=r_cache.cache_key(INPUTS),
    )


def test_eq3_over_the_batch_sizes_every_seed_reached() -> None:
    eq3 = derive_r([4, 16, 32], PER_B)
    assert eq3.reached == (True, True, False) and eq3.unreached == (32,)
    assert eq3.mean_samples_to_target == {4: 50.0, 16: 100.0, 32: None}
    assert eq3.batch_sizes == (4, 16) and eq3.r == (0.5, 1.0)
    assert r_from_samples({4: 50.0, 16: None}, [4, 16]) == ([4], [1.0])
    assert r_from_samples({4: None}, [4]) == ([], [])


def test_the_json_form_round_trips_and_refuses_an_r_outside_the_unit_interval() -> None:
    est = estimate()
    again = REstimate.from_json(json.dumps(est.to_json()), from_cache=True)
    assert again == est and again.from_cache
    bad = {**est.to_json(), "r": [0.5, 1.5]}
    with pytest.raises(ValueError, match="r outside"):
        REstimate.from_json(bad)


def test_a_written_cache_file_reads_back_and_a_tampered_one_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.json"
    est = estimate()
    write_cache(path, est, INPUTS)
    assert read_cache(path, INPUTS) == est
    assert read_cache(path, {**INPUTS, "batch_sizes": [4, 16]}) is None  # other inputs
    assert not path.exists()  # set aside, with a warning naming why
    assert "made from other inputs (batch_sizes differ)" in caplog.text
    for checksum, why in (("stale", "checksum mismatch"), ("fresh", "r contradicts its stored")):
        write_cache(path, est, INPUTS)
        record = json.loads(path.read_text())
        record["estimate"]["r"] = [0.9, 1.0]  # r that its samples to target do not give
        if checksum == "fresh":  # a consistent checksum: only r lies
            del record["checksum"]
            record["checksum"] = r_cache._checksum(record)
        path.write_text(json.dumps(record))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert read_cache(path, INPUTS) is None
        assert why in caplog.text and not path.exists()
