"""r by training per batch size (paper §4.2, Eq. 3), cached: the server's and the oracle's.

From the same initial weights, the model is trained with every batch size b on the proxy
training set (Adam, learning rate scaled by sqrt(b / b_ref)) and evaluated on the proxy
evaluation set on a fixed schedule in samples. ``N_s_acc(b)`` is the number of samples
processed when the proxy target accuracy is first reached, averaged over seeds, and
``r_b = N_s_acc(b) / max_b N_s_acc(b)``.

Budget rule: a batch size that does not reach the target within ``max_samples`` for every
seed is marked *unreached*, reported, and left out of the batch sizes the server sends (its
r would be unbounded, and a client must not pick it). If no batch size reaches the target,
``TargetNotReachedError`` says to lower ``proxy-target-accuracy`` or raise ``max-samples``.

The cache (``cache_dir``, one file per ``cache_key``) records what produced each estimate,
its inputs (``cache_inputs``: model, hashes of the initial weights and the proxy sets, B and
the settings), and a sha256 checksum of its content. A file is trusted only when all of it
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
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fl_client import checkpoint, task
from fl_client.checkpoint import InitialWeights
from fl_client.files import set_aside, write_atomic
from fl_client.progress import ProgressBar
from fl_client.settings import RunSettings, SettingsError, parse_batch_sizes, resolve_path

log = logging.getLogger(__name__)

#: Bump when a change to this module or to training changes the numbers it produces:
#: it is part of the cache key, so old cache entries are not reused.
CODE_VERSION = "r-estimation/1"
#: The cache file's format: the estimate with its inputs and checksum. Files of the older
#: format (the bare estimate) are stale: recomputed, never trusted.
CACHE_FORMAT = "powerfl-r-cache/2"

ProgressFn = Callable[[int], None]


class TargetNotReachedError(RuntimeError):
    """No batch size reached the proxy target accuracy within the sample budget."""

    def __init__(self, message: str, estimate: REstimate) -> None:
        super().__init__(message)
        self.estimate = estimate


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


def validate_settings(batch_sizes: Sequence[int], opts: ROptions) -> list[int]:
    """Check the estimation settings; returns the batch sizes as a list of ints.

    Raises
    ------
    ValueError
        The message names the offending key and what is allowed (a ``SettingsError``
        for ``batch-sizes``).
    """
    sizes = parse_batch_sizes(list(batch_sizes))
    target_accuracy, eval_every_samples = opts.target_accuracy, opts.eval_every_samples
    max_samples, seeds = opts.max_samples, opts.seeds
    if not 0.0 < target_accuracy < 1.0:
        raise ValueError(f"proxy-target-accuracy: must be in (0, 1), got {target_accuracy!r}")
    task.scaled_lr(opts.lr_ref, opts.b_ref, sizes[0])  # lr-ref and b-ref: the lr rule's checks
    if not eval_every_samples > 0:
        raise ValueError(f"eval-every-samples: must be > 0, got {eval_every_samples!r}")
    if not max_samples >= eval_every_samples:
        raise ValueError(
            f"max-samples: must be ≥ eval-every-samples ({eval_every_samples}), got {max_samples!r}"
        )
    if not seeds:
        raise ValueError("r-seeds: at least one seed is needed")
    return sizes


def cache_inputs(
    model_name: str,
    initial_state_dict: Mapping[str, torch.Tensor],
    proxy_train: task.Data,
    proxy_eval: task.Data,
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
class TargetRun:
    """One training run to a target accuracy: batch size, learning rate, target, the
    evaluation period and budget in samples, and the data-order seed."""

    batch_size: int
    lr: float
    target_accuracy: float
    eval_every_samples: int
    max_samples: int
    seed: int


def samples_to_target(
    model_name: str,
    initial_state_dict: Mapping[str, torch.Tensor],
    proxy_train: task.Data,
    proxy_eval: task.Data,
    run: TargetRun | None = None,
    on_eval: ProgressFn | None = None,
    device: torch.device | str | None = None,
    **settings: Any,
) -> tuple[int | None, list[tuple[int, float]], int]:
    """Train one (b, seed) from ``initial_state_dict`` until the proxy target accuracy.

    Minibatches of exactly ``batch_size`` samples are drawn from a stream of seeded
    permutations of ``proxy_train`` (a minibatch may span two epochs, so every step has the
    same size even when b does not divide the set); ``device`` is where the model trains
    (default: the CPU). The model is evaluated on ``proxy_eval``
    after the first step that reaches each multiple of ``eval_every_samples`` (and at the
    budget's end); when ``eval_every_samples`` is a multiple of b that is exactly the
    schedule, otherwise the next step boundary after it.

    ``run`` (or its fields as keywords, ``settings``) says what to train.

    Returns
    -------
    (int or None, list of (int, float), int)
        Samples processed when the target was first reached (``None`` if not within
        ``max_samples``), the evaluation points, and the samples processed in all.
    """
    run = run if run is not None else TargetRun(**settings)
    batch_size, eval_every_samples = run.batch_size, run.eval_every_samples
    max_samples, target_accuracy = run.max_samples, run.target_accuracy
    model = task.build_model(model_name)
    model.load_state_dict(dict(initial_state_dict))
    if device is not None:
        model.to(device)
    dev = task.model_device(model)
    x_all, y_all = task.as_tensors(proxy_train)
    n = len(x_all)
    if n == 0:
        raise ValueError("proxy_train: empty proxy training set")
    optimizer = task.make_optimizer(model, run.lr)
    gen = torch.Generator().manual_seed(run.seed)
    model.train()
    order = torch.randperm(n, generator=gen)
    pos = 0
    samples = 0
    next_eval = eval_every_samples
    curve: list[tuple[int, float]] = []
    while samples < max_samples:
        parts = []
        need = batch_size
        while need > 0:
            if pos == n:
                order, pos = torch.randperm(n, generator=gen), 0
            take = min(need, n - pos)
            parts.append(order[pos : pos + take])
            pos += take
            need -= take
        ids = torch.cat(parts)
        task.train_step(model, optimizer, x_all[ids].to(dev), y_all[ids].to(dev))
        samples += batch_size
        if samples >= next_eval or samples >= max_samples:
            _, acc = task.evaluate(model, proxy_eval)
            curve.append((samples, float(acc)))
            if on_eval is not None:
                on_eval(samples)
            if acc >= target_accuracy:
                return samples, curve, samples
            next_eval = (samples // eval_every_samples + 1) * eval_every_samples
    return None, curve, samples


@dataclass(frozen=True)
class ROptions:
    """How r is estimated: the proxy target, Adam's lr at ``b_ref`` (scaled by sqrt(b /
    b_ref)), the evaluation period and the budget per (seed, b) in samples, and the seeds
    N_s_acc(b) is averaged over. The run settings ``proxy-target-accuracy``, ``lr-ref``,
    ``b-ref``, ``r-eval-every-samples``, ``r-max-samples`` and ``r-seeds``."""

    target_accuracy: float
    lr_ref: float
    b_ref: int
    eval_every_samples: int  # run setting r-eval-every-samples (its one default lives there)
    max_samples: int  # run setting r-max-samples
    seeds: Sequence[int] = (0,)
    progress: bool = True  # a rich bar on a terminal; plain log lines otherwise or if False


def estimate_r(
    model_name: str,
    initial_state_dict: Mapping[str, torch.Tensor],
    proxy_train: task.Data,
    proxy_eval: task.Data,
    batch_sizes: Sequence[int],
    options: ROptions | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    weights_sha256: str = "",
    **settings: Any,
) -> REstimate:
    """Estimate r (Eq. 3) on the proxy set, reading and writing an on-disk cache.

    Parameters
    ----------
    model_name : str
        One of ``fl_client.task.MODEL_NAMES``.
    initial_state_dict : mapping of str to Tensor
        The weights every run starts from (the federated run's initial global model).
    proxy_train, proxy_eval : TensorDataset or (Tensor, Tensor)
        The server's proxy data D_S: trained on, and evaluated on.
    batch_sizes : sequence of int
        B, positive and strictly ascending (``batch-sizes``).
    options : ROptions, optional
        ``target_accuracy`` in (0, 1); ``lr_ref`` (Adam at ``b_ref``; b trains at
        lr_ref·sqrt(b/b_ref)); ``eval_every_samples``, the evaluation period, the same for
        every b (a multiple of max(B) makes the schedule exact for every b);
        ``max_samples`` per (seed, b) run; ``seeds``, the data-order seeds N_s_acc(b) is
        averaged over; ``progress``: a rich bar on a terminal, plain log lines otherwise or
        when False.
    cache_dir : path, optional
        Where estimates are cached (keyed by ``cache_key``); no caching if ``None``.
    weights_sha256 : str, optional
        sha256 of the checkpoint ``initial_state_dict`` was read from (the
        ``initial-weights`` run setting); part of the cache key when given, so an estimate
        from other weights is never reused (the weights' own hash is in the key as well).
    **settings
        ``ROptions`` fields as keywords, instead of ``options``.

    Returns
    -------
    REstimate
        r for the batch sizes that reached the target, and the full per-b table.

    Raises
    ------
    ValueError
        Invalid settings (the message names the key).
    TargetNotReachedError
        No batch size reached the target within ``max_samples``.
    """
    opts = options if options is not None else ROptions(**settings)
    sizes = validate_settings(batch_sizes, opts)
    if model_name not in task.MODEL_NAMES:
        raise ValueError(
            f"model: unknown model {model_name!r}; allowed: {', '.join(task.MODEL_NAMES)}"
        )
    lrs = {b: task.scaled_lr(opts.lr_ref, opts.b_ref, b) for b in sizes}
    record: dict[str, Any] = {
        "target_accuracy": float(opts.target_accuracy),
        "lr_ref": float(opts.lr_ref),
        "b_ref": int(opts.b_ref),
        "eval_every_samples": int(opts.eval_every_samples),
        "max_samples": int(opts.max_samples),
        "seeds": [int(s) for s in opts.seeds],
        "optimizer": "adam",
        "lr_scaling": "sqrt",
        "lr_by_batch_size": {str(b): lr for b, lr in lrs.items()},
        "proxy_train_size": len(task.as_tensors(proxy_train)[0]),
        "proxy_eval_size": len(task.as_tensors(proxy_eval)[0]),
    }
    if weights_sha256:
        record["initial_weights_sha256"] = weights_sha256
    inputs = cache_inputs(model_name, initial_state_dict, proxy_train, proxy_eval, sizes, record)
    key = cache_key(inputs)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"r-{model_name}-{key[:24]}.json"
        cached = read_cache(path, inputs)
        if cached is not None:
            log.info("r estimate read from cache %s", path)
            return cached

    est = _compute(
        _Job(model_name, initial_state_dict, proxy_train, proxy_eval, sizes, lrs, record, key),
        opts.progress,
    )
    if path is not None:
        write_cache(path, est, inputs)
    return est


@dataclass(frozen=True)
class _Job:
    """What ``_compute`` trains: model, weights, proxy data, B, lr per b, settings, key."""

    model_name: str
    initial_state_dict: Mapping[str, torch.Tensor]
    proxy_train: task.Data
    proxy_eval: task.Data
    sizes: list[int]
    lrs: dict[int, float]
    settings: dict[str, Any]
    key: str


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


def _compute(job: _Job, progress: bool) -> REstimate:
    settings, sizes, lrs = job.settings, job.sizes, job.lrs
    seeds: list[int] = settings["seeds"]
    target, max_samples = settings["target_accuracy"], settings["max_samples"]
    runs = [(seed, b) for seed in seeds for b in sizes]
    per_b: dict[int, list[int | None]] = {b: [] for b in sizes}
    curves: dict[int, list[tuple[tuple[int, float], ...]]] = {b: [] for b in sizes}
    cost_samples = 0
    t0 = time.perf_counter()
    bar = ProgressBar(
        len(runs),
        enabled=progress,
        title="r estimation",
        terminal_only=True,
        remaining=False,
        logger=log,
    )
    with bar.running():
        for seed, b in runs:
            bar.start(f"r: seed {seed} b={b}", "0 samples")
            t_run = time.perf_counter()
            n_acc, curve, used = samples_to_target(
                job.model_name,
                job.initial_state_dict,
                job.proxy_train,
                job.proxy_eval,
                on_eval=lambda n: bar.detail(f"{n}/{max_samples} samples"),
                batch_size=b,
                lr=lrs[b],
                target_accuracy=target,
                eval_every_samples=settings["eval_every_samples"],
                max_samples=max_samples,
                seed=seed,
            )
            per_b[b].append(n_acc)
            curves[b].append(tuple(curve))
            cost_samples += used
            best = max((a for _, a in curve), default=float("nan"))
            bar.done(
                f"r: seed {seed} b={b} lr={lrs[b]:.2e}: "
                + (
                    f"target {target:.2f} reached at {n_acc} samples"
                    if n_acc is not None
                    else f"target {target:.2f} NOT reached in {used} samples (best {best:.3f})"
                )
                + f" ({time.perf_counter() - t_run:.1f} s)"
            )
    cost_time_s = time.perf_counter() - t0

    eq3 = derive_r(sizes, per_b)
    est = REstimate(
        model_name=job.model_name,
        batch_sizes=eq3.batch_sizes,
        r=eq3.r,
        all_batch_sizes=tuple(sizes),
        reached=eq3.reached,
        samples_to_target={b: tuple(v) for b, v in per_b.items()},
        mean_samples_to_target=eq3.mean_samples_to_target,
        unreached=eq3.unreached,
        curves={b: tuple(v) for b, v in curves.items()},
        cost_time_s=cost_time_s,
        cost_samples=cost_samples,
        settings=settings,
        cache_key=job.key,
    )
    summary = ", ".join(
        f"b{b}={'—' if row['r'] is None else format(row['r'], '.2f')}"
        for b, row in zip(sizes, est.table(), strict=True)
    )
    bar.report(
        f"r estimate ({job.model_name}, proxy target {target:.2f}): {summary}; "
        f"cost {cost_time_s:.1f} s, {cost_samples} samples"
    )
    if not eq3.batch_sizes:
        raise TargetNotReachedError(
            f"r estimation: no batch size in {sizes} reached proxy-target-accuracy "
            f"{target} within max-samples={max_samples} (best proxy accuracy "
            f"{_best_accuracy(est):.3f}); lower proxy-target-accuracy or raise max-samples "
            "(or lr-ref)",
            est,
        )
    if eq3.unreached:
        log.warning(
            "r estimation: batch sizes %s did not reach proxy-target-accuracy %.2f within "
            "max-samples=%d for every seed; they are excluded from the batch sizes sent "
            "to clients",
            list(eq3.unreached),
            target,
            max_samples,
        )
    return est


def round0_model(settings: RunSettings) -> tuple[torch.nn.Module, InitialWeights | None]:
    """A run's round-0 global model: ``model`` built after ``torch.manual_seed(seed)``, with
    ``initial-weights`` loaded when set. The one recipe of the server and of the check
    before start, so both hash the same weights and share one r cache entry."""
    torch.manual_seed(settings.seed)
    model = task.build_model(settings.model)
    weights = None
    if settings.initial_weights:
        weights = checkpoint.load_into(model, resolve_path(settings.initial_weights))
    return model, weights


def estimate_run_r(
    settings: RunSettings,
    state: Mapping[str, torch.Tensor],
    weights_sha256: str = "",
    *,
    progress: bool = True,
) -> REstimate:
    """Eq. 3's r of a federated run on its server's proxy set (``proxy-dataset``, else
    ``dataset``), from the round-0 weights ``state``, with the run's settings and its cache
    (``cache-dir``/r). ``powerfl simulate`` calls it before any engine starts, and the
    server again (then a cache hit).

    Raises
    ------
    SettingsError
        No batch size reached ``proxy-target-accuracy`` within ``r-max-samples``: the
        message names the run settings to change and the best accuracy reached.
    """
    splits = task.load_splits(settings.proxy_dataset or settings.dataset, seed=settings.seed)
    try:
        return estimate_r(
            settings.model,
            state,
            splits.proxy_train,
            splits.proxy_eval,
            settings.batch_sizes,
            target_accuracy=settings.proxy_target_accuracy,
            lr_ref=settings.lr_ref,
            b_ref=settings.b_ref,
            eval_every_samples=settings.r_eval_every_samples,
            max_samples=settings.r_max_samples,
            seeds=tuple(range(settings.r_seeds)),
            cache_dir=resolve_path(settings.cache_dir) / "r",
            weights_sha256=weights_sha256,
            progress=progress,
        )
    except TargetNotReachedError as err:
        best = _best_accuracy(err.estimate)
        sizes = ",".join(map(str, err.estimate.all_batch_sizes))
        raise SettingsError(
            f"r-max-samples: no batch size of {sizes} reached proxy-target-accuracy "
            f"{settings.proxy_target_accuracy:g} on the proxy set within r-max-samples "
            f"{settings.r_max_samples} samples (best proxy accuracy {best:.3f}), so r "
            f"(Eq. 3) is unknown and no round can be planned; raise r-max-samples (e.g. -c "
            f"r-max-samples={4 * settings.r_max_samples}), lower proxy-target-accuracy, or "
            "raise lr-ref"
        ) from None


def _best_accuracy(est: REstimate) -> float:
    accs = [a for cs in est.curves.values() for c in cs for _, a in c]
    return max(accs, default=float("nan"))


# --------------------------------------------------------------------------- the cache


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
