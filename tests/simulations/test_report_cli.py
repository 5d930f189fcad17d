"""``powerfl report RUN [RUN …]`` and the pictures at the end of ``powerfl simulate``
(``simulations.report_cli``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fl_client.files import RUN_LOCK
from simulations import report_cli
from simulations.cli import main
from simulations.report import load_run
from simulations.report_cli import print_simulate_pictures, run_labels
from tests.simulations.test_report import fabricated_run, fedbuff_run
from tests.simulations.test_report_plots import png_size

PA, B1 = "20261129-020000-power-aware", "20261129-020500-b1"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_report_of_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fabricated_run(tmp_path / "runs" / PA)
    before = _files(run)
    out = tmp_path / "pictures"
    assert main(["report", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("timeline.png", "progress.png"):
        assert png_size(out / PA / name)[0] > 500
        assert str(out / PA / name) in printed
    assert not (out / "comparison.png").exists()
    assert _files(run) == before  # the run folder is only read
    s = load_run(run).summary
    row = next(line for line in printed.splitlines() if PA[:12] in line and "│" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1:4] == ["power-aware", "3", "3"]
    assert float(cells[4]) == pytest.approx(s["sim-time-to-target-s"], abs=0.05)
    assert cells[7] == f"{100 * s['profile-share']:.1f}%"


@pytest.mark.usefixtures("flower_task_identity")
def test_report_of_a_fedbuff_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fedbuff_run(tmp_path / "runs" / "20261129-021000-power-aware", target=0.3)
    before = _files(run)
    out = tmp_path / "pictures"
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("timeline.png", "progress.png"):
        assert png_size(out / run.name / name)[0] > 500
        assert str(out / run.name / name) in printed
    assert _files(run) == before
    s = load_run(run).summary
    row = next(line for line in printed.splitlines() if run.name[:12] in line and "│" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1:4] == ["power-aware (fedbuff)", str(s["versions"]), str(s["round-to-target"])]
    assert "fedbuff: rounds are global versions" in printed
    assert float(cells[4]) == pytest.approx(s["sim-time-to-target-s"], abs=0.05)


def test_report_of_two_runs_compares_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pa = fabricated_run(tmp_path / "a" / PA)
    b1 = fabricated_run(tmp_path / "b" / B1, method="b1", slower=1.3)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(pa), str(b1)]) == 0  # --out: report in the current folder
    printed = capsys.readouterr().out
    out = tmp_path / "report"
    assert png_size(out / "comparison.png")[0] > 500
    for name in (PA, B1):
        assert {p.name for p in (out / name).iterdir()} == {"timeline.png", "progress.png"}
    rows = [line for line in printed.splitlines() if "│" in line and "run" not in line]
    assert [r.split("│")[1].strip() for r in rows] == [PA, B1]
    assert [r.split("│")[4].strip() for r in rows] == ["3", "-"]  # b1 missed the target


def test_runs_of_the_same_name_are_told_apart(tmp_path: Path) -> None:
    a = load_run(fabricated_run(tmp_path / "machine-a" / PA))
    b = load_run(fabricated_run(tmp_path / "machine-b" / PA))
    c = load_run(fabricated_run(tmp_path / "machine-b" / B1, method="b1"))
    assert run_labels([a, b, c]) == [f"machine-a/{PA}", f"machine-b/{PA}", B1]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nope", "no such folder"),
        (lambda p: _empty(p), "not a run folder, it has no summary.json"),
        (lambda p: _in_progress(p), "still in progress"),
        (lambda p: _without(p, "rounds.jsonl"), "has summary.json but no rounds.jsonl"),
    ],
    ids=["missing", "not-a-run", "in-progress", "no-rounds"],
)
def test_bad_run_folders_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make, message: str
) -> None:
    good = fabricated_run(tmp_path / "good")
    bad = make(tmp_path / "bad")
    out = tmp_path / "out"
    assert main(["report", str(good), str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("powerfl: error: run folder ") and message in err
    assert str(bad.absolute()) in err
    assert not out.exists()  # every folder is read before anything is drawn


def _empty(folder: Path) -> Path:
    folder.mkdir()
    return folder


def _in_progress(folder: Path) -> Path:
    run = fabricated_run(folder)
    (run / "summary.json").unlink()
    (run / RUN_LOCK).write_text(f"{os.getpid()} 2026-11-29T02:00:00+00:00\n")
    return run


def _without(folder: Path, name: str) -> Path:
    run = fabricated_run(folder)
    (run / name).unlink()
    return run


def test_a_run_given_twice_or_an_out_that_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = fabricated_run(tmp_path / "run")
    assert main(["report", str(run), str(tmp_path / "." / "run")]) == 2
    assert "names the run folder" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["report", str(run), "--out", str(tmp_path / "file")]) == 2
    assert "--out: " in capsys.readouterr().err


def test_an_interrupted_report_says_where_its_pictures_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = fabricated_run(tmp_path / PA)

    def interrupted(*args: object, **kw: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(report_cli, "draw_progress", interrupted)
    out = tmp_path / "out"
    fabricated_run(tmp_path / B1, method="b1")
    assert main(["report", str(run), str(tmp_path / B1), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"powerfl report: interrupted; the pictures drawn so far are in {out}" in err
    assert (out / PA / "timeline.png").is_file()  # drawn before the comparison was stopped


# ------------------------------------------------------------------ at the end of simulate


def test_simulate_draws_every_method_into_each_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pa = fabricated_run(tmp_path / PA)
    b1 = fabricated_run(tmp_path / B1, method="b1", slower=1.3)
    print_simulate_pictures([{"run-dir": str(pa)}, {"run-dir": str(b1)}])
    printed = capsys.readouterr().out
    for name in ("timeline.png", "progress.png"):
        assert (pa / name).read_bytes() == (b1 / name).read_bytes()
        assert f"{name[:-4]:<12} {pa / name}" in printed
    assert png_size(pa / "timeline.png")[1] > png_size(pa / "progress.png")[1]  # two panels


def test_a_picture_that_cannot_be_drawn_costs_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _without(tmp_path / "run", "nodes.jsonl")
    print_simulate_pictures([{"run-dir": str(run)}])  # no exception: the run is recorded
    captured = capsys.readouterr()
    assert "powerfl: warning: the run's pictures were not drawn" in captured.err
    assert "no nodes.jsonl" in captured.err and "powerfl report RUN" in captured.err
    assert not (run / "timeline.png").exists()
