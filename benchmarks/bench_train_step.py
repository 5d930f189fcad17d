"""Host time of one CPU training step per sample: contiguous input batches vs channels_last.

``fl_client.task.train_step`` puts an image batch in ``torch.channels_last`` before the
forward pass on the CPU for the models of ``task.CHANNELS_LAST_MODELS`` (``task.host_layout``;
the weights stay contiguous). This script times the step both ways on every shipped image
model, whichever layout ``host_layout`` picks for it (speed only: MobileNetV2 stays
contiguous for its gradients' precision, see ``task.CHANNELS_LAST_MODELS``). For each model
and batch size: one seeded model, Adam and synthetic 3×32×32 batch per layout; after
``--warmup`` steps each, ``--repeats`` rounds time one step with the contiguous batch and one
with the channels_last batch, back to back (so load on a shared host hits both alike).
``ratio`` is contiguous over channels_last, medians (> 1: channels_last is faster). A model
whose fastest contiguous warm-up step takes longer than ``--max-step-s`` is skipped at that
b and above (too slow to time here).

Usage: .venv/bin/python benchmarks/bench_train_step.py [--models cnn,resnet18,mobilenetv2]
       [--batch-sizes 4,8,16,32,64,128] [--repeats 7] [--warmup 2] [--threads 1]
       [--max-step-s 1.0] [--out PATH]
Prints a table and writes JSON (default: benchmarks/results/train_step.json).

One run, ``.venv/bin/python benchmarks/bench_train_step.py --repeats 7`` (2-core shared
host, figures vary with load; µs per sample, median of 7, min in brackets; torch 2.14.1,
one thread):

    model           b      contiguous µs   channels_last µs  ratio
    cnn             4      799 (   768)        626 (   622)     1.28
    cnn             8      568 (   565)        402 (   397)     1.41
    cnn            16      613 (   583)        408 (   398)     1.50
    cnn            32      485 (   446)        313 (   284)     1.55
    cnn            64      569 (   505)        377 (   337)     1.51
    cnn           128      491 (   449)        318 (   311)     1.55
    resnet18        4    57981 ( 50255)      75082 ( 63749)     0.77
    resnet18        8    41856 ( 39280)      50921 ( 46193)     0.82
    resnet18       16    43449 ( 35710)      43443 ( 37418)     1.00
    resnet18       32 skipped: a step takes over 1.0 s
    mobilenetv2     4    15420 ( 14686)      13335 ( 12406)     1.16
    mobilenetv2     8    12602 ( 11606)       9362 (  8979)     1.35
    mobilenetv2    16    11737 ( 11317)       8590 (  7633)     1.37
    mobilenetv2    32    11075 ( 10786)       7556 (  6367)     1.47
    mobilenetv2    64    12782 ( 10770)       8529 (  6582)     1.50
    mobilenetv2   128 skipped: a step takes over 1.0 s

(load average 0.6 at the start, 1.5 at the end; this run's JSON is
``benchmarks/results/train_step.json``; a second run at load 4 read cnn 1.02–1.59).
ResNet18 at b = 16, 32, 64 with ``--max-step-s 10 --repeats 3``: 0.84, 0.96, 0.91.
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
import torch.nn.functional as F  # noqa: N812  (the PyTorch convention)
from results_file import write_results

from fl_client import model_zoo, task
from fl_client.argparse_once import OnceParser

RESULTS = Path(__file__).resolve().parent / "results"
LAYOUTS = ("contiguous", "channels-last")


def _reference_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    """``task.train_step`` without its layout conversion: the batch runs as it is passed."""
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def _setup(model_name: str, batch_size: int, layout: str) -> tuple[Any, ...]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_zoo.build_model(model_name)
    gen = torch.Generator().manual_seed(0)
    x, y = model_zoo.synthetic_batch(
        model_name, model_zoo.IMAGE_SHAPE, batch_size, model_zoo.NUM_CLASSES, gen
    )
    if layout == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()
    return model, task.make_optimizer(model, lr=1e-4), x, y


def _timed(setup: tuple[Any, ...]) -> float:
    t0 = time.perf_counter()
    _reference_step(*setup)
    return time.perf_counter() - t0


def time_cell(model: str, batch_size: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """Per-sample µs of one step of ``model`` at ``batch_size`` in both layouts, or None when
    the contiguous warm-up step is slower than ``--max-step-s``."""
    setups = {layout: _setup(model, batch_size, layout) for layout in LAYOUTS}
    for layout in LAYOUTS:
        last_s = min(_timed(setups[layout]) for _ in range(args.warmup))
        if layout == "contiguous" and last_s > args.max_step_s:
            return None
    times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for _ in range(args.repeats):
        for layout in LAYOUTS:
            times[layout].append(_timed(setups[layout]))
    row: dict[str, Any] = {"model": model, "batch-size": batch_size, "repeats": args.repeats}
    for layout in LAYOUTS:
        row[f"{layout}-median-us-per-sample"] = 1e6 * statistics.median(times[layout]) / batch_size
        row[f"{layout}-min-us-per-sample"] = 1e6 * min(times[layout]) / batch_size
    row["ratio"] = (
        row["contiguous-median-us-per-sample"] / row["channels-last-median-us-per-sample"]
    )
    return row


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _parse() -> argparse.Namespace:
    p = OnceParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="cnn,resnet18,mobilenetv2", help="image model names")
    p.add_argument("--batch-sizes", type=_ints, default=[4, 8, 16, 32, 64, 128])
    p.add_argument("--repeats", type=int, default=7, help="timed steps per layout and cell")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per layout first")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (studies use 1)")
    p.add_argument("--max-step-s", type=float, default=1.0, help="skip slower cells")
    p.add_argument("--out", type=Path, default=RESULTS / "train_step.json")
    args = p.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in model_zoo.MODEL_NAMES:
            p.error(f"--models: unknown model {m!r}; allowed: {', '.join(model_zoo.MODEL_NAMES)}")
    if args.repeats < 1 or args.warmup < 1 or args.threads < 1:
        p.error("--repeats, --warmup and --threads must be ≥ 1")
    return args


def main() -> None:
    args = _parse()
    torch.set_num_threads(args.threads)
    rows, skipped = [], []
    print(f"{'model':<12} {'b':>4} {'contiguous µs':>18} {'channels_last µs':>18} {'ratio':>6}")
    for m in args.models:
        for b in args.batch_sizes:
            r = time_cell(m, b, args)
            if r is None:
                skipped.append({"model": m, "batch-size": b})
                print(f"{m:<12} {b:>4} skipped: a step takes over {args.max_step_s} s")
                break
            rows.append(r)
            print(
                f"{m:<12} {b:>4} "
                f"{r['contiguous-median-us-per-sample']:>8.0f} "
                f"({r['contiguous-min-us-per-sample']:>6.0f})   "
                f"{r['channels-last-median-us-per-sample']:>8.0f} "
                f"({r['channels-last-min-us-per-sample']:>6.0f})   {r['ratio']:>6.2f}",
                flush=True,
            )
    host = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "torch": torch.__version__,
        "load-average-1m": os.getloadavg()[0],
    }
    write_results(args.out, {"host": host, "cells": rows, "skipped": skipped})


if __name__ == "__main__":
    main()
