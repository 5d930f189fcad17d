"""Fleet-shared profiling's selection against full measured grids, and what it measures.

For every digital twin (configs/devices/*.toml), model and twin seed the full (b, f) grid
is measured twice on the twin's noisy clock and sensor, as in ``bench_lut_fit.py``: grid A
is the reference, grid B a second, independent measurement of the same board. A fleet of
one node per suggested cap of the twin (4.5, 5, 7 W and none on a Nano) then runs the
strategy's protocol (``strategies.shared_profiling``) exactly as a simulation does: the
QUERY replies' profile floor, the seed exchange, the confirm exchanges. Every cap's choice
on the kind's LUT (measured cells only) is compared with the same choice on full grid A:

* "shared, same draws": each requested cell answered from grid A itself, so the LUT holds
  the very readings the full grid saw and every difference is the protocol's (the goal:
  the full grid's choice in ≥ 95% of cases);
* "shared, fresh draws": answered from grid B (new sensor noise, as on a board);
* "full grid B": no protocol, full grid B itself: the noise floor, how often a second full
  profile of the same board already chooses otherwise;
* "shared, replay" / "replay+noise": the frequency-knob replay tables in configs/replay/
  (full grids not made by the twins; the one there is illustrative), as is and with
  twin-like sensor noise, each answered from itself.

Both sides choose with the profiled peak alone by default (k = 0, like
``bench_lut_fit.py``), cap margin 5%; ``--peak-sigma-k 2`` judges every cell as the runs do,
by peak + 2σ of its per-step peaks (the twins' grids record σ; the replay tables have none,
judged as σ = 0), on both sides and in the protocol's confirm rule. Columns: cases (table ×
model × seed × r profile × cap); same (identical choice); worst (largest time-to-target
ratio where they differ: time per sample × r_b on grid A, shared choice over grid A's); ≤2%
(share within 2%); cells (mean and most per kind); cost (device time of the measured cells,
as a share of measuring the full grid); regret (twins: time to target of the choice on the
noiseless twin over the noiseless optimum, mean and worst; "full A": the same for full grid
A's choice); >cap (choices whose noiseless peak, on a replay table its listed peak, is at or
above the cap).
The per-kind and per-model rows are "same draws".

Usage: .venv/bin/python benchmarks/bench_shared.py [--seeds N] [--models cnn,resnet18]
       [--seed-cells N] [--peak-sigma-k K] [--json PATH]
Prints a table and writes JSON (default: benchmarks/results/shared.json).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_lut_fit import (
    BATCH_SIZES,
    CAP_MARGIN,
    R_PROFILES,
    REPO,
    Grid,
    r_vector,
    replay_grids,
    selector_fn,
)
from bench_lut_fit import twin_grids as measured_grids
from results_file import write_results

from fl_client.argparse_once import OnceParser
from fl_client.contract import Cap, CellsReport, NodeDescriptor
from fl_client.devices import open_device
from fl_client.lut_plan import BF, GridCell
from strategies.shared_profiling import (
    KindProfile,
    SharedOptions,
    exchanges,
    kinds_of,
)

#: Measured steps and the warm-up of a profiled cell: the device time a cell costs.
STEPS_PER_CELL = 1 + 3


def fleet_of(grid: Grid) -> dict[int, NodeDescriptor]:
    """One twin node per suggested cap, with the profile floor its QUERY reply carries."""
    device = open_device(grid.kind, "simulated")
    try:
        info = device.info
    finally:
        device.close()
    out = {}
    for i, cap_w in enumerate(grid.caps_w):
        cap = Cap.NONE if math.isinf(cap_w) else Cap(cap_w)
        out[i] = NodeDescriptor(
            node_name=f"{grid.kind}-{cap.label}",
            partition_id=i,
            device=grid.kind,
            backend="simulated",
            p_max=cap,
            p_max_schedule="",
            knob_values=grid.freqs,
            memory_bytes=8 << 30,
            power_rail=info.power_rail,
            max_batch_size=max(grid.batch_sizes),
            cap_margin=CAP_MARGIN,
            profile_floor_mhz=info.profile_floor_mhz([cap.watts]),
        )
    return out


def run_protocol(
    grid_b: Grid,
    r: Sequence[float],
    seed_cells: int = SharedOptions.seed_cells,
    peak_sigma_k: float = 0.0,
) -> tuple[KindProfile, float]:
    """The shared protocol on a fleet of ``grid_b``'s twin, cells answered from grid B
    (with σ of their per-step peaks when ``peak_sigma_k`` > 0 and the grid has it); the
    kind's measured cells and their device time."""
    fleet = fleet_of(grid_b)
    kinds = kinds_of(fleet, {n: list(grid_b.batch_sizes) for n in fleet}, "m", (1,))
    (prof,) = kinds.values()
    opts = SharedOptions(seed_cells=seed_cells, peak_sigma_k=peak_sigma_k)
    sigma = grid_b.sigma_w if peak_sigma_k > 0 else None
    cost = 0.0

    def measure(requests: dict[int, list[BF]]) -> None:
        nonlocal cost
        for cells in requests.values():
            idx = [(grid_b.batch_sizes.index(b), grid_b.freqs.index(f)) for b, f in cells]
            cost += sum(
                STEPS_PER_CELL * b * grid_b.time_s[i, j]
                for (b, _), (i, j) in zip(cells, idx, strict=True)
            )
            prof.add(
                CellsReport(
                    cells_b=tuple(float(b) for b, _ in cells),
                    cells_knob_value=tuple(f for _, f in cells),
                    time_per_sample_s=tuple(float(grid_b.time_s[c]) for c in idx),
                    peak_power_w=tuple(float(grid_b.peak_w[c]) for c in idx),
                    avg_power_w=tuple(float(grid_b.avg_w[c]) for c in idx),
                    profile_time_s=0.0,
                    profile_energy_j=0.0,
                    num_examples=0.0,
                    peak_sigma_w=() if sigma is None else tuple(float(sigma[c]) for c in idx),
                )
            )

    for requests in exchanges(kinds, {prof.kind: list(r)}, opts):
        measure(requests)
    return prof, cost


