"""The single-device study (the paper's Tables 2–4): B1, B2, ours and the oracle on one board.

For every model, device, cap and seed, and every method, TT_acc and energy are built from
real work, nothing assumed:

1. **Training runs** (per model, seed and batch size b, on the host, no device): the model
   trains from the seed's initial weights with Adam at lr_ref·sqrt(b/b_ref)
   (``fl_client.r_estimation.samples_to_target``) until the accuracy target, on

   * the proxy (``proxy``, evaluated on proxy-eval, ``proxy-target-accuracy``): N_proxy(b),
     from which r for ours and B2 (Eq. 3);
   * the target (``target``, evaluated on target-test, ``target-accuracy``): N_target(b),
     which is both the oracle's r (the paper's "fastest configuration" trains on the target
     with every b) and the samples every method needs with the b it chose.

2. **Profiling** (per device, cap, seed): ``fl_client.profiler.profile`` on the device's
   digital twin (efficient mode under a cap; without a cap ``profile-uncapped``), real
   training steps on the host, time and power from the twin. Its device time and energy are
   charged to ours and the oracle (B1 and B2 do not profile).

3. **Selection**: B1 = largest b that fits the board's memory at the board's fixed safe
   frequency for the cap; B2 = smallest proxy r at the same frequency; ours = Eq. 4 with the
   proxy r; oracle = Eq. 4 with the target r (``fl_client.selector``).

4. **Accounting**: the chosen (b, f) is locked on a fresh twin and the N_target(b) samples
   (N_target(b)/b steps) are accounted through ``device.measure``: TT_acc = that device time
   (+ profiling time for ours/oracle), energy likewise.

Each unit of work (a training run, a profile+selection cell, a full-grid LUT for the plots)
is a JSON record under ``records/``; finished records are not recomputed.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from fl_client import image_data, model_zoo, selector, task
from fl_client.devices import open_device
from fl_client.devices.descriptors import DeviceSpec, load_device_spec
from fl_client.node import workload_for
from fl_client.power import PowerLimit
from fl_client.profiler import ProfileOptions, profile
from fl_client.r_cache import r_from_samples
from fl_client.selection import Selection
from simulations.experiments import single_device_report
from simulations.experiments.config import ExperimentConfigError
from simulations.experiments.datasets import StudyData, study_data
from simulations.experiments.records import digest, read_record
from simulations.experiments.report_kit import cap_label
from simulations.experiments.single_device_config import (
    NAME,
    SingleDeviceConfig,
    parse_single_device,
)
from simulations.experiments.study import Outcome, Preflight, RunOptions, StudyPlugin
from simulations.experiments.units import (
    CODE_VERSION,
    TargetRun,
    TrainingRecord,
    Unit,
    checked_torch_device,
    fitting_batch_sizes,
    full_lut_record,
    lut_dict,
    lut_key,
    lut_rows,
    resolve_torch_device,
    run_units,
    train_images,
    training_key,
    training_line,
)

if TYPE_CHECKING:
    from fl_client.devices.base import Workload
    from fl_client.lut import LUT

CELL_VERSION = 2  # profile/selection/accounting records
ROLES = ("proxy", "target")
#: Whose samples to target give each method its r (B1 uses none).
R_ROLE: dict[str, str | None] = {
    "b1": None,
    "b2": "proxy",
    "power-aware": "proxy",
    "oracle": "target",
}
#: The methods that select from the cell's profiled LUT (and pay for profiling).
LUT_METHODS = ("power-aware", "oracle")
NOT_REACHED = {
    "b2": "no batch size reached proxy-target-accuracy",
    "power-aware": "no batch size reached the proxy accuracy target",
    "oracle": "no batch size reached the target accuracy target",
}
DATA_NOTE = (
    "Data: scikit-learn's bundled digits (1,797 8×8 images) upsampled to 3×32×32 "
    "(fl_client.task). Target `digits` = the 1,047-image client pool of "
    "`load_digits_splits(0)`, split per seed 80/20 (stratified) into target-train / "
    "target-test. Proxy `digits-rotated` = the 450 proxy images of the same function (disjoint "
    "images: proxy-train 300, proxy-eval 150), each rotated by its own angle in "
    "±`proxy-rotate-deg` and with N(0, `proxy-noise-std`²) noise on the standardised pixels "
    "(fixed seed): a differently transformed copy of other digits. Models start from random "
    "weights seeded per seed (the paper fine-tunes CIFAR100-pretrained weights; no "
    "pretraining here). Device time, power and energy come from the digital twins in "
    "configs/devices (models calibrated to the paper's Nano points; the TX2 NX twin's "
    "coefficients are assumptions, see its TOML)."
)
#: What the data note says of each npz set, and of the digits proxies with an npz target.
NPZ_NOTES = {
    "cifar10-subset": "the data kit's CIFAR-10 subset (../shared/data/cifar10-subset.npz: "
    "10,000 train / 2,000 test images, balanced, JPEG-decoded pixels)",
    "mnist-subset": "the data kit's MNIST subset (../shared/data/mnist-subset.npz: 10,000 "
    "train / 2,000 test digits, 28×28 zero-padded to 32×32, grey repeated over RGB)",
}


def data_note(cfg: SingleDeviceConfig) -> str:
    """The report's data note: ``DATA_NOTE`` for the digits study, else what the target and
    the proxy are."""
    if cfg.target == "digits" and cfg.proxy in ("digits", "digits-rotated"):
        return DATA_NOTE
    if cfg.target in NPZ_NOTES:
        subset = (
            f"a stratified subset of {cfg.image_subset_size} images of its train split"
            if cfg.image_subset_size
            else "its train split"
        )
        target = (
            f"Target `{cfg.target}` = {NPZ_NOTES[cfg.target]}: {subset}, split per seed "
            f"{1 - cfg.target_test_fraction:.0%}/{cfg.target_test_fraction:.0%} (stratified) "
            "into target-train / target-test."
        )
    else:
        target = (
            "Target `digits` = the 1,047-image client pool of scikit-learn's digits "
            "(`load_digits_splits(0)`), split per seed 80/20 (stratified)."
        )
    if cfg.proxy in NPZ_NOTES:
        sizes = ", ".join(
            f"{k} {v}"
            for k, v in (("proxy-train", cfg.proxy_train_size), ("proxy-eval", cfg.proxy_eval_size))
            if v
        )
        proxy = (
            f"Proxy `{cfg.proxy}` = {NPZ_NOTES[cfg.proxy]}: its train split is proxy-train, "
            "its test split proxy-eval" + (f" (stratified subsets: {sizes})" if sizes else "") + "."
        )
    else:
        proxy = (
            f"Proxy `{cfg.proxy}` = the 450 proxy images of scikit-learn's digits "
            "(proxy-train 300, proxy-eval 150)"
            + (
                f", rotated ±{cfg.proxy_rotate_deg:g}° with N(0, {cfg.proxy_noise_std:g}²) noise"
                if cfg.proxy == "digits-rotated"
                else ""
            )
            + ", upsampled to 3×32×32."
        )
    return (
        f"Data: {target} {proxy} Real images are made 3×32×32 and standardised per channel "
        "with their train split's statistics. Models start from random weights seeded per "
        "seed (the paper fine-tunes CIFAR100-pretrained weights; no pretraining here), so "
        "accuracy targets on real images are far below the paper's. Device time, power and "
        "energy come from the digital twins in configs/devices (models calibrated to the "
        "paper's Nano points; the TX2 NX twin's coefficients are assumptions, see its TOML)."
    )


class TrainSpec(NamedTuple):
    """One training run: the model, on the proxy or the target, with a seed and a b."""

    model: str
    role: str
    seed: int
    batch_size: int


class CellSpec(NamedTuple):
    """One profile + selection + accounting cell."""

    model: str
    device: str
    cap_w: float | None
    seed: int

    def label(self) -> str:
        return f"cell {self.model} {self.device} {cap_label(self.cap_w)} seed {self.seed}"


@dataclass(frozen=True)
class Layout:
    """Where the records of one output folder live."""

    root: Path

    def train(self, t: TrainSpec) -> Path:
        name = f"{t.role}-seed{t.seed}-b{t.batch_size}.json"
        return self.root / "records" / "train" / t.model / name

    def cell(self, c: CellSpec) -> Path:
        # The cap's folder keeps the name it always had ("4.5W"), so records are reused.
        cap_dir = cap_label(c.cap_w).replace(" ", "")
        return self.root / "records" / "cells" / c.model / c.device / cap_dir / f"seed{c.seed}.json"

    def lut(self, model: str, device: str) -> Path:
        return self.root / "records" / "lut" / model / f"{device}-full.json"


# --------------------------------------------------------------------------- keys


def train_key(cfg: SingleDeviceConfig, t: TrainSpec) -> str:
    unit = {"code": CODE_VERSION, "unit": "train", "model": t.model, "role": t.role}
    unit.update({"seed": t.seed, "batch-size": t.batch_size})
    return training_key(cfg, unit, cfg.accuracy_for(t.role), cfg.data_settings().to_dict())


def cell_key(cfg: SingleDeviceConfig, c: CellSpec) -> str:
    return digest(
        {
            "code": CODE_VERSION,
            "unit": "cell",
            "cell-version": CELL_VERSION,
            "model": c.model,
            "device": c.device,
            "cap-w": c.cap_w,
            "seed": c.seed,
            "methods": list(cfg.methods),
            "batch-sizes": list(cfg.batch_sizes),
            "profile": [cfg.profile_warmup_steps, cfg.profile_steps, cfg.profile_uncapped],
            "train": {
                role: {
                    str(b): train_key(cfg, TrainSpec(c.model, role, c.seed, b))
                    for b in cfg.batch_sizes
                }
                for role in ROLES
            },
        }
    )


# --------------------------------------------------------------------------- training runs


def run_training(
    cfg: SingleDeviceConfig,
    data: StudyData,
    t: TrainSpec,
    on_eval: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One real training run: samples to the accuracy target with batch size b."""
    train_set, eval_set = (
        (data.proxy_train, data.proxy_eval)
        if t.role == "proxy"
        else (data.target_train, data.target_test)
    )
    run = TargetRun.of(cfg, t.batch_size, cfg.accuracy_for(t.role), t.seed)
    device = resolve_torch_device(cfg.torch_device)
    started = time.perf_counter()
    result = train_images(t.model, (train_set, eval_set), run, on_eval, device)
    sizes = {"train-size": len(train_set), "eval-size": len(eval_set)}
    head = {"key": train_key(cfg, t), "unit": "train", "model": t.model, "role": t.role}
    return TrainingRecord(run, result, sizes, started, device).to_record({**head, "seed": t.seed})


