"""Which pre-training transfers to the devices' data: samples to a target accuracy from
random weights against from each checkpoint (centralised, no federation, no twins).

For each start (``scratch``: the model's seeded random weights; each ``--checkpoint``) and
each batch size, the model trains with Adam (lr-ref·sqrt(b/b-ref), the runs' rule) on the
target dataset's client pool in minibatches of exactly b
(``fl_client.r_estimation.samples_to_target``) and is evaluated on its test split every
``--eval-every`` samples until ``--target`` (at most ``--max-samples``). Fewer samples from a
checkpoint than from scratch is a transfer; the per-b ratio to the smallest b is r's shape.

Usage: .venv/bin/python benchmarks/bench_transfer.py --checkpoint A.safetensors
       [--checkpoint B.safetensors] [--dataset digits] [--target 0.85] [--json PATH]
Prints a table and writes JSON (default: benchmarks/results/transfer.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from fl_client import checkpoint, data_splits, model_zoo, task
from fl_client.argparse_once import OnceParser
from fl_client.r_estimation import InitialModel, TargetRun, samples_to_target

RESULTS = Path(__file__).resolve().parent / "results"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(args.threads)
    splits = data_splits.load_splits(args.dataset, 0)
    starts: dict[str, dict[str, torch.Tensor]] = {}
    torch.manual_seed(0)
    starts["scratch"] = model_zoo.build_model(args.model).state_dict()
    for path in args.checkpoint:
        model = model_zoo.build_model(args.model)
        torch.manual_seed(0)
        weights = checkpoint.load_into(model, path)
        starts[f"{Path(path).name} ({weights.sha256[:8]})"] = model.state_dict()
    out = []
    for name, state in starts.items():
        for b in args.batch_sizes:
            t0 = time.perf_counter()
            n, curve, seen = samples_to_target(
                InitialModel(args.model, state),
                splits.pool,
                splits.test,
                TargetRun(
                    batch_size=b,
                    lr=task.scaled_lr(args.lr_ref, args.b_ref, b),
                    target_accuracy=args.target,
                    eval_every_samples=args.eval_every,
                    max_samples=args.max_samples,
                    seed=0,
                ),
            )
            out.append(
                {
                    "start": name,
                    "batch-size": b,
                    "samples-to-target": n,
                    "first-accuracy": curve[0][1] if curve else None,
                    "samples-seen": seen,
                    "host-s": round(time.perf_counter() - t0, 1),
                }
            )
            print(
                f"{name:<40} b={b:<4} samples→{args.target}: {n if n else '> ' + str(seen):>8}"
                f"  acc after {args.eval_every}: {out[-1]['first-accuracy']:.3f}"
                f"  ({out[-1]['host-s']} s)",
                flush=True,
            )
    return out


def main() -> None:
    p = OnceParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", action="append", default=[])
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[16, 128]
    )
    p.add_argument("--lr-ref", type=float, default=0.005)
    p.add_argument("--b-ref", type=int, default=128)
    p.add_argument("--eval-every", type=int, default=256)
    p.add_argument("--max-samples", type=int, default=40_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=RESULTS / "transfer.json")
    args = p.parse_args()
    rows = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2)
        + "\n"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
