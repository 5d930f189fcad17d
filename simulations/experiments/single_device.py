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

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_client import selector, task
from fl_client.devices import open_device
from fl_client.devices.simulated import load_device_spec
from fl_client.node import _workload, max_batch_size
from fl_client.profiler import LUT, profile
from simulations.experiments.config import SingleDeviceConfig
from simulations.experiments.datasets import StudyData, study_data
from simulations.experiments.records import digest, read_record, write_json
from fl_client.r_estimation import r_from_samples, samples_to_target

log = logging.getLogger(__name__)

CODE_VERSION = 1  # training records
CELL_VERSION = 2  # profile/selection/accounting records
INIT_SEED_OFFSET = 1000
ROLES = ("proxy", "target")


def cap_label(cap_w: float | None) -> str:
    """``4.5W`` / ``none``: the cap as used in file names and tables."""
    return "none" if cap_w is None else f"{cap_w:g}W"


def initial_state(model_name: str, seed: int) -> dict[str, torch.Tensor]:
    """The weights every run of ``seed`` starts from (proxy and target alike)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED_OFFSET + seed)
        model = task.build_model(model_name)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- progress


class Progress:
    """A rich bar over units of work on a terminal (or forced), plain log lines otherwise."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        from rich.console import Console

        self._bar: Any = None
        console = Console(stderr=True)
        self.console = console
        if enabled and total > 0:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._bar.add_task("experiment", total=total, detail="")

    @contextmanager
    def running(self) -> Iterator[Progress]:
        if self._bar is not None:
            self._bar.start()
        try:
            yield self
        finally:
            if self._bar is not None:
                self._bar.stop()

    def start(self, description: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=description, detail="")

    def detail(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, detail=text)

    def done(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
            self._bar.advance(self._task)
        else:
            log.info(line)


# --------------------------------------------------------------------------- units


@dataclass(frozen=True)
class Layout:
    """Where the records of one output folder live."""

    root: Path

    def train(self, model: str, role: str, seed: int, b: int) -> Path:
        return self.root / "records" / "train" / model / f"{role}-seed{seed}-b{b}.json"

    def cell(self, model: str, device: str, cap_w: float | None, seed: int) -> Path:
        return (
            self.root / "records" / "cells" / model / device / cap_label(cap_w) / f"seed{seed}.json"
        )

    def lut(self, model: str, device: str) -> Path:
        return self.root / "records" / "lut" / model / f"{device}-full.json"


def _data_settings(cfg: SingleDeviceConfig) -> dict[str, Any]:
    return {
        "target": cfg.target,
        "proxy": cfg.proxy,
        "target-test-fraction": cfg.target_test_fraction,
        "target-train-size": cfg.target_train_size,
        "proxy-train-size": cfg.proxy_train_size,
        "proxy-eval-size": cfg.proxy_eval_size,
        "proxy-rotate-deg": cfg.proxy_rotate_deg,
        "proxy-noise-std": cfg.proxy_noise_std,
    }


def train_key(cfg: SingleDeviceConfig, model: str, role: str, seed: int, b: int) -> str:
    return digest(
        {
            "code": CODE_VERSION,
            "unit": "train",
            "model": model,
            "role": role,
            "seed": seed,
            "batch-size": b,
            "lr-ref": cfg.lr_ref,
            "b-ref": cfg.b_ref,
            "accuracy": cfg.proxy_target_accuracy if role == "proxy" else cfg.target_accuracy,
            "eval-every-samples": cfg.eval_every_samples,
            "max-samples": cfg.max_samples,
            "data": _data_settings(cfg),
        }
    )


def fitting_batch_sizes(model: str, batch_sizes: Sequence[int], device: str) -> list[int]:
    """The b of ``batch_sizes`` whose training footprint fits ``device``'s memory."""
    spec = load_device_spec(device)
    b_max = max_batch_size(model, list(batch_sizes), spec.memory_bytes)
    return [b for b in batch_sizes if b <= b_max]


def cell_key(
    cfg: SingleDeviceConfig, model: str, device: str, cap_w: float | None, seed: int
) -> str:
    return digest(
        {
            "code": CODE_VERSION,
            "unit": "cell",
            "cell-version": CELL_VERSION,
            "model": model,
            "device": device,
            "cap-w": cap_w,
            "seed": seed,
            "methods": list(cfg.methods),
            "batch-sizes": list(cfg.batch_sizes),
            "profile": [cfg.profile_warmup_steps, cfg.profile_steps, cfg.profile_uncapped],
            "train": {
                role: {str(b): train_key(cfg, model, role, seed, b) for b in cfg.batch_sizes}
                for role in ROLES
            },
        }
    )


def lut_key(cfg: SingleDeviceConfig, model: str, device: str) -> str:
    return digest(
        {
            "code": CODE_VERSION,
            "unit": "lut-full",
            "model": model,
            "device": device,
            "batch-sizes": list(cfg.batch_sizes),
            "profile": [cfg.profile_warmup_steps, cfg.profile_steps],
        }
    )


def run_training(
    cfg: SingleDeviceConfig,
    data: StudyData,
    model: str,
    role: str,
    seed: int,
    b: int,
    on_eval: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One real training run: samples to the accuracy target with batch size ``b``."""
    train_set, eval_set, target = (
        (data.proxy_train, data.proxy_eval, cfg.proxy_target_accuracy)
        if role == "proxy"
        else (data.target_train, data.target_test, cfg.target_accuracy)
    )
    lr = task.scaled_lr(cfg.lr_ref, cfg.b_ref, b)
    device = resolve_torch_device(cfg.torch_device)
    t0 = time.perf_counter()
    n_acc, curve, used = samples_to_target(
        model,
        initial_state(model, seed),
        train_set,
        eval_set,
        batch_size=b,
        lr=lr,
        target_accuracy=target,
        eval_every_samples=cfg.eval_every_samples,
        max_samples=cfg.max_samples,
        seed=seed,
        on_eval=on_eval,
        device=device,
    )
    return {
        "key": train_key(cfg, model, role, seed, b),
        "unit": "train",
        "model": model,
        "role": role,
        "seed": seed,
        "batch-size": b,
        "lr": lr,
        "accuracy-target": target,
        "samples-to-target": n_acc,
        "samples-used": used,
        "best-accuracy": max((a for _, a in curve), default=None),
        "curve": [[s, a] for s, a in curve],
        "train-size": len(train_set),
        "eval-size": len(eval_set),
        "host-wall-s": time.perf_counter() - t0,
        "torch-device": torch_device_name(device),
    }


def resolve_torch_device(setting: str) -> torch.device:
    """``torch-device`` → a torch device; ``cuda`` without a usable GPU is an error."""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("torch-device: 'cuda' asked for, but torch sees no CUDA GPU")
    return torch.device("cuda")


def torch_device_name(device: torch.device) -> str:
    """``cpu`` or the GPU's name (``cuda: NVIDIA H100 80GB HBM3``), for the records."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return device.type


def _account(
    device_kind: str,
    seed: int,
    workload: Any,
    b: int,
    f_mhz: float,
    samples: int,
    cap_w: float | None = None,
) -> dict[str, Any]:
    """Device time and energy of ``samples`` samples at (b, f) on a fresh twin."""
    device = open_device(device_kind, "simulated", seed=seed)
    try:
        device.set_gpu_freq_mhz(f_mhz)
        with device.measure(workload) as meter:
            for _ in range(math.ceil(samples / b)):
                meter.step(b, _noop)
        m = meter.measurement
    finally:
        device.close()
    return {
        "train-time-s": m.time_s,
        "train-energy-j": m.energy_j,
        "peak-power-w": m.peak_power_w,
        "avg-power-w": m.avg_power_w,
        "steps": m.steps,
        # Steps whose sensed peak power (twin noise included) reached the cap.
        "steps-over-cap": 0 if cap_w is None else sum(1 for p in m.power_samples_w if p >= cap_w),
        "power-samples-w": [min(m.power_samples_w, default=0.0), max(m.power_samples_w)]
        if m.power_samples_w
        else [],
    }


def _noop() -> None:
    return None


def _rows(lut: LUT, keep: list[int]) -> tuple[np.ndarray, np.ndarray]:
    idx = [lut.batch_sizes.index(b) for b in keep]
    return lut.time_per_sample_s[idx], lut.peak_power_w[idx]


def run_cell(
    cfg: SingleDeviceConfig,
    model: str,
    device_kind: str,
    cap_w: float | None,
    seed: int,
    n_proxy: dict[int, int | None],
    n_target: dict[int, int | None],
) -> dict[str, Any]:
    """Profile, select with every method, account each choice on the twin (one seed)."""
    spec = load_device_spec(device_kind)
    workload = _workload(model)
    sizes = fitting_batch_sizes(model, cfg.batch_sizes, device_kind)
    freqs = [float(f) for f in spec.gpu_freqs_mhz]
    proxy_b, proxy_r = r_from_samples(n_proxy, sizes)
    target_b, target_r = r_from_samples(n_target, sizes)
    methods: dict[str, Any] = {}
    lut: LUT | None = None
    if any(m in ("power-aware", "oracle") for m in cfg.methods):
        device = open_device(device_kind, "simulated", seed=seed)
        try:
            lut = profile(
                device,
                workload,
                sizes,
                lambda b: task.make_train_step(model, task.IMAGE_SHAPE, b, seed=seed),
                p_max_w=cap_w,
                warmup_steps=cfg.profile_warmup_steps,
                steps=cfg.profile_steps,
                progress=False,
                uncapped=cfg.profile_uncapped,
            )
        finally:
            device.close()
    for method in cfg.methods:
        entry: dict[str, Any] = {"method": method}
        try:
            if method in ("b1", "b2"):
                f_cap = spec.b1_freq_cap_mhz(cap_w)
                if method == "b1":
                    sel = selector.select_b1(sizes, freqs, f_cap)
                else:
                    if not proxy_b:
                        raise ValueError("no batch size reached proxy-target-accuracy")
                    sel = selector.select_b2(proxy_b, freqs, proxy_r, f_cap)
            else:
                assert lut is not None
                use_b, use_r = (
                    (proxy_b, proxy_r)
                    if method == "power-aware"
                    else (
                        target_b,
                        target_r,
                    )
                )
                if not use_b:
                    which = "proxy" if method == "power-aware" else "target"
                    raise ValueError(f"no batch size reached the {which} accuracy target")
                t_rows, p_rows = _rows(lut, use_b)
                fn = (
                    selector.select_power_aware
                    if method == "power-aware"
                    else selector.select_oracle
                )
                sel = fn(t_rows, p_rows, use_b, list(lut.freqs_mhz), use_r, cap_w)
                entry["profile-time-s"] = lut.profile_time_s
                entry["profile-energy-j"] = lut.profile_energy_j
                entry["r-batch-sizes"] = use_b
                entry["r"] = use_r
        except ValueError as exc:  # incl. InfeasibleCapError, B1 without a safe band
            entry.update(status="unavailable", reason=str(exc))
            methods[method] = entry
            continue
        b, f = sel.batch_size, sel.freq_mhz
        entry.update(
            {
                "batch-size": b,
                "gpu-freq-mhz": f,
                "predicted-time-per-sample-s": sel.time_per_sample_s,
                "predicted-peak-power-w": sel.peak_power_w,
            }
        )
        n = n_target.get(b)
        if n is None:
            entry.update(
                status="not-reached",
                reason=f"target run with b={b} did not reach {cfg.target_accuracy} "
                f"within max-samples={cfg.max_samples}",
            )
            methods[method] = entry
            continue
        acct = _account(device_kind, seed * 100 + 1, workload, b, f, n, cap_w)
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
                "over-cap": cap_w is not None and acct["peak-power-w"] >= cap_w,
            }
        )
        methods[method] = entry
    return {
        "key": cell_key(cfg, model, device_kind, cap_w, seed),
        "unit": "cell",
        "model": model,
        "device": device_kind,
        "cap-w": cap_w,
        "cap": cap_label(cap_w),
        "seed": seed,
        "batch-sizes": sizes,
        "n-proxy": {str(b): n_proxy.get(b) for b in sizes},
        "n-target": {str(b): n_target.get(b) for b in sizes},
        "lut": None if lut is None else _lut_dict(lut),
        "methods": methods,
    }