# --------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Samples:
    """Samples to the accuracy target by batch size (None: not reached), per role."""

    proxy: Mapping[int, int | None]
    target: Mapping[int, int | None]

    def of(self, role: str) -> Mapping[int, int | None]:
        return self.proxy if role == "proxy" else self.target


@dataclass(frozen=True)
class Board:
    """What a cell selects on: the board's descriptor, the batch sizes that fit it and
    (for ours and the oracle) the LUT profiled on its twin under the cell's cap."""

    spec: DeviceSpec
    workload: Workload
    sizes: list[int]
    lut: LUT | None


def _profile(cfg: SingleDeviceConfig, c: CellSpec, workload: Workload, sizes: list[int]) -> LUT:
    device = open_device(c.device, "simulated", seed=c.seed)
    try:
        return profile(
            device,
            workload,
            sizes,
            lambda b: task.make_train_step(c.model, model_zoo.IMAGE_SHAPE, b, seed=c.seed),
            ProfileOptions(
                PowerLimit.of(c.cap_w),
                warmup_steps=cfg.profile_warmup_steps,
                steps=cfg.profile_steps,
                progress=False,
                uncapped=cfg.profile_uncapped,
            ),
        )
    finally:
        device.close()


def _select(
    c: CellSpec, board: Board, samples: Samples, method: str
) -> tuple[Selection, dict[str, Any]]:
    """The (b, f) of ``method`` in this cell and what the record adds for it. Raises
    ValueError (incl. InfeasibleCapError, B1 without a safe band) when it has none."""
    b1_mhz = None if method in LUT_METHODS else board.spec.b1_max_knob_value(c.cap_w)
    role = R_ROLE[method]
    batch_sizes, r = (
        (board.sizes, None) if role is None else r_from_samples(samples.of(role), board.sizes)
    )
    if not batch_sizes:
        raise ValueError(NOT_REACHED[method])
    if b1_mhz is not None:
        freqs = [float(f) for f in board.spec.gpu_freqs_mhz]
        how = selector.Method(method, b1_max_knob_value=b1_mhz)
        sel = selector.select(how, batch_sizes=batch_sizes, knob_values=freqs, r=r)
        return sel, {}
    lut = board.lut
    assert lut is not None
    sel = selector.select(
        method,
        batch_sizes=batch_sizes,
        knob_values=list(lut.knob_values),
        tables=lut_rows(lut, batch_sizes),
        r=r,
        limit=math.inf if c.cap_w is None else c.cap_w,
    )
    extra = {
        "profile-time-s": lut.profile_time_s,
        "profile-energy-j": lut.profile_energy_j,
        "r-batch-sizes": batch_sizes,
        "r": r,
    }
    return sel, extra


