"""`powerfl simulate` refuses bad input before any engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulations.cli import any_node_trained, main


def _fleet(path: Path, n: int) -> Path:
    path.write_text(
        "".join(
            f'[[node]]\nname = "n{i}"\ndevice = "jetson-nano"\np-max-w = 5\n\n' for i in range(n)
        )
    )
    return path


def test_a_fleet_too_large_for_the_data_is_refused_before_training(tmp_path, capsys):
    fleet = _fleet(tmp_path / "fleet.toml", 150)
    rc = main(["simulate", "--fleet", str(fleet), "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "fleet: the 1047 training images cannot be split over 150 nodes" in err
    assert "need 1500 samples, only 1047 available" in err
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "power-aware,fastest"], "method: unknown value 'fastest'"),
        (["-c", "batch-sizes='8,4'"], "batch-sizes"),
        (["--fleet", "no/such/fleet.toml"], "fleet: fleet file not found"),
        (["--model", "vgg"], "model: unknown value 'vgg'"),
    ],
)
def test_bad_settings_name_the_key(tmp_path, capsys, args, message):
    rc = main(["simulate", "--output-dir", str(tmp_path / "runs"), *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_a_run_where_no_node_trained_counts_as_failed():
    assert not any_node_trained({"nodes": {"a": {"rounds-ok": 0, "rounds-failed": 3}}})
    assert not any_node_trained({"nodes": {}})
    assert any_node_trained({"nodes": {"a": {"rounds-ok": 0}, "b": {"rounds-ok": 1}}})