def _lut_dict(lut: LUT) -> dict[str, Any]:
    return {
        "batch-sizes": list(lut.batch_sizes),
        "freqs-mhz": list(lut.freqs_mhz),
        "time-per-sample-s": lut.time_per_sample_s.tolist(),
        "peak-power-w": lut.peak_power_w.tolist(),
        "grid": lut.grid,
        "p-max-w": lut.p_max_w,
        "profile-time-s": lut.profile_time_s,
        "profile-energy-j": lut.profile_energy_j,
        "cells-profiled": lut.cells_profiled,
    }


def profile_full_grid(
    model: str, device_kind: str, batch_sizes: Sequence[int], *, warmup_steps: int, steps: int
) -> LUT:
    """Every (b, f) of ``device_kind``'s twin (seed 0) for ``model``, real steps on the host."""
    shape = task.input_shape_for(model)
    device = open_device(device_kind, "simulated", seed=0)
    try:
        return profile(
            device,
            _workload(model),
            list(batch_sizes),
            lambda b: task.make_train_step(model, shape, b, seed=0),
            p_max_w=None,
            warmup_steps=warmup_steps,
            steps=steps,
            progress=False,
            uncapped="full",
        )
    finally:
        device.close()


def b1_bands(device_kind: str, caps_w: Sequence[float | None]) -> dict[str, float | None]:
    """B1's fixed safe frequency per cap label (None where the board has no band for it)."""
    spec = load_device_spec(device_kind)
    out: dict[str, float | None] = {}
    for cap in caps_w:
        try:
            out[cap_label(cap)] = spec.b1_freq_cap_mhz(cap)
        except ValueError:
            out[cap_label(cap)] = None
    return out