def _account(c: CellSpec, workload: Workload, b: int, f_mhz: float, samples: int) -> dict[str, Any]:
    """Device time and energy of ``samples`` samples at (b, f) on a fresh twin."""
    device = open_device(c.device, "simulated", seed=c.seed * 100 + 1)
    try:
        device.set_knob_value(f_mhz)
        with device.measure(workload) as meter:
            for _ in range(math.ceil(samples / b)):
                meter.step(b, _noop)
        m = meter.measurement
    finally:
        device.close()
    powers = m.power_samples_w
    return {
        "train-time-s": m.time_s,
        "train-energy-j": m.energy_j,
        "peak-power-w": m.peak_power_w,
        "avg-power-w": m.avg_power_w,
        "steps": m.steps,
        # Steps whose sensed peak power (twin noise included) reached the cap.
        "steps-over-cap": 0 if c.cap_w is None else sum(1 for p in powers if p >= c.cap_w),
        "power-samples-w": [min(powers, default=0.0), max(powers)] if powers else [],
    }


def _noop() -> None:
    return None


def _method_entry(
    cfg: SingleDeviceConfig, c: CellSpec, board: Board, samples: Samples, method: str
) -> dict[str, Any]:
    """One method in one cell: its choice, then its TT_acc and energy on the twin."""
    entry: dict[str, Any] = {"method": method}
    try:
        sel, extra = _select(c, board, samples, method)
    except ValueError as exc:
        return {**entry, "status": "unavailable", "reason": str(exc)}
    b, f = sel.batch_size, sel.knob_value
    entry.update(extra)
    entry.update(
        {
            "batch-size": b,
            "gpu-freq-mhz": f,
            "predicted-time-per-sample-s": sel.time_per_sample_s,
            "predicted-peak-power-w": sel.peak_power_w,
        }
    )
    n = samples.target.get(b)
    if n is None:
        entry.update(
            status="not-reached",
            reason=f"target run with b={b} did not reach {cfg.target_accuracy} "
            f"within max-samples={cfg.max_samples}",
        )
        return entry
    acct = _account(c, board.workload, b, f, n)
    prof_t = float(entry.get("profile-time-s", 0.0))
    prof_e = float(entry.get("profile-energy-j", 0.0))
    entry.update(acct)
    entry.update(
        {
            "status": "ok",
            "samples-to-target": n,
            "time-per-sample-s": acct["train-time-s"] / n,
            "tt-acc-s": acct["train-time-s"] + prof_t,
            "energy-j": acct["train-energy-j"] + prof_e,
            "over-cap": c.cap_w is not None and acct["peak-power-w"] >= c.cap_w,
        }
    )
    return entry


