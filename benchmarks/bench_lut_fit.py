"""Fitted LUTs (fl_client.lut_fit) against full measured grids: selection, cells, fit error.

For every digital twin (configs/devices/*.toml), model and twin seed the full (b, f) grid
is measured twice, cell by cell as the profiler measures a cell
(``fl_client.cell_measure.measure_cell``: 1 warm-up + 3 measured steps on the twin's noisy
clock and sensor): grid A is the reference, grid B a second, independent measurement of the
same board. ``lut_plan.plan_cells`` then measures only the cells it chooses:

* "twin, same draws": from grid A's cells, so the plan sees exactly the values the full
  profile saw and every difference in the choice is the fit's doing;
* "twin, fresh draws": from grid B's cells, new sensor noise as on a board;
* "twin, grid B = noise floor": no plan at all, full grid B itself; how often two full
  profiles of the same board already disagree.

For each cap (the twin's suggested caps and no cap) and r profile, Eq. 4 on the plan's
measured cells (``fl_client.selector.select("power-aware", ...)``, cap margin 5%) is
compared with Eq. 4 on full grid A. The same for the replay tables in configs/replay/ (the
only one is illustrative, not measured; also with twin-like sensor noise added) and, with
``--zeus-dir``, the measured Zeus power traces (b × GPU power limit on V100/A40/P100/
RTX6000; the knob is a power limit, not a frequency: out of the fit's design domain).

Columns: cases (table × r profile × cap); same (identical choice); worst (largest time to
target ratio where the choices differ: time per sample × r_b on grid A, plan's choice over
grid A's); ≤2% (share within 2%); cells (mean and most measured per table; budget =
8 + 2 per cap; 1cap = most extra cells one cap took); fit MAPE of time / peak power against
grid A (from the 8 seed cells alone, and at the end over the cells not measured); regret
(twins only: time to target of the choice on the noiseless twin over the noiseless optimum,
mean and worst: how much the choice really loses, for the plan and for full grid A alike);
>cap: choices whose noiseless peak is at or above the cap.

Usage: .venv/bin/python benchmarks/bench_lut_fit.py [--seeds N] [--models cnn,resnet18]
       [--strict-budget] [--zeus-dir DIR] [--json PATH]
Prints tables and writes JSON (default: benchmarks/results/lut_fit.json).
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from results_file import write_results

from fl_client import lut_fit, lut_plan
from fl_client.argparse_once import OnceParser
from fl_client.lut_fit import FloatArray
from fl_client.lut_plan import GridCell
from fl_client.power import PowerLimit

REPO = Path(__file__).resolve().parents[1]
BATCH_SIZES = (4, 8, 16, 32, 64, 128)
CAP_MARGIN = 0.05  # the run settings' default cap-margin
#: r_b = (b / b_max)^γ: flat (time per sample alone), and smaller b needing fewer samples.
R_PROFILES = {"flat": 0.0, "sqrt": 0.5, "steep": 0.8}
REPLAY_NOISE = 0.012  # relative σ of time and peak added in the "replay+noise" variant
#: ``choose(time, peak, cap_w[, sigma])``: Eq. 4's cell, None when none is feasible
Choose = Callable[..., "GridCell | None"]


@dataclass
class Grid:
    """One full measured table: axes, time per sample, peak and average power, caps."""

    name: str
    group: str
    kind: str
    model: str
    batch_sizes: tuple[int, ...]
    freqs: tuple[float, ...]
    time_s: FloatArray
    peak_w: FloatArray
    avg_w: FloatArray
    caps_w: tuple[float, ...]
    truth: tuple[FloatArray, FloatArray] | None = None  # noiseless twin: time, peak
    #: σ of each cell's per-step peaks (twins; None: a table without it, judged as σ = 0)
    sigma_w: FloatArray | None = None

    def lookup(self) -> lut_plan.MeasureFn:
        def measure(b: int, f: float) -> tuple[float, float, float]:
            i, j = self.batch_sizes.index(b), self.freqs.index(f)
            return float(self.time_s[i, j]), float(self.peak_w[i, j]), float(self.avg_w[i, j])

        return measure


# --------------------------------------------------------------------------- tables


def twin_grids(kind: str, model: str, seed: int) -> tuple[Grid, Grid]:
    """Grids A and B of one twin: the same board measured twice, with other noise."""
    from fl_client import cell_measure, model_zoo
    from fl_client.devices import open_device
    from fl_client.devices.base import Workload
    from fl_client.devices.descriptors import load_device_spec
    from fl_client.devices.simulated import power_w, time_per_sample_s

    shape = tuple(model_zoo.input_shape_for(model))
    flops = model_zoo.train_flops_per_sample(model, shape)
    workload = Workload(model, shape, flops)
    spec = load_device_spec(kind)
    freqs = tuple(float(f) for f in spec.gpu_freqs_mhz)
    truth = (
        np.array([[time_per_sample_s(spec, b, f, flops) for f in freqs] for b in BATCH_SIZES]),
        np.array([[power_w(spec, b, f, flops) for f in freqs] for b in BATCH_SIZES]),
    )
    grids = []
    for draw, label in ((seed, "A"), (seed + 1000, "B")):
        device = open_device(kind, "simulated", seed=draw)
        tables = np.full((4, len(BATCH_SIZES), len(freqs)), np.nan)
        for i, b in enumerate(BATCH_SIZES):
            for j, f in enumerate(freqs):
                cell = cell_measure.measure_cell_with_sigma(device, workload, b, lambda: None, f)
                m = cell.measurement
                tables[:, i, j] = (
                    cell_measure.time_per_sample_s(m, b, 3),
                    m.peak_power_w,
                    m.avg_power_w,
                    cell.peak_sigma_w,
                )
        name = f"{kind}/{model}/seed{seed}{label}"
        caps = tuple(spec.suggested_caps_w)
        grids.append(
            Grid(
                name,
                "twin",
                kind,
                model,
                BATCH_SIZES,
                freqs,
                tables[0],
                tables[1],
                tables[2],
                caps,
                truth,
                tables[3],
            )
        )
    return grids[0], grids[1]


def _full_tables(
    rows: Sequence[tuple[int, float, float, float, float]],
) -> tuple[tuple[int, ...], tuple[float, ...], FloatArray] | None:
    """(b, knob, time per sample, peak, avg) rows as (B, F, tables[3]); None if a cell lacks."""
    b_axis = tuple(sorted({r[0] for r in rows}))
    f_axis = tuple(sorted({r[1] for r in rows}))
    tables = np.full((3, len(b_axis), len(f_axis)), np.nan)
    for b, f, t, p, a in rows:
        tables[:, b_axis.index(b), f_axis.index(f)] = (t, p, a)
    return None if np.isnan(tables).any() else (b_axis, f_axis, tables)


def replay_grids(folder: Path, rng: np.random.Generator) -> list[Grid]:
    """Every replay table (CSV) in ``folder`` that is a full grid over GPU frequency, as is
    and with noise."""
    from fl_client.devices.descriptors import load_device_spec

    out = []
    for path in sorted(folder.glob("*.csv")):
        text = path.read_text(encoding="utf-8").splitlines()
        meta = dict(
            (k.strip(), v.strip())
            for k, _, v in (x[1:].partition(":") for x in text if x[:1] == "#")
        )
        knob = meta.get("knob", "freq_mhz")
        if knob != "freq_mhz":
            print(f"skipped {path.name}: its knob is {knob} (the fit's domain is freq_mhz)")
            continue
        rows = []
        for row in csv.DictReader(x for x in text if x.strip() and x[:1] != "#"):
            b = int(row["batch_size"])
            t = row.get("time_per_sample_s") or float(row["time_per_step_s"]) / b
            peak, avg = float(row["peak_power_w"]), float(row["avg_power_w"])
            rows.append((b, float(row["freq_mhz"]), float(t), peak, avg))
        full = _full_tables(rows)
        if full is None:
            print(f"skipped {path.name}: not a full grid")
            continue
        b_axis, f_axis, (t, p, a) = full
        kind, model = meta.get("device", ""), meta.get("model", "")
        caps = tuple(load_device_spec(kind).suggested_caps_w)
        out.append(Grid(path.stem, "replay", kind, model, b_axis, f_axis, t, p, a, caps))
        t_n = t * (1 + REPLAY_NOISE * rng.standard_normal(t.shape))
        p_n = p * (1 + REPLAY_NOISE * rng.standard_normal(p.shape))
        a_n = np.minimum(a * p_n / p, p_n)
        out.append(
            Grid(
                path.stem + "+noise",
                "replay+noise",
                kind,
                model,
                b_axis,
                f_axis,
                t_n,
                p_n,
                a_n,
                caps,
            )
        )
    return out


def zeus_grids(folder: Path) -> list[Grid]:
    """Zeus power traces (``summary_power_<gpu>.csv``): b × GPU power limit, measured.

    Time per epoch stands in for time per sample (a constant factor per table), the
    average power for the peak too (the traces have no peak); caps at 25/50/75% of each
    table's power range, and none.
    """
    out = []
    for path in sorted(folder.glob("summary_power_*.csv")):
        gpu = path.stem.removeprefix("summary_power_")
        groups: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
        with path.open(encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                power = float(row["average_power"])
                groups[row["dataset"], row["network"], row["optimizer"]].append(
                    (
                        int(row["batch_size"]),
                        float(row["power_limit"]),
                        float(row["time_per_epoch"]),
                        power,
                        power,
                    )
                )
        for (dataset, network, optimizer), rows in sorted(groups.items()):
            full = _full_tables(rows)
            if full is None:
                continue
            b_axis, f_axis, (t, p, a) = full
            lo, hi = float(p.min()), float(p.max())
            caps = (*(lo + q * (hi - lo) for q in (0.25, 0.5, 0.75)), math.inf)
            name = f"{gpu}/{dataset}-{network}-{optimizer}"
            out.append(Grid(name, "zeus (measured)", gpu, network, b_axis, f_axis, t, p, a, caps))
    return out


# --------------------------------------------------------------------------- comparing


def r_vector(batch_sizes: Sequence[int], gamma: float) -> list[float]:
    return [(b / batch_sizes[-1]) ** gamma for b in batch_sizes]


def selector_fn(grid: Grid, r: Sequence[float], peak_sigma_k: float = 0.0) -> Choose:
    """Eq. 4 through ``fl_client.selector.select`` (its stable keyword API) on plain tables;
    ``choose(time, peak, cap, sigma)`` judges a cell by peak + ``peak_sigma_k``·σ of its
    per-step peaks, as the runs do (σ None or k = 0: the profiled peak alone)."""
    from fl_client import selector
    from fl_client.power import PowerLimit
    from fl_client.selection import InfeasibleCapError, Tables

    rule = selector.Objective(peak_sigma_k=peak_sigma_k)

    def choose(
        time_s: FloatArray, peak_w: FloatArray, cap_w: float, sigma_w: FloatArray | None = None
    ) -> GridCell | None:
        try:
            sel = selector.select(
                selector.Method("power-aware", objective=rule),
                batch_sizes=list(grid.batch_sizes),
                knob_values=list(grid.freqs),
                tables=Tables(time_s, peak_w, peak_sigma_w=sigma_w),
                r=list(r),
                limit=PowerLimit(cap_w, CAP_MARGIN),
            )
        except InfeasibleCapError:
            return None
        return grid.batch_sizes.index(sel.batch_size), grid.freqs.index(float(sel.knob_value))

    return choose


@dataclass
class Case:
    """One (table, r profile, cap) comparison of a choice with full grid A's."""

    group: str
    table: str
    kind: str
    model: str
    r: str
    cap_w: float
    full: GridCell | None
    fitted: GridCell | None
    ratio: float
    regret: float = math.nan  # noiseless time to target of ``fitted`` over the optimum
    regret_full: float = math.nan
    over_cap: bool = False

    @property
    def same(self) -> bool:
        return self.full == self.fitted


