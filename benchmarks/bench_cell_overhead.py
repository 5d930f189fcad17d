"""What measuring costs a profiled step on the real clock: the nvml path's cell loop.

A GPU step that is bound by its host (Python launching kernels: ResNet18 at small b on an
H100) is slowed by every microsecond the profiler's own loop spends after each step. This
runs the real ``NvmlDevice``, sampler, meter and profiler cell on a fake ``pynvml`` (power
varying, energy counter moving) on the wall clock, with steps that keep the host busy for
a fixed CPU time. It reports the CPU time the measuring thread spends per step beyond the
step itself (thread CPU time, so other work on the machine does not count), for cells of a
short and a long window (a cost that grows with the window grows the error with it).

    .venv/bin/python benchmarks/bench_cell_overhead.py [--windows 5,20] [--steps-ms 2,10]
        [--out FILE.json]

It uses only public calls, so it runs against another checkout too
(``PYTHONPATH=<other checkout>:.``) to compare before and after a change.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from results_file import write_results

from fl_client.cell_measure import CellOptions, CellWindow, measure_cell_with_sigma
from fl_client.devices import Workload
from fl_client.devices.nvml import NvmlControl, NvmlDevice

try:
    from fl_client.argparse_once import OnceParser
except ImportError:  # another checkout from before it (PYTHONPATH=<other checkout>:.)
    from argparse import ArgumentParser as OnceParser  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the fake pynvml lives with the tests
    sys.path.append(str(REPO))

from tests.fl_client.devices.conftest import FakeGpu, make_fake_pynvml  # noqa: E402

WORKLOAD = Workload("resnet18", (3, 32, 32), 1.1e9)


class BusyStep:
    """A step that keeps the host's thread busy for ``step_s`` of its own CPU time (a
    machine shared with other work does not change what it costs), counting its calls."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        end = time.thread_time() + self.step_s
        while time.thread_time() < end:
            pass


def _cell(step_ms: float, window_s: float) -> dict[str, Any]:
    gpu = FakeGpu(instant_power_mw=None)
    nv = make_fake_pynvml(gpu)
    rng = random.Random(1)
    nv.nvmlDeviceGetPowerUsage = lambda h: int(300_000 + 50_000 * rng.random())  # type: ignore[attr-defined]
    dev = NvmlDevice(nvml=nv, control=NvmlControl(lock_clocks=False))
    try:
        # never settled: every cell runs to its window, so cells of one window compare
        window = CellWindow(3, window_s, 1, max_window_s=window_s, max_time_rse=0.0)
        step = BusyStep(step_ms / 1e3)
        cpu0_s = time.thread_time()
        cell = measure_cell_with_sigma(
            dev,
            WORKLOAD,
            32,
            step,
            dev.knob_values[0],
            CellOptions(warmup_steps=3, window=window),
        )
        loop_cpu_s = time.thread_time() - cpu0_s - step.calls * step.step_s
    finally:
        dev.close()
    m = cell.measurement
    overhead_ms = loop_cpu_s / step.calls * 1e3
    return {
        "step-ms": step_ms,
        "window-s": window_s,
        "steps": step.calls,
        "power-samples": len(m.power_samples_w),
        "overhead-ms": overhead_ms,
        "overhead-share": overhead_ms / step_ms,
    }


def main(argv: list[str] | None = None) -> int:
    ap = OnceParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", default="5,20", help="cell windows in s (comma-separated)")
    ap.add_argument("--steps-ms", default="2,10", help="host step times in ms")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cell_overhead.json"))
    args = ap.parse_args(argv)
    windows = [float(w) for w in args.windows.split(",")]
    steps = [float(s) for s in args.steps_ms.split(",")]
    rows = [_cell(s, w) for w in windows for s in steps]
    print(f"{'window s':>8} {'step ms':>8} {'steps':>6} {'samples':>7} {'loop ms/step':>12} "
          f"{'of the step':>11}")  # fmt: skip
    for r in rows:
        print(
            f"{r['window-s']:8.0f} {r['step-ms']:8.1f} {r['steps']:6d} {r['power-samples']:7d} "
            f"{r['overhead-ms']:12.3f} {r['overhead-share']:11.1%}"
        )
    worst = max((r["overhead-share"] for r in rows), default=math.nan)
    write_results(args.out, {"bench": "cell_overhead", "rows": rows, "worst-overhead-share": worst})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