def run_cell(cfg: SingleDeviceConfig, c: CellSpec, samples: Samples) -> dict[str, Any]:
    """Profile, select with every method, account each choice on the twin (one seed)."""
    workload = workload_for(c.model)
    sizes = fitting_batch_sizes(c.model, cfg.batch_sizes, c.device)
    needs_lut = any(m in LUT_METHODS for m in cfg.methods)
    lut = _profile(cfg, c, workload, sizes) if needs_lut else None
    board = Board(load_device_spec(c.device), workload, sizes, lut)
    return {
        "key": cell_key(cfg, c),
        "unit": "cell",
        "model": c.model,
        "device": c.device,
        "cap-w": c.cap_w,
        "cap": cap_label(c.cap_w),
        "seed": c.seed,
        "batch-sizes": sizes,
        "n-proxy": {str(b): samples.proxy.get(b) for b in sizes},
        "n-target": {str(b): samples.target.get(b) for b in sizes},
        "lut": None if lut is None else lut_dict(lut),
        "methods": {m: _method_entry(cfg, c, board, samples, m) for m in cfg.methods},
    }


# --------------------------------------------------------------------------- the plan


def _samples_by_b(
    cfg: SingleDeviceConfig, lay: Layout, c: CellSpec, role: str
) -> dict[int, int | None]:
    out: dict[int, int | None] = {}
    for b in cfg.batch_sizes:
        t = TrainSpec(c.model, role, c.seed, b)
        rec = read_record(lay.train(t), train_key(cfg, t))
        if rec is None:
            raise RuntimeError(f"missing training record {lay.train(t)}")
        out[b] = rec["samples-to-target"]
    return out


