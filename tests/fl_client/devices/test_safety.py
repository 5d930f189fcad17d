"""Whatever ends the process, the GPU settings come back: a subprocess locks a frequency on
a fake sysfs tree and is killed (SIGTERM, SIGINT, SIGKILL) or raises."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fl_client.devices import DeviceError, safety
from fl_client.devices.cli import restore_command
from fl_client.devices.jetson import JetsonDevice
from fl_client.devices.sampler import SampledOptions
from fl_client.settings import REPO_ROOT
from tests.fl_client.devices.conftest import await_line
from tests.fl_client.devices.fakes_sysfs import FakeJetson, build_tree

ORIGINAL = (76_800_000, 921_600_000)  # Nano: full range
LOCKED_HZ = 460_800_000

SCRIPT = """
import sys, time
from fl_client.devices.jetson import JetsonDevice
from fl_client.devices.sampler import SampledOptions
dev = JetsonDevice("jetson-nano", root=sys.argv[1], sampled=SampledOptions(state_dir=sys.argv[2]))
dev.set_knob_value(460.8)
print("LOCKED", flush=True)
if sys.argv[3] == "raise":
    raise RuntimeError("training crashed")
time.sleep(60)
"""


def start_locked(
    fake: FakeJetson, state_dir: Path, mode: str = "wait", *, ignore_sighup: bool = False
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(fake.root), str(state_dir), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        # A shell that runs us in the background ignores SIGINT, and a child inherits that
        # (Python then installs no KeyboardInterrupt handler): give it the default back.
        preexec_fn=_nohup if ignore_sighup else _default_sigint,
    )
    await_line(proc, "LOCKED", 30.0, "child did not lock")
    return proc


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _nohup() -> None:
    """What ``nohup`` does before it starts a command: SIGHUP ignored."""
    _default_sigint()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.fixture
def nano(tmp_path: Path) -> FakeJetson:
    return build_tree(tmp_path / "root", "nano-jp4")


def limits(fake: FakeJetson) -> tuple[int, int]:
    return fake.min_hz, fake.max_hz


def limits_now(fake: FakeJetson) -> tuple[int, int] | None:
    """``limits`` while a child may be rewriting the files (None: caught half-written)."""
    try:
        return limits(fake)
    except (IndexError, ValueError):
        return None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_restores_and_the_process_still_ends(nano: FakeJetson, state_dir: Path, signum: int):
    proc = start_locked(nano, state_dir)
    assert limits(nano) == (LOCKED_HZ, LOCKED_HZ)
    assert len(safety.leftover_states(state_dir)) == 1
    proc.send_signal(signum)
    proc.wait(timeout=20)
    assert limits(nano) == ORIGINAL
    assert safety.leftover_states(state_dir) == []
    if signum == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM  # still dies by the signal
    else:
        assert proc.returncode != 0  # KeyboardInterrupt


def test_uncaught_exception_restores(nano: FakeJetson, state_dir: Path):
    proc = start_locked(nano, state_dir, mode="raise")
    proc.wait(timeout=20)
    assert proc.returncode == 1
    assert limits(nano) == ORIGINAL
    assert safety.leftover_states(state_dir) == []


def test_sigkill_leaves_state_that_the_next_open_restores(nano: FakeJetson, state_dir: Path):
    proc = start_locked(nano, state_dir)
    proc.kill()
    proc.wait(timeout=20)
    assert limits(nano) == (LOCKED_HZ, LOCKED_HZ)  # nothing could run
    [path] = safety.leftover_states(state_dir)
    saved = safety.load_state(path)
    assert (saved.settings["min-freq-hz"], saved.settings["max-freq-hz"]) == ORIGINAL
    assert saved.pid == proc.pid and not saved.owner_alive()
    dev = JetsonDevice("jetson-nano", root=nano.root, sampled=SampledOptions(state_dir=state_dir))
    assert limits(nano) == ORIGINAL
    assert safety.leftover_states(state_dir) == []
    assert (dev.original_settings.min_freq_hz, dev.original_settings.max_freq_hz) == ORIGINAL


def test_sigkill_then_restore_command(nano: FakeJetson, state_dir: Path):
    proc = start_locked(nano, state_dir)
    proc.kill()
    proc.wait(timeout=20)
    out = io.StringIO()
    assert restore_command(str(state_dir), out=out) == 0
    assert limits(nano) == ORIGINAL
    assert "restored" in out.getvalue() and "jetson" in out.getvalue()
    out = io.StringIO()
    assert restore_command(str(state_dir), out=out) == 0
    assert "nothing to restore" in out.getvalue()


def test_restore_leftovers_leaves_files_of_live_owners(nano: FakeJetson, state_dir: Path):
    dev = JetsonDevice("jetson-nano", root=nano.root, sampled=SampledOptions(state_dir=state_dir))
    dev.set_knob_value(307.2)
    data = json.loads(dev.state_file.read_text())
    data["pid"] = os.getppid()
    dev.state_file.write_text(json.dumps(data))
    [report] = safety.restore_leftovers(state_dir)
    assert report.status == "held" and str(os.getppid()) in report.detail
    assert limits(nano) == (307_200_000, 307_200_000)
    [report] = safety.restore_leftovers(state_dir, force=True)
    assert report.status == "restored"
    assert limits(nano) == ORIGINAL


def test_state_from_an_earlier_boot_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = safety.save_state(tmp_path, "jetson", "/x", {"node": "/x"})
    state = safety.load_state(path)
    assert state.pid == os.getpid() and state.owner_alive()
    data = json.loads(path.read_text())
    data["boot-id"] = "an-earlier-boot"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(safety, "boot_id", lambda: "this-boot")
    assert not safety.load_state(path).owner_alive()


def test_corrupt_and_unknown_state_files_are_reported(state_dir: Path):
    state_dir.mkdir(parents=True)
    (state_dir / "jetson-broken.json").write_text("{not json")
    safety.save_state(state_dir, "tpu", "x", {})
    reports = {r.path.name: r for r in safety.restore_leftovers(state_dir)}
    assert reports["jetson-broken.json"].status == "failed"
    assert "corrupt GPU state file" in reports["jetson-broken.json"].detail
    assert reports["tpu-x.json"].status == "failed"
    assert "unknown backend 'tpu'" in reports["tpu-x.json"].detail
    assert restore_command(str(state_dir), out=io.StringIO()) == 1


def test_unwritable_state_dir_is_a_clear_error(nano: FakeJetson, tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    dev = JetsonDevice(
        "jetson-nano", root=nano.root, sampled=SampledOptions(state_dir=blocker / "state")
    )
    with pytest.raises(DeviceError, match="POWERFL_STATE_DIR"):
        dev.set_knob_value(307.2)
    assert limits(nano) == ORIGINAL  # nothing changed before the state was safe


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv(safety.STATE_DIR_ENV, str(tmp_path / "s"))
    assert safety.default_state_dir() == tmp_path / "s"
    monkeypatch.delenv(safety.STATE_DIR_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert safety.default_state_dir() == tmp_path / ".cache" / "powerfl" / "state"


def test_restore_all_survives_a_failing_restorer():
    calls: list[str] = []

    def bad() -> None:
        calls.append("bad")
        raise OSError("gone")

    t1 = safety.register(bad)
    t2 = safety.register(lambda: calls.append("good"))
    safety.restore_all()
    assert sorted(calls) == ["bad", "good"]
    safety.unregister(t1)
    safety.unregister(t2)
    assert safety.active_count() == 0


def _wait_for(seen: list[str], n: int) -> None:
    deadline = time.monotonic() + 5
    while len(seen) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_handler_that_goes_on_restores_nothing():
    """The previous handler returns: the process, and its training, go on, so the device
    stays as the running step needs it (it is restored when that step ends)."""
    seen: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append("previous"))
    try:
        safety.uninstall_handlers()
        token = safety.register(lambda: seen.append("restore"))
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(seen, 1)
        time.sleep(0.05)
        assert seen == ["previous"]
        safety.unregister(token)
    finally:
        safety.uninstall_handlers()
        signal.signal(signal.SIGTERM, previous)


class _Stop(BaseException):
    pass


def test_a_handler_that_raises_restores_the_main_threads_devices_only():
    """The previous handler raises in the main thread: that unwinds the main thread's
    training step, so its device is restored; a device held by another thread, whose step
    keeps running, is not."""
    seen: list[str] = []

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        safety.uninstall_handlers()
        main_token = safety.register(lambda: seen.append("main"))
        other: list[int] = []
        worker = threading.Thread(
            target=lambda: other.append(safety.register(lambda: seen.append("worker")))
        )
        worker.start()
        worker.join()
        with pytest.raises(_Stop):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs here, in the main thread
        assert seen == ["main"]
        safety.unregister(main_token)
        safety.unregister(other[0])
    finally:
        safety.uninstall_handlers()
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_signal_gets_no_handler():
    """Under nohup SIGHUP is ignored: it must stay ignored, never restore a device."""
    seen: list[str] = []
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        safety.uninstall_handlers()
        token = safety.register(lambda: seen.append("restore"))
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.05)
        assert seen == []
        safety.unregister(token)
    finally:
        safety.uninstall_handlers()
        signal.signal(signal.SIGHUP, previous)


def test_sighup_under_nohup_leaves_the_gpu_locked_while_training_goes_on(
    nano: FakeJetson, state_dir: Path
):
    """A child started as ``nohup`` starts it (SIGHUP ignored): SIGHUP neither unlocks the GPU
    nor stops the child; SIGTERM afterwards still restores."""
    proc = start_locked(nano, state_dir, ignore_sighup=True)
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert proc.poll() is None  # still training
    assert limits(nano) == (LOCKED_HZ, LOCKED_HZ)
    assert len(safety.leftover_states(state_dir)) == 1
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    assert proc.returncode == -signal.SIGTERM
    assert limits(nano) == ORIGINAL
    assert safety.leftover_states(state_dir) == []


CLI = "import sys; from simulations.cli import main; sys.exit(main(sys.argv[1:]))"


def powerfl(*argv: str, **kwargs: object) -> subprocess.Popen[str]:
    """The ``powerfl`` command line in a child process (no installed script needed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        **kwargs,  # type: ignore[call-overload]
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_profile_command_killed_mid_profile(
    nano: FakeJetson, state_dir: Path, tmp_path: Path, signum: int
):
    """`powerfl profile` on a fake Nano, killed while it holds a frequency lock: SIGTERM
    restores at once; after SIGKILL `powerfl devices --restore` does."""
    lowest = (76_800_000, 76_800_000)  # a full-grid profile locks the lowest f first
    proc = powerfl(
        "profile", "--backend", "jetson", "--sysfs-root", str(nano.root),
        "--state-dir", str(state_dir), "--model", "cnn", "--batch-sizes", "4",
        "--warmup-steps", "0", "--steps", "100000000", "--quiet",
        "--cache-dir", str(tmp_path / "lut"),
    )  # fmt: skip
    deadline = time.monotonic() + 240  # the child imports torch first
    while limits_now(nano) != lowest:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"profile did not lock: {proc.communicate()}")
        time.sleep(0.05)
    [state] = safety.leftover_states(state_dir)
    assert (safety.load_state(state).settings["max-freq-hz"]) == ORIGINAL[1]
    time.sleep(0.3)  # inside the measured steps, sampler thread running
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signum  # dies by the signal, as before
    if signum == signal.SIGTERM:
        assert limits(nano) == ORIGINAL
        assert safety.leftover_states(state_dir) == []
        assert "Traceback" not in err
        return
    assert limits(nano) == lowest  # SIGKILL: nothing could run, the state file stayed
    restore = powerfl("devices", "--restore", "--state-dir", str(state_dir))
    out, err = restore.communicate(timeout=120)
    assert restore.returncode == 0, err
    assert "restored" in out and "jetson" in out
    assert limits(nano) == ORIGINAL
    assert safety.leftover_states(state_dir) == []
