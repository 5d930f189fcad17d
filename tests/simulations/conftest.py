"""Shared setup of the simulation tests: a small fleet run end to end by the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` file, one per non-blank line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class SmallRun:
    """A finished ``simulate`` run: its console, its folder and its records."""

    proc: subprocess.CompletedProcess[str]
    run_dir: Path
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    nodes: list[dict[str, Any]]


@pytest.fixture
def small_run(tmp_path: Path) -> Callable[..., SmallRun]:
    """Runs ``power-aware`` for 3 rounds on the fleet file text given, IID data, a target
    accuracy it does not reach and a fresh cache under ``tmp_path``, with the run settings
    given (``"drift-check-every=2"``); asserts it exits 0."""

    def run(fleet_text: str, *settings: str) -> SmallRun:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(fleet_text)
        out = tmp_path / "runs"
        cmd = [sys.executable, "-m", "simulations", "simulate", "--methods", "power-aware"]
        cmd += ["--fleet", str(fleet), "--rounds", "3", "--output-dir", str(out)]
        for setting in (
            f"cache-dir={json.dumps(str(tmp_path / 'cache'))}",
            "target-accuracy=0.99",
            "partitioning='iid'",
            *settings,
        ):
            cmd += ["-c", setting]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
        return SmallRun(
            proc,
            run_dir,
            json.loads((run_dir / "summary.json").read_text()),
            read_jsonl(run_dir / "rounds.jsonl"),
            read_jsonl(run_dir / "nodes.jsonl"),
        )

    return run