def _picks(rec: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{m}: b={e['batch-size']}@{e['gpu-freq-mhz']:g}"
        if "batch-size" in e
        else f"{m}: {e['status']}"
        for m, e in rec["methods"].items()
    )


def plan_units(cfg: SingleDeviceConfig, out: Path, only_training: bool) -> dict[str, list[Unit]]:
    """Every unit of the study (training runs, cells, full-grid LUTs) by kind; with
    ``only_training`` the cells and LUTs are left for a later run."""
    lay = Layout(out)
    seeds = cfg.seed_list()
    data_for = functools.lru_cache(maxsize=None)(lambda seed: study_data(cfg.data_settings(), seed))

    def train(t: TrainSpec) -> Unit:
        return Unit(
            lay.train(t),
            train_key(cfg, t),
            f"train {t.model} {t.role} seed {t.seed} b={t.batch_size}",
            lambda bar: run_training(
                cfg, data_for(t.seed), t, lambda s: bar.detail(f"{s}/{cfg.max_samples} samples")
            ),
            lambda rec: training_line(
                f"train {t.model} {t.role:<6} seed {t.seed} b={t.batch_size:<4}", rec
            ),
        )

    def cell(c: CellSpec) -> Unit:
        def compute(_bar: Any) -> dict[str, Any]:
            samples = Samples(*(_samples_by_b(cfg, lay, c, role) for role in ROLES))
            return run_cell(cfg, c, samples)

        return Unit(
            lay.cell(c),
            cell_key(cfg, c),
            c.label(),
            compute,
            lambda rec: f"{c.label()}: {_picks(rec)}",
        )

    def lut(model: str, dev: str) -> Unit:
        return Unit(
            lay.lut(model, dev),
            lut_key(cfg, "lut-full", model, dev),
            f"full-grid LUT {model} {dev}",
            lambda _bar: full_lut_record(cfg, "lut-full", model, dev)[0],
            lambda _rec: f"full-grid LUT {model} {dev} profiled (for the plots)",
        )

    groups = {
        "train": [
            train(TrainSpec(model, role, seed, b))
            for model in cfg.models
            for seed in seeds
            for role in ROLES
            for b in cfg.batch_sizes
        ],
        "cells": [
            cell(CellSpec(model, dev, cap, seed))
            for model in cfg.models
            for dev in cfg.devices
            for cap in cfg.caps_w
            for seed in seeds
        ],
        "luts": [lut(model, dev) for model in cfg.models for dev in cfg.devices],
    }
    if only_training:
        groups["cells"], groups["luts"] = [], []
    return groups


# --------------------------------------------------------------------------- the study


def _preflight(cfg: SingleDeviceConfig, where: str) -> Preflight:
    device = checked_torch_device(cfg.torch_device, where)
    try:
        sizes = study_data(cfg.data_settings(), 0).sizes()
    except image_data.ImageDataError as err:  # a missing or malformed npz, before training
        raise ExperimentConfigError(f"{where}: data-root: {err}") from None
    return Preflight(note=data_note(cfg), data_sizes=sizes, torch_device=device)


def _run(cfg: SingleDeviceConfig, out: Path, options: RunOptions) -> Outcome:
    """Compute every missing record; with ``only_training`` only the training runs."""
    torch.set_num_threads(cfg.torch_threads)
    counts = run_units(plan_units(cfg, out, options.only_training), options.progress)
    if options.only_training:
        return Outcome(dict(counts), complete=False, stage="training")
    return Outcome(dict(counts))


STUDY = StudyPlugin(
    NAME,
    parse_single_device,
    _preflight,
    _run,
    single_device_report.render,
    has_training_stage=True,
)