def to_target(cell: GridCell | None, time_s: np.ndarray, r: Sequence[float]) -> float:
    """Time to target of ``cell`` (row, column) by ``time_s``: time per sample × r_b."""
    return math.inf if cell is None else float(time_s[cell] * r[cell[0]])


def compare(
    grid_a: Grid,
    grid_b: Grid | None,
    seed_cells: int = SharedOptions.seed_cells,
    peak_sigma_k: float = 0.0,
) -> list[dict[str, Any]]:
    """Every (r profile, cap) of one table: the shared protocol answered from grid A itself
    ("same draws": every difference is the protocol's), and with ``grid_b`` (a twin's
    second measurement) from grid B ("fresh draws") and full grid B (the noise floor)."""
    rows = []
    full_cost = float(
        sum(
            STEPS_PER_CELL * b * grid_a.time_s[i, j]
            for i, b in enumerate(grid_a.batch_sizes)
            for j in range(len(grid_a.freqs))
        )
    )
    same_draws = "shared, same draws" if grid_a.truth is not None else f"shared, {grid_a.group}"
    for r_name, gamma in R_PROFILES.items():
        r = r_vector(grid_a.batch_sizes, gamma)
        sources = [(same_draws, grid_a)] + (
            [] if grid_b is None else [("shared, fresh draws", grid_b)]
        )
        protocols = {
            name: run_protocol(grid, r, seed_cells, peak_sigma_k) for name, grid in sources
        }
        choose = selector_fn(grid_a, r, peak_sigma_k)
        for cap_w in grid_a.caps_w:
            full = choose(grid_a.time_s, grid_a.peak_w, cap_w, grid_a.sigma_w)
            picks = []
            for name, (prof, cost) in protocols.items():
                time_s, peak_w, _, sigma_w = prof.tables()
                chosen = choose(time_s, peak_w, cap_w, sigma_w)
                picks.append((name, chosen, len(prof.measured), cost))
            if grid_b is not None:
                pick_b = choose(grid_b.time_s, grid_b.peak_w, cap_w, grid_b.sigma_w)
                picks.append(("full grid B", pick_b, grid_b.time_s.size, full_cost))
            for source, chosen, cells, cost in picks:
                t = grid_a.time_s
                same = chosen == full
                row = {
                    "source": source,
                    "table": grid_a.name,
                    "kind": grid_a.kind,
                    "model": grid_a.model,
                    "r": r_name,
                    "cap-w": cap_w,
                    "same": same,
                    "ratio": 1.0 if same else to_target(chosen, t, r) / to_target(full, t, r),
                    "cells": cells,
                    "cost-share": cost / full_cost,
                }
                if grid_a.truth is not None:
                    true_t, true_p = grid_a.truth
                    best = choose(true_t, true_p, cap_w)
                    row["regret"] = to_target(chosen, true_t, r) / to_target(best, true_t, r)
                    row["regret-full"] = to_target(full, true_t, r) / to_target(best, true_t, r)
                    row["over-cap"] = chosen is not None and bool(true_p[chosen] >= cap_w)
                else:
                    row["over-cap"] = chosen is not None and bool(grid_a.peak_w[chosen] >= cap_w)
                rows.append(row)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    differ = [r["ratio"] for r in rows if not r["same"]]
    regret = [r["regret"] for r in rows if "regret" in r]
    regret_full = [r["regret-full"] for r in rows if "regret-full" in r]
    n = max(len(rows), 1)
    return {
        "cases": len(rows),
        "same-share": sum(r["same"] for r in rows) / n,
        "worst-ratio": max(differ, default=1.0),
        "within-2pct-share": sum(r["ratio"] <= 1.02 for r in rows) / n,
        "cells-mean": float(np.mean([r["cells"] for r in rows])),
        "cells-max": max(r["cells"] for r in rows),
        "cost-share-mean": float(np.mean([r["cost-share"] for r in rows])),
        "regret-mean": float(np.mean(regret)) if regret else None,
        "regret-worst": max(regret, default=None),
        "full-grid-regret-mean": float(np.mean(regret_full)) if regret_full else None,
        "over-cap": sum(r["over-cap"] for r in rows),
    }