@dataclass
class PlanStats:
    """Cells and fit error of one plan."""

    group: str
    table: str
    kind: str
    cells: int
    caps: int
    max_per_cap: int
    seed_mape: tuple[float, float]
    final_mape: tuple[float, float]
    unsettled: int


def _ratio(ref: Grid, r: Sequence[float], fitted: GridCell | None, full: GridCell | None) -> float:
    if fitted == full:
        return 1.0
    if fitted is None or full is None:
        return math.inf
    return float(ref.time_s[fitted] * r[fitted[0]] / (ref.time_s[full] * r[full[0]]))


def _case(ref: Grid, r_name: str, cap: float, chosen: GridCell | None, group: str) -> Case:
    """Compare ``chosen`` with full grid A's choice (and, for twins, the noiseless optimum)."""
    r = r_vector(ref.batch_sizes, R_PROFILES[r_name])
    choose = selector_fn(ref, r)
    full = choose(ref.time_s, ref.peak_w, cap)
    case = Case(group, ref.name, ref.kind, ref.model, r_name, cap, full, chosen, 0.0)
    case.ratio = _ratio(ref, r, chosen, full)
    if ref.truth is not None:
        true_t, true_p = ref.truth
        best = choose(true_t, true_p, cap)

        def regret(cell: GridCell | None) -> float:
            if cell is None or best is None:
                return math.inf
            return float(true_t[cell] * r[cell[0]] / (true_t[best] * r[best[0]]))

        case.regret, case.regret_full = regret(chosen), regret(full)
        case.over_cap = chosen is not None and bool(true_p[chosen] >= cap)
    return case


