"""An r estimate (paper §4.2, Eq. 3) as a record: Eq. 3 from the samples to target, the
estimate's JSON form, and its on-disk cache.

The cache (one file per ``cache_key``) records what produced each estimate, its inputs
(``cache_inputs``: model, hashes of the initial weights and the proxy sets, B and the
settings), and a sha256 checksum of its content. A file is trusted only when all of it
checks out on load: the format, the checksum, the inputs of this call, and r as Eq. 3
derives it again from the file's own per-seed samples to target. A file that fails is set
aside (``fl_client.files.set_aside``) with one warning line naming it and why, and r is
recomputed; a file of the older format (no inputs or checksum) is stale and recomputed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fl_client import data_splits, task
from fl_client.files import set_aside, write_atomic

log = logging.getLogger(__name__)

#: Bump when a change to r estimation (``fl_client.r_estimation``) or to training changes the
#: numbers it produces: it is part of the cache key, so old cache entries are not reused.
CODE_VERSION = "r-estimation/1"
#: The cache file's format: the estimate with its inputs and checksum. Files of the older
#: format (the bare estimate) are stale: recomputed, never trusted.
CACHE_FORMAT = "powerfl-r-cache/2"


@dataclass(frozen=True)
class REstimate:
    """Result of ``estimate_r``.

    Attributes
    ----------
    model_name : str
        The model trained.
    batch_sizes : tuple of int
        The batch sizes that reached the target (ascending): the ones the server sends.
    r : tuple of float
        ``r_b`` in (0, 1], aligned with ``batch_sizes``; its maximum is 1.
    all_batch_sizes : tuple of int
        Every batch size that was tried.
    reached : tuple of bool
        Whether each of ``all_batch_sizes`` reached the target for every seed.
    samples_to_target : dict
        b → samples to target per seed (``None`` where the budget ran out).
    mean_samples_to_target : dict
        b → mean over seeds of ``samples_to_target`` (``None`` if unreached): N_s_acc(b).
    unreached : tuple of int
        Batch sizes left out by the budget rule.
    curves : dict
        b → per seed, the (samples, proxy accuracy) evaluation points.
    cost_time_s : float
        Host wall time of the estimation (of the original run when read from the cache).
    cost_samples : int
        Training samples processed over all (seed, b) runs.
    settings : dict
        What the estimate depends on (target, lr-ref, b-ref, schedule, budget, seeds, …).
    cache_key : str
        sha256 of everything the estimate depends on.
    from_cache : bool
        True when read from the on-disk cache (not part of equality or JSON).
    """

    model_name: str
    batch_sizes: tuple[int, ...]
    r: tuple[float, ...]
    all_batch_sizes: tuple[int, ...]
    reached: tuple[bool, ...]
    samples_to_target: dict[int, tuple[int | None, ...]]
    mean_samples_to_target: dict[int, float | None]
    unreached: tuple[int, ...]
    curves: dict[int, tuple[tuple[tuple[int, float], ...], ...]]
    cost_time_s: float
    cost_samples: int
    settings: dict[str, Any]
    cache_key: str = ""
    from_cache: bool = field(default=False, compare=False)

    @property
    def r_by_batch_size(self) -> dict[int, float]:
        """b → r_b for the reached batch sizes."""
        return dict(zip(self.batch_sizes, self.r, strict=True))

    def table(self) -> list[dict[str, Any]]:
        """One row per tried batch size: lr, reached, N_s_acc per seed and mean, r."""
        lrs = self.settings.get("lr_by_batch_size", {})
        return [
            {
                "batch-size": b,
                "lr": lrs.get(str(b)),
                "reached": ok,
                "samples-to-target": list(self.samples_to_target[b]),
                "mean-samples-to-target": self.mean_samples_to_target[b],
                "r": self.r_by_batch_size.get(b),
            }
            for b, ok in zip(self.all_batch_sizes, self.reached, strict=True)
        ]

    def to_json(self) -> dict[str, Any]:
        """A JSON-compatible dict (``json.dumps`` it); inverse of ``from_json``."""
        return {
            "code_version": CODE_VERSION,
            "model_name": self.model_name,
            "batch_sizes": list(self.batch_sizes),
            "r": list(self.r),
            "all_batch_sizes": list(self.all_batch_sizes),
            "reached": list(self.reached),
            "samples_to_target": {str(b): list(v) for b, v in self.samples_to_target.items()},
            "mean_samples_to_target": {str(b): v for b, v in self.mean_samples_to_target.items()},
            "unreached": list(self.unreached),
            "curves": {
                str(b): [[list(pt) for pt in c] for c in cs] for b, cs in self.curves.items()
            },
            "cost_time_s": self.cost_time_s,
            "cost_samples": self.cost_samples,
            "settings": self.settings,
            "cache_key": self.cache_key,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str, *, from_cache: bool = False) -> REstimate:
        """Rebuild from ``to_json()``'s dict (or its JSON text).

        Raises
        ------
        ValueError
            Malformed or inconsistent data (missing keys, wrong types, r outside (0, 1]).
        """
        d = json.loads(data) if isinstance(data, str) else data
        try:
            est = cls(
                model_name=str(d["model_name"]),
                batch_sizes=tuple(int(b) for b in d["batch_sizes"]),
                r=tuple(float(x) for x in d["r"]),
                all_batch_sizes=tuple(int(b) for b in d["all_batch_sizes"]),
                reached=tuple(bool(x) for x in d["reached"]),
                samples_to_target={
                    int(b): tuple(None if s is None else int(s) for s in v)
                    for b, v in d["samples_to_target"].items()
                },
                mean_samples_to_target={
                    int(b): None if v is None else float(v)
                    for b, v in d["mean_samples_to_target"].items()
                },
                unreached=tuple(int(b) for b in d["unreached"]),
                curves={
                    int(b): tuple(tuple((int(s), float(a)) for s, a in c) for c in cs)
                    for b, cs in d["curves"].items()
                },
                cost_time_s=float(d["cost_time_s"]),
                cost_samples=int(d["cost_samples"]),
                settings=dict(d["settings"]),
                cache_key=str(d.get("cache_key", "")),
                from_cache=from_cache,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed r estimate: {exc!r}") from exc
        if len(est.r) != len(est.batch_sizes) or len(est.reached) != len(est.all_batch_sizes):
            raise ValueError("malformed r estimate: lengths do not match")
        if not all(0.0 < x <= 1.0 for x in est.r):
            raise ValueError(f"malformed r estimate: r outside (0, 1]: {est.r}")
        return est


def r_from_samples(
    n_by_b: Mapping[int, float | None], batch_sizes: Sequence[int]
) -> tuple[list[int], list[float]]:
    """Eq. 3 over the batch sizes that reached the target: (those b, r_b = N(b) / max N).

    ``n_by_b`` maps b to its samples to the accuracy target (None: never reached); batch
    sizes that never reached it are left out, so the result may be empty.
    """
    reached = [b for b in batch_sizes if n_by_b.get(b) is not None]
    if not reached:
        return [], []
    n_max = max(float(n_by_b[b] or 0) for b in reached)
    return reached, [float(n_by_b[b] or 0) / n_max for b in reached]


def cache_inputs(
    model_name: str,
    initial_state_dict: Mapping[str, torch.Tensor],
    proxy_train: data_splits.Data,
    proxy_eval: data_splits.Data,
    batch_sizes: Sequence[int],
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """Everything an estimate depends on, including ``CODE_VERSION``: the initial weights
    and the proxy sets as sha256 hashes, the rest as it is. Stored in the cache file."""
    return {
        "code_version": CODE_VERSION,
        "model_name": model_name,
        "initial_state": task.state_hash(initial_state_dict),
        "proxy_train": task.data_hash(proxy_train),
        "proxy_eval": task.data_hash(proxy_eval),
        "batch_sizes": [int(b) for b in batch_sizes],
        "settings": dict(settings),
    }


def _sha256(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def cache_key(inputs: Mapping[str, Any]) -> str:
    """sha256 (hex) of ``cache_inputs``' result: everything an estimate depends on."""
    return _sha256(dict(inputs))


