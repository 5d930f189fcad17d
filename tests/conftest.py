"""Test-wide setup: Flower stays offline and keeps its home inside the work tree."""

import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("FLWR_HOME", str(Path(__file__).resolve().parents[1] / ".flwr"))


import pytest


@pytest.fixture
def flower_task_identity() -> Iterator[None]:
    """Newer Flower stamps messages with the running task's identity; give tests one."""
    try:
        from flwr.supercore.task_identity import TaskIdentity
    except ImportError:  # older Flower (e.g. 1.30) needs none
        yield
        return
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture
def engine_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``simulations.run``'s engines replaced by a fake that only records that it was
    started: a test of what is refused before start asserts the list stays empty."""
    from simulations import run

    started: list[str] = []

    def engine(*args: object, **kw: object) -> dict[str, object]:
        started.append("engine")
        return {}

    monkeypatch.setattr(run, "_simulate_in_runtime", engine)
    monkeypatch.setattr(run, "_simulate_in_process", engine)
    return started