def _seed_mape(ref: Grid) -> tuple[float, float]:
    """MAPE of time and peak of the fit to the 8 seed cells alone, over all cells of ``ref``."""
    mask = np.zeros(ref.time_s.shape, dtype=bool)
    n_b, n_f = ref.time_s.shape
    for cell in lut_plan.seed_cells(n_b, n_f, 8):
        mask[cell] = True
    t, p, a = (np.where(mask, x, np.nan) for x in (ref.time_s, ref.peak_w, ref.avg_w))
    fit = lut_fit.fit_lut(ref.batch_sizes, ref.freqs, t, p, a)
    err = lut_fit.fit_error(fit, ref.time_s, ref.peak_w)
    return err.time_mape_pct, err.peak_mape_pct


def compare(
    ref: Grid, source: Grid, group: str, options: lut_plan.PlanOptions
) -> tuple[list[Case], list[PlanStats]]:
    """Plan on ``source``'s cells and compare with full grid ``ref``, for every r profile."""
    cases, stats = [], []
    seed_mape = _seed_mape(ref)
    for r_name, gamma in R_PROFILES.items():
        r = r_vector(ref.batch_sizes, gamma)
        choose = selector_fn(ref, r)
        plan = lut_plan.plan_cells(
            ref.batch_sizes,
            ref.freqs,
            [PowerLimit(cap, CAP_MARGIN) for cap in ref.caps_w],
            r,
            source.lookup(),
            options=_with_select(options, choose),
        )
        m_t, m_p, _ = plan.measured_tables()
        cases += [
            _case(ref, r_name, c.cap_w, choose(m_t, m_p, c.cap_w), group) for c in plan.choices
        ]
        final = lut_fit.fit_error(plan.fit, ref.time_s, ref.peak_w, mask=~plan.measured)
        stats.append(
            PlanStats(
                group,
                ref.name,
                ref.kind,
                len(plan.cells),
                len(plan.choices),
                max(c.cells for c in plan.choices),
                seed_mape,
                (final.time_mape_pct, final.peak_mape_pct),
                sum(not c.settled for c in plan.choices),
            )
        )
    return cases, stats