@dataclass(frozen=True)
class _Eq3:
    """Eq. 3 over the per-seed samples to target of each batch size (``derive_r``)."""

    reached: tuple[bool, ...]
    mean_samples_to_target: dict[int, float | None]
    batch_sizes: tuple[int, ...]
    unreached: tuple[int, ...]
    r: tuple[float, ...]


def derive_r(sizes: Sequence[int], per_b: Mapping[int, Sequence[int | None]]) -> _Eq3:
    """r as ``estimate_r`` derives it from N_s_acc per (b, seed): a b is reached when every
    seed reached the target, N_s_acc(b) is the mean over seeds, r_b = N_s_acc(b) / max."""
    reached = tuple(bool(per_b[b]) and all(n is not None for n in per_b[b]) for b in sizes)
    mean_n: dict[int, float | None] = {
        b: (sum(n for n in per_b[b] if n is not None) / len(per_b[b]) if ok else None)
        for b, ok in zip(sizes, reached, strict=True)
    }
    reached_sizes, r = r_from_samples(mean_n, sizes)
    unreached = tuple(b for b, ok in zip(sizes, reached, strict=True) if not ok)
    return _Eq3(reached, mean_n, tuple(reached_sizes), unreached, tuple(r))


class _RefusedError(ValueError):
    """A cache file that must not be trusted; the message says why."""


