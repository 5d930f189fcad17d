"""Test-wide setup: Flower stays offline and keeps its home inside the work tree."""

import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("FLWR_HOME", str(Path(__file__).resolve().parents[1] / ".flwr"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # a pytest-xdist worker is given COLUMNS=80, which the run tables read as a terminal's
    # width (fl_server.results.make_console): a worker sees what a serial run sees
    os.environ.pop("COLUMNS", None)


import pytest

# ----------------------------------------------------------------------------- pytest-xdist
# pyproject.toml's addopts give ``-n auto --dist loadscope``: the whole suite (pytest run
# without paths) runs in WHOLE_SUITE_WORKERS processes, each module's tests in one worker
# (a module-scoped fixture, such as the one federation of tests/deployment/test_loopback.py,
# is made once); a run given paths runs serially. (``--dist loadgroup`` with xdist_group
# markers would let the other modules' tests spread per test, but pytest-xdist 3.8 cannot
# rename pytest 9's node ids, so its groups are ignored.)

#: Workers for the whole suite. Most of its time is spent waiting (subprocesses, Flower's
#: SuperLink and SuperNodes, Ray starting), not computing, so a 2-core host runs more
#: workers than cores.
WHOLE_SUITE_WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: WHOLE_SUITE_WORKERS for the whole suite (the testpaths), none (serial,
    no start-up of workers) when paths are given: one module, a folder of hardware tests on
    a board. ``-n N`` or ``-n0`` on the command line, or $PYTEST_XDIST_AUTO_NUM_WORKERS,
    choose otherwise."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if env.isdigit():
        return int(env)
    return WHOLE_SUITE_WORKERS if config.args_source == pytest.Config.ArgsSource.TESTPATHS else 0


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