def _with_select(options: lut_plan.PlanOptions, choose: Choose) -> lut_plan.PlanOptions:
    def select(t: FloatArray, p: FloatArray, a: FloatArray, cap: float) -> GridCell | None:
        return choose(t, p, cap)

    return lut_plan.PlanOptions(
        seed_cells=options.seed_cells,
        cells_per_cap=options.cells_per_cap,
        pool_budget=options.pool_budget,
        select=select,
    )


def noise_floor(a: Grid, b: Grid) -> list[Case]:
    """Full grid B's choices compared like a plan's."""
    out = []
    for r_name, gamma in R_PROFILES.items():
        choose = selector_fn(a, r_vector(a.batch_sizes, gamma))
        for cap in a.caps_w:
            out.append(
                _case(a, r_name, cap, choose(b.time_s, b.peak_w, cap), "twin, grid B = noise floor")
            )
    return out


# --------------------------------------------------------------------------- reporting


def summarise(cases: list[Case], stats: list[PlanStats]) -> dict[str, Any]:
    differ = [c.ratio for c in cases if not c.same]
    n = max(len(cases), 1)

    def mean(values: list[float]) -> float:
        finite = [v for v in values if not math.isnan(v)]
        return float(np.mean(finite)) if finite else math.nan

    regrets = [c.regret for c in cases if not math.isnan(c.regret)]
    regrets_full = [c.regret_full for c in cases if not math.isnan(c.regret_full)]
    return {
        "cases": len(cases),
        "same-share": sum(c.same for c in cases) / n,
        "worst-ratio": max(differ, default=1.0),
        "within-2pct-share": sum(c.ratio <= 1.02 for c in cases) / n,
        "over-cap": sum(c.over_cap for c in cases),
        "regret-mean": mean(regrets),
        "regret-worst": max(regrets, default=math.nan),
        "full-grid-regret-mean": mean(regrets_full),
        "full-grid-regret-worst": max(regrets_full, default=math.nan),
        "plans": len(stats),
        "cells-mean": mean([s.cells for s in stats]),
        "cells-max": max((s.cells for s in stats), default=0),
        "cells-budget": max((8 + 2 * s.caps for s in stats), default=0),
        "max-extra-one-cap": max((s.max_per_cap for s in stats), default=0),
        "unsettled-caps": sum(s.unsettled for s in stats),
        "seed-fit-time-mape-pct": mean([s.seed_mape[0] for s in stats]),
        "seed-fit-peak-mape-pct": mean([s.seed_mape[1] for s in stats]),
        "final-fit-time-mape-pct": mean([s.final_mape[0] for s in stats]),
        "final-fit-peak-mape-pct": mean([s.final_mape[1] for s in stats]),
    }