def run_full_lut(cfg: SingleDeviceConfig, model: str, device_kind: str) -> dict[str, Any]:
    """The full-grid LUT of (model, device) for the Fig. 1/2 plots (twin seed 0)."""
    lut = profile_full_grid(
        model,
        device_kind,
        fitting_batch_sizes(model, cfg.batch_sizes, device_kind),
        warmup_steps=cfg.profile_warmup_steps,
        steps=cfg.profile_steps,
    )
    return {
        "key": lut_key(cfg, model, device_kind),
        "unit": "lut-full",
        "model": model,
        "device": device_kind,
        "display-name": load_device_spec(device_kind).display_name,
        "b1-freq-mhz": b1_bands(device_kind, cfg.caps_w),
        "lut": _lut_dict(lut),
    }


# --------------------------------------------------------------------------- the study


def run_study(
    cfg: SingleDeviceConfig, out: Path, *, progress: bool = True, only_training: bool = False
) -> dict[str, int]:
    """Compute every missing record of ``cfg`` under ``out``; return counts done / reused.

    With ``only_training`` the profiling/selection cells and full-grid LUTs are left for a
    later call (they reuse the training records)."""
    torch.set_num_threads(cfg.torch_threads)
    lay = Layout(out)
    seeds = cfg.seed_list()
    train_units = [
        (model, role, seed, b)
        for model in cfg.models
        for seed in seeds
        for role in ROLES
        for b in cfg.batch_sizes
    ]
    cell_units = [
        (model, dev, cap, seed)
        for model in cfg.models
        for dev in cfg.devices
        for cap in cfg.caps_w
        for seed in seeds
    ]
    lut_units = [(model, dev) for model in cfg.models for dev in cfg.devices]
    todo_train = [u for u in train_units if read_record(lay.train(*u), train_key(cfg, *u)) is None]
    todo_cells = [u for u in cell_units if read_record(lay.cell(*u), cell_key(cfg, *u)) is None]
    todo_luts = [u for u in lut_units if read_record(lay.lut(*u), lut_key(cfg, *u)) is None]
    if only_training:
        cell_units, lut_units, todo_cells, todo_luts = [], [], [], []
    counts = {
        "train-done": len(todo_train),
        "train-reused": len(train_units) - len(todo_train),
        "cells-done": len(todo_cells),
        "cells-reused": len(cell_units) - len(todo_cells),
        "luts-done": len(todo_luts),
        "luts-reused": len(lut_units) - len(todo_luts),
    }
    bar = Progress(len(todo_train) + len(todo_cells) + len(todo_luts), enabled=progress)
    data_cache: dict[int, StudyData] = {}

    def data_for(seed: int) -> StudyData:
        if seed not in data_cache:
            data_cache[seed] = study_data(seed=seed, **_data_kwargs(cfg))
        return data_cache[seed]

    with bar.running():
        for model, role, seed, b in todo_train:
            bar.start(f"train {model} {role} seed {seed} b={b}")
            rec = run_training(
                cfg,
                data_for(seed),
                model,
                role,
                seed,
                b,
                on_eval=lambda s: bar.detail(f"{s}/{cfg.max_samples} samples"),
            )
            write_json(lay.train(model, role, seed, b), rec)
            n = rec["samples-to-target"]
            bar.done(
                f"train {model} {role:<6} seed {seed} b={b:<4} lr={rec['lr']:.2e}: "
                + (
                    f"{n} samples to {rec['accuracy-target']}"
                    if n is not None
                    else f"NOT reached in {rec['samples-used']} (best {rec['best-accuracy']:.3f})"
                )
                + f" ({rec['host-wall-s']:.1f} s)"
            )
        for model, dev in todo_luts:
            bar.start(f"full-grid LUT {model} {dev}")
            write_json(lay.lut(model, dev), run_full_lut(cfg, model, dev))
            bar.done(f"full-grid LUT {model} {dev} profiled (for the plots)")
        for model, dev, cap, seed in todo_cells:
            bar.start(f"cell {model} {dev} {cap_label(cap)} seed {seed}")
            n_proxy = _n_by_b(lay, cfg, model, "proxy", seed)
            n_target = _n_by_b(lay, cfg, model, "target", seed)
            rec = run_cell(cfg, model, dev, cap, seed, n_proxy, n_target)
            write_json(lay.cell(model, dev, cap, seed), rec)
            picks = ", ".join(
                f"{m}: b={e['batch-size']}@{e['gpu-freq-mhz']:g}"
                if "batch-size" in e
                else f"{m}: {e['status']}"
                for m, e in rec["methods"].items()
            )
            bar.done(f"cell {model} {dev} {cap_label(cap)} seed {seed}: {picks}")
    return counts


def _data_kwargs(cfg: SingleDeviceConfig) -> dict[str, Any]:
    return {k.replace("-", "_"): v for k, v in _data_settings(cfg).items()}


def _n_by_b(
    lay: Layout, cfg: SingleDeviceConfig, model: str, role: str, seed: int
) -> dict[int, int | None]:
    out: dict[int, int | None] = {}
    for b in cfg.batch_sizes:
        rec = read_record(lay.train(model, role, seed, b), train_key(cfg, model, role, seed, b))
        if rec is None:
            raise RuntimeError(f"missing training record {lay.train(model, role, seed, b)}")
        out[b] = rec["samples-to-target"]
    return out
