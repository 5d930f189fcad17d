"""Host time of one training step per model: what a study's training runs cost here.

For each model and batch size, ``fl_client.task.make_train_step`` builds the model, Adam and
one seeded synthetic batch (3×32×32 images) on ``--torch-device``; after ``--warmup``
steps, ``--steps`` steps are timed (a CUDA device is synchronized before each clock read).
Time per sample (ms) is what the studies' training samples cost on this host: the fine-tuning
study's cost at ``--scale paper`` is its sample counts times ResNet18's figure
(docs/experiments.md).

Usage: .venv/bin/python benchmarks/bench_model_step.py [--models cnn,resnet18]
       [--batch-sizes 32,128] [--steps 5] [--threads 2] [--torch-device cpu] [--json PATH]
Prints a table and writes JSON (default: benchmarks/results/model_step.json).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from results_file import write_results

from fl_client import model_zoo, task
from fl_client.argparse_once import OnceParser

RESULTS = Path(__file__).resolve().parent / "results"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(model: str, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Per-step host seconds of ``model`` at ``batch_size`` (after the warm-up)."""
    device = torch.device(args.torch_device)
    step = task.make_train_step(model, model_zoo.IMAGE_SHAPE, batch_size, device=device)
    for _ in range(args.warmup):
        step()
    _sync(device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    median_s = statistics.median(times)
    return {
        "model": model,
        "batch-size": batch_size,
        "steps": args.steps,
        "step-median-s": median_s,
        "step-min-s": min(times),
        "step-max-s": max(times),
        "ms-per-sample": 1000 * median_s / batch_size,
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    p = OnceParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="cnn,resnet18", help="comma-separated model names")
    p.add_argument("--batch-sizes", type=_ints, default=[32, 128], help="e.g. 32,128")
    p.add_argument("--steps", type=int, default=5, help="timed steps per cell")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--torch-device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", type=Path, default=RESULTS / "model_step.json")
    args = p.parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in model_zoo.MODEL_NAMES:
            p.error(f"--models: unknown model {m!r}; allowed: {', '.join(model_zoo.MODEL_NAMES)}")
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--steps and --threads must be ≥ 1, --warmup ≥ 0")
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'model':<12} {'b':>5} {'step s (median)':>16} {'min–max s':>14} {'ms/sample':>10}")
    for m in models:
        for b in args.batch_sizes:
            r = time_steps(m, b, args)
            rows.append(r)
            print(
                f"{m:<12} {b:>5} {r['step-median-s']:>16.3f} "
                f"{r['step-min-s']:>6.3f}–{r['step-max-s']:<7.3f} {r['ms-per-sample']:>10.2f}",
                flush=True,
            )
    host = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "torch": torch.__version__,
        "torch-device": args.torch_device,
        "load-average-1m": os.getloadavg()[0],
    }
    write_results(args.json, {"host": host, "cells": rows})


if __name__ == "__main__":
    main()
