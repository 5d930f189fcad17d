"""Selection time per call (Eq. 4 on noisy tables, and B1) for |B| = 6, |F| = 14.

Usage: python benchmarks/bench_selector.py [--calls N] [--repeats R] [--json PATH]
                                           [--selector FILE]
Prints a table and writes JSON (default: benchmarks/results/selector.json). Each case runs
``calls`` selections ``repeats`` times over 64 caps; the JSON keeps the best repeat's time
per call (``us-per-call``: the least disturbed by other work on the machine) and the median.
``--selector FILE`` times another copy of ``fl_client/selector.py`` (e.g. the version before
a change) on the same tables, for before/after numbers from one machine and session.
"""

from __future__ import annotations

import importlib.util
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from results_file import write_results

from fl_client import selector as current_selector
from fl_client.argparse_once import OnceParser


def make_tables(
    n_b: int, n_f: int, seed: int
) -> tuple[np.ndarray, np.ndarray, list[int], list[float]]:
    rng = np.random.default_rng(seed)
    batch_sizes = [2 ** (i + 2) for i in range(n_b)]
    knob_values = list(np.linspace(114.75, 1300.5, n_f))
    b = np.array(batch_sizes, dtype=float)[:, None]
    f = np.array(knob_values)[None, :]
    power_w = 1.5 + 0.004 * f * (1 + np.log2(b) / 4) + rng.normal(0, 0.05, (n_b, n_f))
    time_s = 1e-3 * (1 + 8 / b) * (1300.5 / f) * (1 + rng.normal(0, 0.01, (n_b, n_f)))
    return time_s, power_w, batch_sizes, knob_values


def _b1_field(method: type) -> str:
    """The name of ``Method``'s B1 frequency field in a selector module of any version."""
    names = getattr(method, "__dataclass_fields__", {})
    return "b1_max_freq_mhz" if "b1_max_freq_mhz" in names else "b1_freq_cap_mhz"


def cases(sel: ModuleType, n_b: int, n_f: int) -> dict[str, Callable[[float], Any]]:
    """Per case, a call of the selector under a given cap (cases the module lacks: none)."""
    time_s, power_w, batch_sizes, knob_values = make_tables(n_b, n_f, seed=0)
    r = list(np.linspace(0.3, 1.0, n_b))
    out: dict[str, Callable[[float], Any]] = {
        # Eq. 4 on the two tables (a module from before issue 13: positionally).
        "power-aware": (
            (
                lambda cap: sel.select_eq4(
                    sel.Tables(time_s, power_w), batch_sizes, knob_values, r, cap
                )
            )
            if hasattr(sel, "Tables")
            else (
                lambda cap: sel.select_power_aware(
                    time_s, power_w, batch_sizes, knob_values, r, cap
                )
            )
        ),
        "b1": (
            (
                lambda cap: sel.select(
                    # a module from before the field's rename: ``b1_freq_cap_mhz``
                    sel.Method("b1", **{_b1_field(sel.Method): 614.4}),
                    batch_sizes=batch_sizes,
                    knob_values=knob_values,
                    tables=sel.Tables(time_s, power_w),
                )
            )
            if hasattr(sel, "Method")
            # a module from before the baselines took Tables: the two tables positionally
            else (lambda cap: sel.select_b1(batch_sizes, knob_values, 614.4, time_s, power_w))
        ),
    }
    if hasattr(sel, "Tables"):
        # What a node passes once its LUT has average power and σ of per-step peaks.
        rng = np.random.default_rng(1)
        tables = sel.Tables(time_s, power_w, power_w * 0.9, rng.uniform(0.0, 0.05, (n_b, n_f)))
        out["power-aware+avg+sigma"] = lambda cap: sel.select(
            "power-aware",
            batch_sizes=batch_sizes,
            knob_values=knob_values,
            tables=tables,
            r=r,
            **{"limit" if hasattr(sel, "Method") else "p_max_w": sel.PowerLimit(cap, 0.05)},
        )
    return out


def bench(
    sel: ModuleType, calls: int, repeats: int, n_b: int = 6, n_f: int = 14
) -> dict[str, tuple[float, float]]:
    """(best, median) µs per call of each case."""
    _, power_w, _, _ = make_tables(n_b, n_f, seed=0)
    out = {}
    for name, call in cases(sel, n_b, n_f).items():
        # 64 caps from just above the lowest peak (plus room for the margin and k·σ) up
        lowest = float(power_w.min()) + (0.3 if "sigma" in name else 0.1)
        caps = np.linspace(lowest, float(power_w.max()), 64).tolist()
        for cap in caps:  # warm-up
            call(cap)
        per_call = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(calls):
                call(caps[i % len(caps)])
            per_call.append((time.perf_counter() - t0) / calls * 1e6)
        out[name] = (min(per_call), statistics.median(per_call))
    return out


def load_selector(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("selector_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = OnceParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/selector.json"))
    parser.add_argument("--selector", type=Path, default=None)
    args = parser.parse_args()
    sel = current_selector if args.selector is None else load_selector(args.selector)
    res = bench(sel, args.calls, args.repeats)
    print(f"{'case':<24}{'|B|':>5}{'|F|':>5}{'µs/call best':>14}{'median':>9}")
    for name, (best, median) in res.items():
        print(f"{name:<24}{6:>5}{14:>5}{best:>14.1f}{median:>9.1f}")
    write_results(
        args.json,
        {
            "benchmark": "selector",
            "selector": str(args.selector or "fl_client/selector.py"),
            "calls": args.calls,
            "repeats": args.repeats,
            "batch-sizes": 6,
            "freqs": 14,
            "us-per-call": {name: best for name, (best, _) in res.items()},
            "us-per-call-median": {name: median for name, (_, median) in res.items()},
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
        },
    )


if __name__ == "__main__":
    main()
