"""Issue 25's path sweep: every path setting of every command, pointed at a file where a
folder is expected, a folder where a file is expected, a place that cannot be written, or
nowhere, gives one line naming the key and exit status 2 before any engine starts (and
before any work whose result the path would hold: profiling, pre-training).

The table is cheap: no engine starts (``engine_starts`` replaces them, and r estimation
too), and every refusal comes before PyTorch trains anything.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from simulations import run
from simulations.cli import main

FLEET = '[[node]]\nname = "a"\ndevice = "jetson-nano"\n{a}\n\n[[node]]\nname = "b"\ndevice = "jetson-nano"\np-max-w = 5\n'  # noqa: E501


@dataclass(frozen=True)
class Places:
    """The kinds of wrong place, under one test's folder."""

    root: Path
    unwritable: Path | None  # a folder this process cannot write into; None: none here

    @property
    def file(self) -> Path:
        return self.root / "a-file"

    @property
    def folder(self) -> Path:
        return self.root / "a-folder"

    @property
    def nowhere(self) -> Path:
        return self.root / "no-such-folder" / "x"

    @property
    def under_file(self) -> Path:
        return self.file / "x"


def _make_unwritable(folder: Path) -> Callable[[], None] | None:
    """Make ``folder`` unwritable for this process; return how to undo it, or None when no
    way works here. Folder permissions do not stop root, so as root the folder is made
    immutable (``chattr +i``, which needs CAP_LINUX_IMMUTABLE and a file system that has
    the flag); either way a real write is tried before the folder counts as unwritable."""
    if os.geteuid() != 0:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)

        def undo() -> None:
            folder.chmod(stat.S_IRWXU)

    else:
        try:
            done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
        except OSError:
            return None
        if done.returncode != 0:
            return None

        def undo() -> None:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True, check=False)

    try:
        (folder / "probe").write_text("x")
    except OSError:
        return undo
    (folder / "probe").unlink()
    undo()
    return None


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Places]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not what was asked for\n")
    (tmp_path / "a-folder").mkdir()
    ro = tmp_path / "read-only"
    ro.mkdir()
    undo = _make_unwritable(ro)
    yield Places(tmp_path, ro if undo is not None else None)
    if undo is not None:
        undo()


def _needs_unwritable(p: Places) -> Path:
    if p.unwritable is None:
        why = "root ignores folder permissions" if os.geteuid() == 0 else "chmod had no effect"
        pytest.skip(f"no unwritable folder here: {why}, and chattr +i is not available")
    return p.unwritable


def _fleet(p: Places, line: str) -> str:
    path = p.root / "f.toml"
    path.write_text(FLEET.format(a=line))
    return str(path)


def _c(key: str, path: Path) -> list[str]:
    return ["-c", f"{key}={json.dumps(str(path))}"]


S = ["simulate", "--methods", "b1"]
Case = tuple[str, Callable[[Places], list[str]], Callable[[Places], str]]


def _output_folder_cases(key: str) -> list[Case]:
    """An output folder setting (written into, created when missing): a file, a path under
    a file, a folder that cannot be written."""
    return [
        (
            f"{key}-file",
            lambda p: [*S, *_c(key, p.file)],
            lambda p: f"{key}: {p.file} is a file, not a folder; give a folder",
        ),
        (
            f"{key}-under-a-file",
            lambda p: [*S, *_c(key, p.under_file)],
            lambda p: f"{key}: cannot create {p.under_file}: {p.file} is a file",
        ),
        (
            f"{key}-unwritable",
            lambda p: [*S, *_c(key, _needs_unwritable(p))],
            lambda p: f"{key}: cannot write into {p.unwritable}: the folder is not writable",
        ),
    ]


