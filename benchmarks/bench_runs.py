"""Whole-run benchmark: the default simulation and large fleets, power-aware against B1.

Measures wall time, peak memory of the whole process tree (Flower's simulation engine
starts worker processes, so the driver's own RSS is not enough), seconds per round, and
the profiling share of total device time from the run's own summary.

Cases: ``default`` (the default run, power-aware); ``fleet100`` (100 nodes of two kinds, 1
round, 1 local epoch) and ``fleet1000`` (1,000 nodes of four kinds, 1 round, 1 local
epoch), each for power-aware (with fleet-shared profiling, the default) and B1, so the
table gives power-aware's wall time against B1's.

Usage: python benchmarks/bench_runs.py [--only default|fleet100|fleet1000] [--json PATH]
Prints a table and writes JSON (default: benchmarks/results/runs.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from results_file import write_results

from fl_client.argparse_once import OnceParser

REPO = Path(__file__).resolve().parents[1]


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def run_case(
    name: str, args: list[str], out_dir: Path, method: str = "power-aware"
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "simulations",
        "simulate",
        "--methods",
        method,
        "--output-dir",
        str(out_dir),
        *args,
    ]
    print(f"== {name}: {' '.join(cmd[2:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss_bytes(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log, _ = proc.communicate()
    stop.set()
    sampler.join()
    wall_s = time.perf_counter() - t0
    (out_dir / f"{name}.log").write_text(log)
    if proc.returncode != 0:
        print(log[-4000:])
        raise SystemExit(f"{name}: exit code {proc.returncode}")
    summary_path = max(out_dir.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    summ = json.loads(summary_path.read_text())
    return {
        "case": name,
        "method": method,
        "nodes": len(summ["nodes"]),
        "rounds": summ["rounds"],
        "wall-s": wall_s,
        "s-per-round": wall_s / max(summ["rounds"], 1),
        "peak-rss-mib": peak / 2**20,
        "final-accuracy": summ["final-accuracy"],
        "node-rounds-ok": sum(n["rounds-ok"] for n in summ["nodes"].values()),
        "node-rounds-failed": sum(n["rounds-failed"] for n in summ["nodes"].values()),
        "profile-share": summ["profile-share"],
        "device-profile-time-s": summ["device-profile-time-s"],
        "device-train-time-s": summ["device-train-time-s"],
    }


def fleet_of(path: Path, count: int, mix: Sequence[tuple[str, float | str]]) -> Path:
    """``count`` nodes cycling through ``mix`` of (device kind, cap)."""
    lines = []
    for i in range(count):
        device, cap = mix[i % len(mix)]
        cap_toml = f'"{cap}"' if isinstance(cap, str) else cap
        lines += [
            "[[node]]",
            f'name = "n{i:04d}"',
            f'device = "{device}"',
            f"p-max-w = {cap_toml}",
            "",
        ]
    path.write_text("\n".join(lines))
    return path


#: Two kinds for 100 nodes, four for 1,000, with the caps of the default fleet.
MIX_2 = [
    ("jetson-nano", 4.5),
    ("jetson-nano", 7.0),
    ("jetson-tx2-nx", 5.0),
    ("jetson-tx2-nx", 10.0),
]
MIX_4 = [*MIX_2, ("jetson-orin-nano", 7.0), ("jetson-agx-orin", 15.0)]


def fleet_case(
    name: str, count: int, mix: Sequence[tuple[str, float | str]], tmp: Path
) -> list[dict[str, Any]]:
    """Power-aware and B1 on one large fleet: 1 round of 1 local epoch, IID (a Dirichlet
    split cannot give every node samples), on a fresh cache each."""
    fleet = fleet_of(tmp / f"{name}.toml", count, mix)
    rows = []
    for method in ("power-aware", "b1"):
        cache = ["-c", f"cache-dir={json.dumps(str(tmp / f'cache-{name}-{method}'))}"]
        args = [
            "--fleet",
            str(fleet),
            "--rounds",
            "1",
            "-c",
            "local-epochs=1",
            "-c",
            "target-accuracy=0.99",
            "-c",
            "partitioning='iid'",
            "-c",
            f"min-train-nodes={count}",
            *cache,
        ]
        rows.append(run_case(name, args, tmp / f"{name}-{method}", method))
    return rows


def main() -> None:
    parser = OnceParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("default", "fleet100", "fleet1000"))
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks/results/runs.json")
    args = parser.parse_args()
    os.environ.setdefault("FLWR_HOME", str(REPO / ".flwr"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="powerfl-bench-") as tmp:
        tmp_path = Path(tmp)
        cache = ["-c", f"cache-dir={json.dumps(str(tmp_path / 'cache'))}"]
        if args.only in (None, "default"):
            rows.append(run_case("default", cache, tmp_path / "default"))
        if args.only in (None, "fleet100"):
            rows += fleet_case("fleet100", 100, MIX_2, tmp_path)
        if args.only in (None, "fleet1000"):
            rows += fleet_case("fleet1000", 1000, MIX_4, tmp_path)
    hdr = (
        f"{'case':<10}{'method':<12}{'nodes':>6}{'rounds':>7}{'wall s':>9}{'s/round':>9}"
        f"{'peak MiB':>10}{'final acc':>10}{'profiling':>10}{'node-rounds ok/failed':>23}"
    )
    print(hdr)
    for r in rows:
        print(
            f"{r['case']:<10}{r['method']:<12}{r['nodes']:>6}{r['rounds']:>7}{r['wall-s']:>9.1f}"
            f"{r['s-per-round']:>9.1f}{r['peak-rss-mib']:>10.0f}"
            f"{r['final-accuracy']:>10.3f}{100 * r['profile-share']:>9.2f}%"
            f"{r['node-rounds-ok']:>17}/{r['node-rounds-failed']}"
        )
    write_results(
        args.json,
        {
            "benchmark": "runs",
            "cases": rows,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
    )


if __name__ == "__main__":
    main()
