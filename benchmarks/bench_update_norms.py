"""How a node's update grows with its local work, and what each aggregation makes of it.

FedNova divides each node's update Δ_i by its work ‖a_i‖₁ (``local-steps`` × ``local-lr``)
and scales the mean by τ_eff, which assumes Δ_i grows in proportion to the work. This runs
one simulation (a generated fleet, ``balance = "steps"`` by default, Flower's in-process
engine) and, at every round whose nodes did unequal work, records per node its work, the
length of its update over the optimizer's arrays, that length per unit of work, and the
factor by which ``fednova`` and ``fedavg-capped`` scale its data weight; per round, the
length of FedAvg's, FedNova's and the capped rule's step. The run itself aggregates with
``--aggregation``; the other rules are computed on the same updates, not applied.

    .venv/bin/python benchmarks/bench_update_norms.py [--fleet-seed 2] [--seed 0]
        [--aggregation fednova] [--balance steps] [--rounds 20] [--out FILE.json]

Device time and accuracy come from the twins and the real training on this host's CPU;
the table is the same on any host for one seed (the run is deterministic).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from results_file import write_results

from fl_client.argparse_once import OnceParser
from simulations.experiments.fleet_gen import write_fleet
from simulations.run import flower_env, simulate
from strategies import aggregation, fednova

ROWS: list[dict[str, Any]] = []


def _flat(arrays: Any) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, dtype=np.float64)) for x in arrays])


def _observe(base: Any, updated: Any, weights: Any, works: Any) -> None:
    p = np.asarray(weights, dtype=np.float64)
    p = p / p.sum()
    a = np.asarray(works, dtype=np.float64)
    tau_eff = float(p @ a)
    x = _flat(base)
    deltas = [_flat(u) - x for u in updated]
    capped = np.asarray(fednova.capped_weights(list(p), list(a)))
    step = {
        "fedavg": sum(pi * d for pi, d in zip(p, deltas, strict=True)),
        "fednova": sum(tau_eff * pi / ai * d for pi, ai, d in zip(p, a, deltas, strict=True)),
        "fedavg-capped": sum(ci * d for ci, d in zip(capped, deltas, strict=True)),
    }
    norms = [float(np.linalg.norm(d)) for d in deltas]
    ROWS.append(
        {
            "work": a.tolist(),
            "data-weight": p.tolist(),
            "update-norm": norms,
            "norm-per-work": [n / w for n, w in zip(norms, a, strict=True)],
            "fednova-factor": (tau_eff / a).tolist(),
            "capped-factor": (capped / p).tolist(),
            "step-norm": {k: float(np.linalg.norm(v)) for k, v in step.items()},
        }
    )


def _hook() -> None:
    """Record every training round whose nodes reported unequal work, whatever the run's
    aggregation (the strategy's ``aggregate_round``, wrapped)."""
    from strategies import power_aware

    run_round = power_aware.aggregate_round

    def observed(mode: str, base: Any, replies: Any, weight_key: str, server_round: int = 0) -> Any:
        works = [aggregation.node_work(c) for c in replies]
        if base is not None and None not in works and len(set(works)) > 1:
            first = next(iter(replies[0].array_records.values()))
            names = [k for k in base if aggregation.is_iterate(k, first[k].numpy())]
            local = [
                [next(iter(c.array_records.values()))[k].numpy() for k in names] for c in replies
            ]
            weights = [float(next(iter(c.metric_records.values()))[weight_key]) for c in replies]
            _observe([base[k].numpy() for k in names], local, weights, works)
            ROWS[-1]["round"] = server_round
        return run_round(mode, base, replies, weight_key, server_round)

    power_aware.aggregate_round = observed


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per round: the longest work over the shortest, their norms' ratio, the largest
    factors and the step lengths against FedAvg's."""
    out = []
    for k, r in enumerate(rows):
        work, norm = np.asarray(r["work"]), np.asarray(r["update-norm"])
        hi, lo = int(work.argmax()), int(work.argmin())
        avg = r["step-norm"]["fedavg"]
        out.append(
            {
                "round": r.get("round", k),
                "work-ratio": float(work[hi] / work[lo]),
                "norm-ratio": float(norm[hi] / norm[lo]),
                "growth-exponent": float(
                    math.log(norm[hi] / norm[lo]) / math.log(work[hi] / work[lo])
                )
                if work[hi] > work[lo]
                else math.nan,
                "fednova-max-factor": max(r["fednova-factor"]),
                "capped-max-factor": max(r["capped-factor"]),
                "fednova-step-over-fedavg": r["step-norm"]["fednova"] / avg,
                "capped-step-over-fedavg": r["step-norm"]["fedavg-capped"] / avg,
            }
        )
    return {"rounds": out}


def main(argv: list[str] | None = None) -> int:
    ap = OnceParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet-seed", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--aggregation", default="fednova", choices=aggregation.AGGREGATIONS)
    ap.add_argument("--balance", default="steps")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/update_norms.json"))
    args = ap.parse_args(argv)
    _hook()
    with tempfile.TemporaryDirectory(prefix="powerfl-norms-") as tmp:
        work = Path(tmp)
        fleet = write_fleet(args.fleet_seed, work / "fleet.toml")
        flower_env(work / ".flwr")
        overrides = {
            "fleet": str(fleet),
            "seed": args.seed,
            "method": "power-aware",
            "balance": args.balance,
            "aggregation": args.aggregation,
            "num-rounds": args.rounds,
            "target-accuracy": 1.0,  # every round, past any target
            "model": "cnn",
            "partitioning": "dirichlet",
            "dirichlet-alpha": 0.5,
            "local-epochs": 5,
            "batch-sizes": "4,8,16,32,64,128",
            "lr-ref": 0.005,
            "b-ref": 128,
            "proxy-target-accuracy": 0.7,
            "r-max-samples": 6000,
            "r-eval-every-samples": 256,
            "profile-grid": "efficient",
            "cache-dir": str(work / "cache"),
            "output-dir": str(work / "run"),
        }
        simulate(overrides, engine="in-process")
        rounds = next((work / "run").glob("*/rounds.jsonl")).read_text().splitlines()
    accuracy = [json.loads(line)["accuracy"] for line in rounds]
    print("accuracy per round: " + " ".join(f"{a:.3f}" for a in accuracy))
    table = _summary(ROWS)
    print(
        f"\n{'round':>5} {'work hi/lo':>10} {'|Δ| hi/lo':>9} {'exponent':>8} "
        f"{'nova max×':>9} {'capped max×':>11} {'nova/avg':>8} {'capped/avg':>10}"
    )
    for r in table["rounds"]:
        print(
            f"{r['round']:>5} {r['work-ratio']:>10.2f} {r['norm-ratio']:>9.2f} "
            f"{r['growth-exponent']:>8.2f} {r['fednova-max-factor']:>9.2f} "
            f"{r['capped-max-factor']:>11.2f} {r['fednova-step-over-fedavg']:>8.2f} "
            f"{r['capped-step-over-fedavg']:>10.2f}"
        )
    write_results(
        args.out,
        {
            "command": " ".join(["benchmarks/bench_update_norms.py", *(argv or sys.argv[1:])]),
            "settings": vars(args) | {"out": str(args.out)},
            "per-round": table["rounds"],
            "per-node": ROWS,
            "accuracy": accuracy,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