def _num(x: float, fmt: str) -> str:
    return "-" if math.isnan(x) else format(x, fmt)


def print_table(title: str, rows: list[tuple[str, dict[str, Any]]]) -> None:
    head = (
        f"{'':<32}{'cases':>6}{'same':>7}{'worst':>7}{'≤2%':>5}{'cells':>6}{'max':>4}"
        f"{'budget':>7}{'1cap':>5}{'MAPE t/P seeds':>15}{'final':>11}{'regret mean/worst':>19}"
        f"{'>cap':>5}"
    )
    print(f"\n{title}\n{head}\n{'-' * len(head)}")
    for label, s in rows:
        seeds = "/".join(_num(s[f"seed-fit-{q}-mape-pct"], ".1f") for q in ("time", "peak"))
        final = "/".join(_num(s[f"final-fit-{q}-mape-pct"], ".1f") for q in ("time", "peak"))
        regret = f"{_num(s['regret-mean'], '.3f')}/{_num(s['regret-worst'], '.3f')}"
        print(
            f"{label:<32}{s['cases']:>6}{100 * s['same-share']:>6.1f}%{s['worst-ratio']:>7.3f}"
            f"{100 * s['within-2pct-share']:>4.0f}%{_num(s['cells-mean'], '.1f'):>6}"
            f"{s['cells-max']:>4}{s['cells-budget']:>7}{s['max-extra-one-cap']:>5}"
            f"{seeds:>15}{final:>11}{regret:>19}{s['over-cap']:>5}"
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from fl_client.devices.descriptors import available_device_kinds

    t0 = time.perf_counter()
    options = lut_plan.PlanOptions(pool_budget=not args.strict_budget)
    cases: list[Case] = []
    stats: list[PlanStats] = []
    full_grid = []
    for kind in available_device_kinds():
        for model in args.models:
            for seed in range(args.seeds):
                grid_a, grid_b = twin_grids(kind, model, seed)
                for source, group in ((grid_a, "twin, same draws"), (grid_b, "twin, fresh draws")):
                    c, s = compare(grid_a, source, group, options)
                    cases += c
                    stats += s
                floor = noise_floor(grid_a, grid_b)
                cases += floor
                full_grid += [
                    _case(grid_a, c.r, c.cap_w, c.full, "twin, full grid A") for c in floor
                ]
    others = replay_grids(REPO / "configs" / "replay", np.random.default_rng(0))
    if args.zeus_dir is not None:
        others += zeus_grids(args.zeus_dir)
    for grid in others:
        c, s = compare(grid, grid, grid.group, options)
        cases += c
        stats += s
    groups: dict[str, list[Case]] = defaultdict(list)
    kinds: dict[str, list[Case]] = defaultdict(list)
    for case in [*cases, *full_grid]:
        groups[case.group].append(case)
        kinds[f"{case.group.split(',')[0].split(' (')[0]} {case.kind}|{case.group}"].append(case)
    by_group = {g: summarise(cs, [s for s in stats if s.group == g]) for g, cs in groups.items()}
    print_table("By source (cases = table × r profile × cap)", list(by_group.items()))
    by_kind = {}
    for key, cs in sorted(kinds.items()):
        label, group = key.split("|")
        if group in ("twin, same draws", "twin, fresh draws", "replay", "zeus (measured)"):
            tag = {"twin, same draws": " same", "twin, fresh draws": " fresh"}.get(group, "")
            kind = cs[0].kind
            by_kind[label + tag] = summarise(
                cs, [s for s in stats if s.group == group and s.kind == kind]
            )
    print_table("By source and device kind", list(by_kind.items()))
    models: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        if case.group.startswith("twin, same") or case.group.startswith("twin, fresh"):
            models[f"{case.group}|{case.model}"].append(case)
    by_model = {}
    for key, cs in sorted(models.items()):
        group, model = key.split("|")
        plans = [s for s in stats if s.group == group and s.table.split("/")[1] == model]
        by_model[f"twin {group.split(', ')[1].split()[0]} {model}"] = summarise(cs, plans)
    print_table("Twins by model", list(by_model.items()))
    wall = time.perf_counter() - t0
    print(f"\nwall time {wall:.1f} s")
    return {
        "benchmark": "lut_fit",
        "command": " ".join(["python", "benchmarks/bench_lut_fit.py", *args.argv]),
        "cap-margin": CAP_MARGIN,
        "r-profiles": R_PROFILES,
        "seeds": args.seeds,
        "models": args.models,
        "budget": {
            "seed-cells": options.seed_cells,
            "cells-per-cap": options.cells_per_cap,
            "pooled": options.pool_budget,
        },
        "groups": by_group,
        "by-kind": by_kind,
        "by-model": by_model,
        "differing-cases": [
            {
                "group": c.group,
                "table": c.table,
                "r": c.r,
                "cap-w": None if math.isinf(c.cap_w) else c.cap_w,
                "full": c.full,
                "fitted": c.fitted,
                "ratio": c.ratio,
            }
            for c in cases
            if not c.same and c.group != "twin, grid B = noise floor"
        ],
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
        "--strict-budget", action="store_true", help="at most 2 extra cells for each cap"
    )
    parser.add_argument("--zeus-dir", type=Path, default=None, help="folder of summary_power_*.csv")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/lut_fit.json"))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    write_results(args.json, run(args))


if __name__ == "__main__":
    main()
