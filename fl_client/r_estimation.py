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

The estimate, its JSON form and its cache (``cache_dir``, one file per ``cache_key``, trusted
only when all of it checks out on load) are ``fl_client.r_cache``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fl_client import checkpoint, data_splits, model_zoo, task
from fl_client.checkpoint import InitialWeights
from fl_client.progress import ProgressBar
from fl_client.r_cache import (
    REstimate,
    cache_inputs,
    cache_key,
    derive_r,
    read_cache,
    write_cache,
)
from fl_client.settings import RunSettings, SettingsError, parse_batch_sizes, resolve_path

log = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]


class TargetNotReachedError(RuntimeError):
    """No batch size reached the proxy target accuracy within the sample budget."""

    def __init__(self, message: str, estimate: REstimate) -> None:
        super().__init__(message)
        self.estimate = estimate


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


@dataclass(frozen=True, eq=False)
class InitialModel:
    """The model every training run to a target starts from: its name (for r, one of
    ``fl_client.model_zoo.MODEL_NAMES``), its weights (the federated run's initial global
    model), and the sha256 of the checkpoint they were read from (the ``initial-weights``
    run setting; "" when none). The sha256 is part of r's cache key when given, so an
    estimate from other weights is never reused (the weights' own hash is in the key as
    well)."""

    model_name: str
    state_dict: Mapping[str, torch.Tensor]
    weights_sha256: str = ""