def _checksum(record: Mapping[str, Any]) -> str:
    """sha256 of a cache record's content: every field but the checksum itself."""
    return _sha256({k: v for k, v in record.items() if k != "checksum"})


def cache_record(est: REstimate, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The cache file's content: ``est`` with the inputs that produced it and a checksum."""
    record = {
        "format": CACHE_FORMAT,
        "cache_key": cache_key(inputs),
        "inputs": dict(inputs),
        "estimate": est.to_json(),
    }
    return {**record, "checksum": _checksum(record)}


def write_cache(path: Path, est: REstimate, inputs: Mapping[str, Any]) -> None:
    """Write ``est`` to the cache file ``path`` (atomically; see ``cache_record``)."""
    write_atomic(path, json.dumps(cache_record(est, inputs), indent=2) + "\n")


def _contradiction(est: REstimate) -> str | None:
    """Where ``est`` disagrees with Eq. 3 over its own samples to target; None if nowhere."""
    sizes = est.all_batch_sizes
    if set(est.samples_to_target) != set(sizes):
        return f"samples to target for b {sorted(est.samples_to_target)}, tried {list(sizes)}"
    eq3 = derive_r(sizes, est.samples_to_target)
    stored_r = dict(zip(est.batch_sizes, est.r, strict=True))
    derived_r = dict(zip(eq3.batch_sizes, eq3.r, strict=True))
    if stored_r.keys() != derived_r.keys():
        return (
            f"r given for b {list(stored_r)}, but its samples reach the target for b "
            f"{list(derived_r)}"
        )
    for b, r in derived_r.items():
        if not math.isclose(stored_r[b], r, rel_tol=1e-9):
            return f"r of b{b} is {stored_r[b]:.6g}, its samples to target give {r:.6g}"
    if (est.reached, est.unreached) != (eq3.reached, eq3.unreached):
        return "the reached batch sizes do not follow from the samples to target"
    for b, mean in eq3.mean_samples_to_target.items():
        got = est.mean_samples_to_target.get(b)
        if (got is None) != (mean is None) or (
            got is not None and mean is not None and not math.isclose(got, mean, rel_tol=1e-9)
        ):
            return f"mean samples to target of b{b} is {got}, its samples give {mean}"
    return None


def _verified(data: Any, inputs: Mapping[str, Any]) -> REstimate:
    """The estimate of a cache record that checks out against ``inputs``; ``_RefusedError``
    (or ValueError for a malformed estimate) naming why not."""
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        raise _RefusedError(f"not an r cache file of format {CACHE_FORMAT}")
    if data.get("checksum") != _checksum(data):
        raise _RefusedError("checksum mismatch: the content changed after it was written")
    if data.get("inputs") != dict(inputs) or data.get("cache_key") != cache_key(inputs):
        stored: dict[str, Any] = data["inputs"] if isinstance(data.get("inputs"), dict) else {}
        differ = sorted(k for k in inputs if stored.get(k) != inputs[k])
        raise _RefusedError(f"made from other inputs ({', '.join(differ) or 'cache_key'} differ)")
    est = REstimate.from_json(data["estimate"], from_cache=True)
    if est.cache_key != data["cache_key"]:
        raise _RefusedError(f"estimate's cache key {est.cache_key[:12]}… is not the file's")
    why = _contradiction(est)
    if why is not None:
        raise _RefusedError(f"r contradicts its stored samples: {why}")
    return est


def _is_old_format(data: Any) -> bool:
    """A bare estimate, as the cache held before it recorded inputs and a checksum."""
    return isinstance(data, dict) and "format" not in data and "code_version" in data


def read_cache(path: Path, inputs: Mapping[str, Any]) -> REstimate | None:
    """The cached estimate at ``path`` if the file checks out against ``inputs``, else None.

    A file that does not check out (unreadable, not JSON, bad checksum, other inputs, r
    that contradicts its own samples) is set aside with one warning line naming it and
    why; a file of the older format is stale (None, and the new estimate replaces it).
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if _is_old_format(data):
            log.warning(
                "r cache %s is of the older format (no inputs or checksum): stale, recomputing",
                path,
            )
            return None
        return _verified(data, inputs)
    except (ValueError, OSError) as exc:  # json.JSONDecodeError and _RefusedError are ValueErrors
        kept = set_aside(path)
        log.warning("r cache %s refused: %s; %s; recomputing", path, exc, kept)
        return None
