"""The nvml measurement path on the replayed H100 trace (virtual clock, no GPU needed).

Profiles ResNet18 at b = 4, 32, 128, 256 through the real ``NvmlDevice``, sampler and
profiler on the fake ``pynvml`` of ``tests/fl_client/devices/nvml_trace.py`` (each NVML call
costing ``--call-cost-ms`` of virtual time), twice in a row, and compares each cell with the
truth the replay knows: the trace's energy over the cell's window, the highest instant
reading in it, and the recorded step time.

    .venv/bin/python benchmarks/bench_trace_replay.py [--call-cost-ms 10] [--out FILE.json]

It only uses the profiler's public calls, so it runs against another checkout too
(``PYTHONPATH=<other checkout>:.``) to compare before and after a change.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from results_file import write_results

from fl_client.devices import Workload
from fl_client.devices.nvml import NvmlControl, NvmlDevice
from fl_client.profiler import ProfileOptions, profile

try:
    from fl_client.argparse_once import OnceParser
except ImportError:  # another checkout from before it (PYTHONPATH=<other checkout>:.)
    from argparse import ArgumentParser as OnceParser  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the replay lives with the tests
    sys.path.append(str(REPO))

from tests.fl_client.devices.nvml_trace import (  # noqa: E402
    ReplaySteps,
    Trace,
    TraceGpu,
    VirtualTime,
    make_trace_pynvml,
    virtual_sampling,
)

BATCH_SIZES = (4, 32, 128, 256)
WORKLOAD = Workload("resnet18", (3, 32, 32), 1.1e9)


def _cells(call_cost_s: float, passes: int) -> list[dict[str, Any]]:
    vt = VirtualTime(start_s=41.0)
    gpu = TraceGpu(vt)
    nv = make_trace_pynvml(gpu, call_cost_s=call_cost_s)
    rows: list[dict[str, Any]] = []
    with virtual_sampling(vt):
        dev = NvmlDevice(nvml=nv, control=NvmlControl(lock_clocks=False))
        for n in range(passes):
            lut = profile(
                dev, WORKLOAD, BATCH_SIZES, ReplaySteps(gpu), ProfileOptions(progress=False)
            )
            rows.extend(_row(lut, i, b, n, gpu.trace) for i, b in enumerate(BATCH_SIZES))
        dev.close()
    return rows


def _truth(trace: Trace, b: int) -> dict[str, float]:
    """What the GPU itself recorded over the 4 s training window of ``b``."""
    run = trace.runs[b]
    t0, t1 = run.train_start_s, run.train_end_s
    inside = (trace.t_s >= t0) & (trace.t_s <= t1)
    steps = run.step_marks[-1][0]
    return {
        "true-time-per-sample-ms": 1e3 * (t1 - t0) / steps / b,
        "true-peak-power-w": float(trace.instant_w[inside].max()),
        "true-avg-power-w": (trace.energy_lin_j(t1) - trace.energy_lin_j(t0)) / (t1 - t0),
    }


def _row(lut: Any, i: int, b: int, n: int, trace: Trace) -> dict[str, Any]:
    return _truth(trace, b) | {
        "pass": n + 1,
        "batch-size": b,
        "freq-mhz": float(lut.knob_values[0]),
        "time-per-sample-ms": 1e3 * float(lut.time_per_sample_s[i, 0]),
        "peak-power-w": float(lut.peak_power_w[i, 0]),
        "avg-power-w": float(lut.avg_power_w[i, 0]),
        "window-s": float(lut.window_s[i, 0]),
        "power-samples": float(lut.power_samples[i, 0]),
    }


def main() -> None:
    ap = OnceParser(description=__doc__.split("\n")[0])
    ap.add_argument("--call-cost-ms", type=float, default=10.0)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/trace_replay.json")
    args = ap.parse_args()
    rows = _cells(args.call_cost_ms / 1e3, args.passes)
    print(f"NVML call cost {args.call_cost_ms:g} ms (virtual); truth = the trace's own 4 s window")
    print(f"{'pass':>4} {'b':>4} {'MHz':>6} {'ms/sample (true)':>17} {'peak W (true)':>14} "
          f"{'avg W (true)':>13} {'window s':>8} {'samples':>7}")  # fmt: skip
    for r in rows:
        print(f"{r['pass']:>4} {r['batch-size']:>4} {r['freq-mhz']:>6g} "
              f"{r['time-per-sample-ms']:>7.4f} ({r['true-time-per-sample-ms']:.4f}) "
              f"{r['peak-power-w']:>6.1f} ({r['true-peak-power-w']:>5.1f}) "
              f"{r['avg-power-w']:>5.1f} ({r['true-avg-power-w']:>5.1f}) "
              f"{r['window-s']:>8.2f} {r['power-samples']:>7g}")  # fmt: skip
    write_results(args.out, {"call-cost-ms": args.call_cost_ms, "cells": rows})


if __name__ == "__main__":
    main()