def print_table(groups: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'':<28}{'cases':>6}{'same':>7}{'worst':>7}{'≤2%':>6}{'cells':>6}{'max':>4}"
        f"{'cost':>7}{'regret mean/worst':>19}{'full A':>8}{'>cap':>5}"
    )
    print(f"{head}\n{'-' * len(head)}")
    for label, s in groups.items():
        print(
            f"{label:<28}{s['cases']:>6}{100 * s['same-share']:>6.1f}%{s['worst-ratio']:>7.3f}"
            f"{100 * s['within-2pct-share']:>5.0f}%{s['cells-mean']:>6.1f}{s['cells-max']:>4}"
            f"{100 * s['cost-share-mean']:>6.1f}%"
            + (
                f"{s['regret-mean']:>10.3f}/{s['regret-worst']:.3f}"
                f"{s['full-grid-regret-mean']:>8.3f}"
                if s["regret-mean"] is not None
                else f"{'–':>19}{'–':>8}"
            )
            + f"{s['over-cap']:>5}"
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from fl_client.devices.descriptors import available_device_kinds

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for kind in available_device_kinds():
        for model in args.models:
            for seed in range(args.seeds):
                grid_a, grid_b = measured_grids(kind, model, seed)
                rows += compare(grid_a, grid_b, args.seed_cells, args.peak_sigma_k)
    for grid in replay_grids(REPO / "configs" / "replay", np.random.default_rng(0)):
        rows += compare(grid, None, args.seed_cells, args.peak_sigma_k)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["source"]].append(row)
        if row["source"] == "shared, same draws":
            groups[f"shared {row['kind']}"].append(row)
            if len(args.models) > 1:
                groups[f"shared {row['model']}"].append(row)
    summary = {label: summarise(rs) for label, rs in groups.items()}
    print_table(summary)
    wall = time.perf_counter() - t0
    print(f"\nwall time {wall:.1f} s")
    return {
        "benchmark": "shared",
        "command": " ".join(["python", "benchmarks/bench_shared.py", *args.argv]),
        "cap-margin": CAP_MARGIN,
        "batch-sizes": BATCH_SIZES,
        "r-profiles": R_PROFILES,
        "seeds": args.seeds,
        "seed-cells": args.seed_cells,
        "peak-sigma-k": args.peak_sigma_k,
        "models": args.models,
        "groups": summary,
        "differing-cases": [r for r in rows if not r["same"] and r["source"].startswith("shared")],
        "wall-s": wall,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = OnceParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="twin seeds per kind and model")
    parser.add_argument(
        "--models", type=lambda s: s.split(","), default=["cnn", "resnet18", "mobilenetv2"]
    )
    parser.add_argument(
        "--seed-cells",
        type=int,
        default=SharedOptions.seed_cells,
        help="seed cells per kind (the run setting shared-seed-cells)",
    )
    parser.add_argument(
        "--peak-sigma-k",
        type=float,
        default=0.0,
        help="judge cells by peak + k·σ of their per-step peaks, as runs do (default 0: "
        "the peak alone; runs use 2)",
    )
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/shared.json"))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    write_results(args.json, run(args))


if __name__ == "__main__":
    main()