#: (id, argv from the places, the start of the message after "error: ")
SIMULATE: list[Case] = [
    *_output_folder_cases("output-dir"),
    *_output_folder_cases("cache-dir"),
    *_output_folder_cases("run-dir"),
]
SIMULATE += [
    (
        "--output-dir-file",
        lambda p: [*S, "--output-dir", str(p.file)],
        lambda p: f"output-dir: {p.file} is a file, not a folder",
    ),
    (
        "fleet-folder",
        lambda p: [*S, "--fleet", str(p.folder)],
        lambda p: f"fleet: is a folder, not a fleet file: {p.folder}",
    ),
    (
        "fleet-nowhere",
        lambda p: [*S, *_c("fleet", p.nowhere)],
        lambda p: f"fleet: fleet file not found: {p.nowhere}",
    ),
    (
        "fleet-not-toml",
        lambda p: [*S, "--fleet", str(p.file)],
        lambda p: f"fleet: {p.file} is not valid TOML",
    ),
    (
        "initial-weights-folder",
        lambda p: [*S, *_c("initial-weights", p.folder)],
        lambda p: f"initial-weights: {p.folder}: is a folder, not a file",
    ),
    (
        "initial-weights-nowhere",
        lambda p: [*S, *_c("initial-weights", p.nowhere)],
        lambda p: f"initial-weights: {p.nowhere}: no such file",
    ),
    (
        "dataset-empty-folder",
        lambda p: [*S, *_c("dataset", p.folder)],
        lambda p: f"dataset: the folder {p.folder} holds no images and no data files",
    ),
    (
        "proxy-dataset-empty-folder",
        lambda p: [*S, *_c("proxy-dataset", p.folder)],
        lambda p: f"proxy-dataset: the folder {p.folder} holds no images and no data files",
    ),
    (
        "replay-table-folder",
        lambda p: [*S, "--fleet", _fleet(p, f'backend = "replay"\nreplay-table = "{p.folder}"')],
        lambda p: f"replay-table: node a: replay-table: is a folder, not a file: {p.folder}",
    ),
    (
        "replay-table-nowhere",
        lambda p: [*S, "--fleet", _fleet(p, f'backend = "replay"\nreplay-table = "{p.nowhere}"')],
        lambda p: f"replay-table: node a: replay-table: file not found: {p.nowhere}",
    ),
    (
        "p-max-schedule-nowhere",
        lambda p: [*S, "--fleet", _fleet(p, f'p-max-schedule = "{p.nowhere}.csv"')],
        lambda p: (
            f"fleet f.toml node #1 (a): p-max-schedule: schedule file not found: {p.nowhere}.csv"
        ),
    ),
    (
        "sysfs-root-file",
        lambda p: [*S, "--fleet", _fleet(p, f'backend = "jetson"\nsysfs-root = "{p.file}"')],
        lambda p: f"sysfs-root: node a: {p.file} is a file, not a folder",
    ),
    (
        "sysfs-root-nowhere",
        lambda p: [*S, "--fleet", _fleet(p, f'backend = "jetson"\nsysfs-root = "{p.nowhere}"')],
        lambda p: f"sysfs-root: node a: {p.nowhere} does not exist",
    ),
    (
        "state-dir-file",
        lambda p: [*S, "--fleet", _fleet(p, f'backend = "jetson"\nstate-dir = "{p.file}"')],
        lambda p: f"state-dir: node a: {p.file} is a file, not a folder",
    ),
    (
        "state-dir-unwritable",
        lambda p: [
            *S,
            "--fleet",
            _fleet(p, f'backend = "jetson"\nstate-dir = "{_needs_unwritable(p)}"'),
        ],
        lambda p: f"state-dir: node a: cannot write into {p.unwritable}: the folder is not",
    ),
]


@pytest.mark.parametrize(
    ("argv", "message"), [c[1:] for c in SIMULATE], ids=[c[0] for c in SIMULATE]
)
def test_a_run_path_setting_at_the_wrong_place_exits_2_before_any_engine(
    places: Places,
    engine_starts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: Callable[[Places], list[str]],
    message: Callable[[Places], str],
) -> None:
    monkeypatch.setattr(run, "estimate_r_before_start", lambda s: engine_starts.append("r"))
    rc = main(argv(places))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"powerfl: error: {message(places)}"), err
    assert len(err.strip().splitlines()) == 1
    assert engine_starts == []
    assert not (places.root / "runs").exists()


