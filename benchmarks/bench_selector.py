"""Selection time per call (Eq. 4 with binary search) for |B| = 6, |F| = 14.

Usage: python benchmarks/bench_selector.py [--calls N] [--json PATH]
Prints a table and writes JSON (default: benchmarks/results/selector.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from fl_client import selector


def make_tables(
    n_b: int, n_f: int, seed: int
) -> tuple[np.ndarray, np.ndarray, list[int], list[float]]:
    rng = np.random.default_rng(seed)
    batch_sizes = [2 ** (i + 2) for i in range(n_b)]
    freqs_mhz = list(np.linspace(114.75, 1300.5, n_f))
    b = np.array(batch_sizes, dtype=float)[:, None]
    f = np.array(freqs_mhz)[None, :]
    power_w = 1.5 + 0.004 * f * (1 + np.log2(b) / 4) + rng.normal(0, 0.05, (n_b, n_f))
    time_s = 1e-3 * (1 + 8 / b) * (1300.5 / f) * (1 + rng.normal(0, 0.01, (n_b, n_f)))
    return time_s, power_w, batch_sizes, freqs_mhz


def bench(calls: int, n_b: int = 6, n_f: int = 14) -> dict[str, float]:
    time_s, power_w, batch_sizes, freqs_mhz = make_tables(n_b, n_f, seed=0)
    r = list(np.linspace(0.3, 1.0, n_b))
    caps = np.linspace(float(power_w.min()) + 0.1, float(power_w.max()), 64)
    out = {}
    for method in ("power-aware", "b1"):
        for _ in range(100):  # warm-up
            _call(method, time_s, power_w, batch_sizes, freqs_mhz, r, float(caps[0]))
        t0 = time.perf_counter()
        for i in range(calls):
            _call(method, time_s, power_w, batch_sizes, freqs_mhz, r, float(caps[i % len(caps)]))
        out[method] = (time.perf_counter() - t0) / calls * 1e6
    return out


def _call(method, time_s, power_w, batch_sizes, freqs_mhz, r, p_max_w):  # type: ignore[no-untyped-def]
    if method == "power-aware":
        return selector.select_power_aware(
            lut_time_s=time_s,
            lut_power_w=power_w,
            batch_sizes=batch_sizes,
            freqs_mhz=freqs_mhz,
            r=r,
            p_max_w=p_max_w,
        )
    return selector.select_b1(
        lut_time_s=time_s,
        lut_power_w=power_w,
        batch_sizes=batch_sizes,
        freqs_mhz=freqs_mhz,
        b1_freq_cap_mhz=614.4,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/selector.json"))
    args = parser.parse_args()
    res = bench(args.calls)
    print(f"{'method':<14}{'|B|':>5}{'|F|':>5}{'µs per call':>14}")
    for method, us in res.items():
        print(f"{method:<14}{6:>5}{14:>5}{us:>14.1f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "benchmark": "selector",
                "calls": args.calls,
                "batch-sizes": 6,
                "freqs": 14,
                "us-per-call": res,
                "python": platform.python_version(),
                "machine": platform.machine(),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