def samples_to_target(
    start: InitialModel,
    proxy_train: data_splits.Data,
    proxy_eval: data_splits.Data,
    run: TargetRun,
    on_eval: ProgressFn | None = None,
    device: torch.device | str | None = None,
) -> tuple[int | None, list[tuple[int, float]], int]:
    """Train ``run`` = one (b, seed) from ``start`` until the proxy target accuracy.

    Minibatches of exactly ``batch_size`` samples are drawn from a stream of seeded
    permutations of ``proxy_train`` (a minibatch may span two epochs, so every step has the
    same size even when b does not divide the set); ``device`` is where the model trains
    (default: the CPU). The model is evaluated on ``proxy_eval``
    after the first step that reaches each multiple of ``eval_every_samples`` (and at the
    budget's end); when ``eval_every_samples`` is a multiple of b that is exactly the
    schedule, otherwise the next step boundary after it.

    Returns
    -------
    (int or None, list of (int, float), int)
        Samples processed when the target was first reached (``None`` if not within
        ``max_samples``), the evaluation points, and the samples processed in all.
    """
    batch_size, eval_every_samples = run.batch_size, run.eval_every_samples
    max_samples, target_accuracy = run.max_samples, run.target_accuracy
    model = model_zoo.build_model(start.model_name)
    model.load_state_dict(dict(start.state_dict))
    if device is not None:
        model.to(device)
    dev = model_zoo.model_device(model)
    x_all, y_all = data_splits.as_tensors(proxy_train)
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
    start: InitialModel,
    proxy_train: data_splits.Data,
    proxy_eval: data_splits.Data,
    batch_sizes: Sequence[int],
    options: ROptions,
    cache_dir: str | os.PathLike[str] | None = None,
) -> REstimate:
    """Estimate r (Eq. 3) on the proxy set, reading and writing an on-disk cache.

    Parameters
    ----------
    start : InitialModel
        The model (one of ``fl_client.model_zoo.MODEL_NAMES``), the weights every run starts
        from, and the sha256 of their checkpoint (part of the cache key when given).
    proxy_train, proxy_eval : TensorDataset or (Tensor, Tensor)
        The server's proxy data D_S: trained on, and evaluated on.
    batch_sizes : sequence of int
        B, positive and strictly ascending (``batch-sizes``).
    options : ROptions
        ``target_accuracy`` in (0, 1); ``lr_ref`` (Adam at ``b_ref``; b trains at
        lr_ref·sqrt(b/b_ref)); ``eval_every_samples``, the evaluation period, the same for
        every b (a multiple of max(B) makes the schedule exact for every b);
        ``max_samples`` per (seed, b) run; ``seeds``, the data-order seeds N_s_acc(b) is
        averaged over; ``progress``: a rich bar on a terminal, plain log lines otherwise or
        when False.
    cache_dir : path, optional
        Where estimates are cached (keyed by ``cache_key``); no caching if ``None``.

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
    opts = options
    sizes = validate_settings(batch_sizes, opts)
    model_name = start.model_name
    if model_name not in model_zoo.MODEL_NAMES:
        raise ValueError(
            f"model: unknown model {model_name!r}; allowed: {', '.join(model_zoo.MODEL_NAMES)}"
        )
    lrs = {b: task.scaled_lr(opts.lr_ref, opts.b_ref, b) for b in sizes}
    record = _settings_record(opts, lrs, (proxy_train, proxy_eval), start.weights_sha256)
    inputs = cache_inputs(model_name, start.state_dict, proxy_train, proxy_eval, sizes, record)
    key = cache_key(inputs)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"r-{model_name}-{key[:24]}.json"
        cached = read_cache(path, inputs)
        if cached is not None:
            log.info("r estimate read from cache %s", path)
            return cached

    est = _compute(_Job(start, proxy_train, proxy_eval, sizes, lrs, record, key), opts.progress)
    if path is not None:
        write_cache(path, est, inputs)
    return est


def _settings_record(
    opts: ROptions,
    lrs: Mapping[int, float],
    proxy: tuple[data_splits.Data, data_splits.Data],
    weights_sha256: str,
) -> dict[str, Any]:
    """What an estimate depends on besides the model, its weights and the data: the
    settings, the lr of each b, the proxy sets' sizes and the checkpoint's sha256."""
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
        "proxy_train_size": len(data_splits.as_tensors(proxy[0])[0]),
        "proxy_eval_size": len(data_splits.as_tensors(proxy[1])[0]),
    }
    if weights_sha256:
        record["initial_weights_sha256"] = weights_sha256
    return record


@dataclass(frozen=True)
class _Job:
    """What ``_compute`` trains: the start, proxy data, B, lr per b, settings, key."""

    start: InitialModel
    proxy_train: data_splits.Data
    proxy_eval: data_splits.Data
    sizes: list[int]
    lrs: dict[int, float]
    settings: dict[str, Any]
    key: str


def _compute(job: _Job, progress: bool) -> REstimate:
    settings, sizes = job.settings, job.sizes
    target = settings["target_accuracy"]
    t0 = time.perf_counter()
    bar = ProgressBar(
        len(settings["seeds"]) * len(sizes),
        enabled=progress,
        title="r estimation",
        terminal_only=True,
        remaining=False,
        logger=log,
    )
    with bar.running():
        per_b, curves, cost_samples = _train_runs(job, bar)
    cost_time_s = time.perf_counter() - t0

    eq3 = derive_r(sizes, per_b)
    est = REstimate(
        model_name=job.start.model_name,
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
        f"r estimate ({job.start.model_name}, proxy target {target:.2f}): {summary}; "
        f"cost {cost_time_s:.1f} s, {cost_samples} samples"
    )
    _check_reached(est, settings)
    return est


def _train_runs(
    job: _Job, bar: ProgressBar
) -> tuple[dict[int, list[int | None]], dict[int, list[tuple[tuple[int, float], ...]]], int]:
    """Every (seed, b) run of ``job`` to the target: per b, the samples to target and the
    evaluation curve of each seed, and the samples processed in all."""
    settings, lrs = job.settings, job.lrs
    target, max_samples = settings["target_accuracy"], settings["max_samples"]
    per_b: dict[int, list[int | None]] = {b: [] for b in job.sizes}
    curves: dict[int, list[tuple[tuple[int, float], ...]]] = {b: [] for b in job.sizes}
    cost_samples = 0
    for seed, b in [(seed, b) for seed in settings["seeds"] for b in job.sizes]:
        bar.start(f"r: seed {seed} b={b}", "0 samples")
        t_run = time.perf_counter()
        run = TargetRun(
            batch_size=b,
            lr=lrs[b],
            target_accuracy=target,
            eval_every_samples=settings["eval_every_samples"],
            max_samples=max_samples,
            seed=seed,
        )
        n_acc, curve, used = samples_to_target(
            job.start,
            job.proxy_train,
            job.proxy_eval,
            run,
            on_eval=lambda n: bar.detail(f"{n}/{max_samples} samples"),
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
    return per_b, curves, cost_samples


def _check_reached(est: REstimate, settings: Mapping[str, Any]) -> None:
    """The budget rule's outcome: ``TargetNotReachedError`` when no batch size reached the
    target, a warning naming those that did not."""
    sizes, target, max_samples = (
        list(est.all_batch_sizes),
        settings["target_accuracy"],
        settings["max_samples"],
    )
    if not est.batch_sizes:
        raise TargetNotReachedError(
            f"r estimation: no batch size in {sizes} reached proxy-target-accuracy "
            f"{target} within max-samples={max_samples} (best proxy accuracy "
            f"{_best_accuracy(est):.3f}); lower proxy-target-accuracy or raise max-samples "
            "(or lr-ref)",
            est,
        )
    if est.unreached:
        log.warning(
            "r estimation: batch sizes %s did not reach proxy-target-accuracy %.2f within "
            "max-samples=%d for every seed; they are excluded from the batch sizes sent "
            "to clients",
            list(est.unreached),
            target,
            max_samples,
        )


def round0_model(settings: RunSettings) -> tuple[torch.nn.Module, InitialWeights | None]:
    """A run's round-0 global model: ``model`` built after ``torch.manual_seed(seed)``, with
    ``initial-weights`` loaded when set. The one recipe of the server and of the check
    before start, so both hash the same weights and share one r cache entry."""
    torch.manual_seed(settings.seed)
    model = model_zoo.build_model(settings.model)
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
    splits = data_splits.load_splits(settings.proxy_dataset or settings.dataset, seed=settings.seed)
    try:
        return estimate_r(
            InitialModel(settings.model, state, weights_sha256),
            splits.proxy_train,
            splits.proxy_eval,
            settings.batch_sizes,
            ROptions(
                target_accuracy=settings.proxy_target_accuracy,
                lr_ref=settings.lr_ref,
                b_ref=settings.b_ref,
                eval_every_samples=settings.r_eval_every_samples,
                max_samples=settings.r_max_samples,
                seeds=tuple(range(settings.r_seeds)),
                progress=progress,
            ),
            cache_dir=resolve_path(settings.cache_dir) / "r",
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