@pytest.mark.parametrize("kind", ["file", "nowhere"])
def test_a_device_folder_or_flower_home_at_the_wrong_place_exits_2(
    places: Places,
    engine_starts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    path = places.file if kind == "file" else places.nowhere
    monkeypatch.setenv("POWERFL_CONFIG_DIR", str(path))
    assert main(S) == 2
    what = "is a file, not a folder" if kind == "file" else "does not exist"
    assert capsys.readouterr().err.startswith(f"powerfl: error: POWERFL_CONFIG_DIR: {path} {what}")
    monkeypatch.delenv("POWERFL_CONFIG_DIR")
    if kind == "file":  # the in-process engine's Flower writes into $FLWR_HOME
        monkeypatch.setenv("FLWR_HOME", str(path))
        assert main([*S, "--engine", "in-process"]) == 2
        assert capsys.readouterr().err.startswith(
            f"powerfl: error: FLWR_HOME: {path} is a file, not a folder"
        )
    assert engine_starts == []


def _lut(library: Path, *argv: str) -> list[str]:
    return ["lut", "--library", str(library), *argv]


P = ["pretrain", "--model", "cnn", "--dataset", "digits", "--epochs", "1", "--out"]
PROFILE = ["profile", "--model", "cnn", "--backend", "simulated", "--device", "jetson-nano"]
PROFILE += ["--batch-sizes", "4", "--quiet"]
OTHER: list[Case] = [
    (
        "lut-library-file",
        lambda p: _lut(p.file, "list"),
        lambda p: f"powerfl: error: --library: {p.file} is a file, not a folder",
    ),
    (
        "lut-library-nowhere",
        lambda p: _lut(p.nowhere, "list"),
        lambda p: f"powerfl: error: --library: {p.nowhere} does not exist; give the library folder",
    ),
    (
        "lut-import-into-unwritable-library",
        lambda p: _lut(_needs_unwritable(p), "import", str(p.file), "--device", "jetson-nano"),
        lambda p: f"powerfl: error: --library: cannot write into {p.unwritable}",
    ),
    (
        "lut-import-a-folder",
        lambda p: _lut(p.root / "lib", "import", str(p.folder), "--device", "jetson-nano"),
        lambda p: f"powerfl: error: file: {p.folder}: is a folder, not a file; give a LUT",
    ),
    (
        "lut-import-nowhere",
        lambda p: _lut(p.root / "lib", "import", str(p.nowhere), "--device", "jetson-nano"),
        lambda p: f"powerfl: error: file: {p.nowhere}: no such file; give a LUT",
    ),
    (
        "lut-export-onto-a-folder",
        lambda p: _lut(p.folder, "export", "x", str(p.folder)),
        lambda p: f"powerfl: error: out: {p.folder} is a folder; give the file to write",
    ),
    (
        "lut-export-into-unwritable",
        lambda p: _lut(p.folder, "export", "x", str(_needs_unwritable(p) / "x.json")),
        lambda p: f"powerfl: error: out: cannot write into {p.unwritable}",
    ),
    (
        "pretrain-out-folder",
        lambda p: [*P, str(p.folder)],
        lambda p: f"powerfl: error: --out: {p.folder} is a folder; give the file to write",
    ),
    (
        "pretrain-out-under-a-file",
        lambda p: [*P, str(p.under_file)],
        lambda p: f"powerfl: error: --out: {p.file} is a file, not a folder",
    ),
    (
        "pretrain-out-unwritable",
        lambda p: [*P, str(_needs_unwritable(p) / "w.safetensors")],
        lambda p: f"powerfl: error: --out: cannot write into {p.unwritable}",
    ),
    (
        "profile-out-folder",
        lambda p: [*PROFILE, "--out", str(p.folder)],
        lambda p: f"powerfl profile: error: --out: {p.folder} is a folder",
    ),
    (
        "profile-replay-out-unwritable",
        lambda p: [*PROFILE, "--replay-out", str(_needs_unwritable(p) / "t.csv")],
        lambda p: f"powerfl profile: error: --replay-out: cannot write into {p.unwritable}",
    ),
    (
        "profile-cache-dir-file",
        lambda p: [*PROFILE, "--cache-dir", str(p.file)],
        lambda p: f"powerfl profile: error: --cache-dir: {p.file} is a file, not a folder",
    ),
    (
        "select-lut-folder",
        lambda p: ["select", "--lut", str(p.folder), "--p-max-w", "5", "--r", "1"],
        lambda p: f"powerfl select: error: lut: {p.folder}: is a folder, not a file",
    ),
    (
        "select-lut-nowhere",
        lambda p: ["select", "--lut", str(p.nowhere), "--p-max-w", "5", "--r", "1"],
        lambda p: f"powerfl select: error: lut: {p.nowhere}: no such file",
    ),
    (
        "experiment-file-folder",
        lambda p: ["experiment", "run", str(p.folder)],
        lambda p: f"powerfl experiment: error: {p.folder}: is a folder, not an experiment file",
    ),
    (
        "experiment-file-nowhere",
        lambda p: ["experiment", "run", str(p.nowhere)],
        lambda p: f"powerfl experiment: error: {p.nowhere}: experiment file not found",
    ),
    (
        "experiment-out-file",
        lambda p: ["experiment", "run", "single-device", "--out", str(p.file)],
        lambda p: f"powerfl experiment: error: --out: {p.file} is a file, not a folder",
    ),
    (
        "experiment-out-under-a-file",
        lambda p: ["experiment", "run", "single-device", "--out", str(p.under_file)],
        lambda p: f"powerfl experiment: error: --out: cannot create {p.under_file}: {p.file} is",
    ),
    (
        "experiment-out-unwritable",
        lambda p: ["experiment", "run", "single-device", "--out", str(_needs_unwritable(p))],
        lambda p: f"powerfl experiment: error: --out: cannot write into {p.unwritable}",
    ),
    (
        "experiment-report-nowhere",
        lambda p: ["experiment", "report", str(p.nowhere)],
        lambda p: f"powerfl experiment: error: {p.nowhere}: no manifest.json",
    ),
    (
        "experiment-report-file",
        lambda p: ["experiment", "report", str(p.file)],
        lambda p: (
            f"powerfl experiment: error: {p.file} is a file, not a folder; a report takes "
            "the study's output folder"
        ),
    ),
    (
        "devices-restore-state-dir-file",
        lambda p: ["devices", "--restore", "--state-dir", str(p.file)],
        lambda p: f"devices --restore: state directory {p.file} (--state-dir) is not a directory",
    ),
]


@pytest.mark.parametrize(("argv", "message"), [c[1:] for c in OTHER], ids=[c[0] for c in OTHER])
def test_a_command_path_at_the_wrong_place_exits_2_before_any_work(
    places: Places,
    capsys: pytest.CaptureFixture[str],
    argv: Callable[[Places], list[str]],
    message: Callable[[Places], str],
) -> None:
    before = sorted(p.name for p in places.root.iterdir())
    rc = main(argv(places))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(message(places)), err
    assert "Traceback" not in err
    # nothing made: no output folder, checkpoint, LUT or cache where the command ran
    assert sorted(p.name for p in places.root.iterdir() if p.name != "f.toml") == before
