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
    assert "fleet: the 1047 training images of digits cannot be split over 150 nodes" in err
    assert "need 1500 samples, only 1047 available" in err
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "power-aware,fastest"], "method: unknown value 'fastest'"),
        (["-c", "batch-sizes='8,4'"], "batch-sizes"),
        (["--fleet", "no/such/fleet.toml"], "fleet: fleet file not found"),
        (["--model", "vgg"], "model: unknown value 'vgg'"),
        (["-c", "dataset='no/such/data.npz'"], "dataset"),
        (["-c", "dataset=''"], "dataset: must be a dataset name"),
        (["-c", "partitioning='shards'"], "partitioning: unknown value 'shards'"),
        (
            ["-c", "partitioning='pathological'", "-c", "classes-per-node=11"],
            "classes-per-node",
        ),
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


def test_the_split_is_shown_per_node_before_the_engine_starts(tmp_path):
    from fl_client.settings import RunSettings
    from simulations.run import check_partitions

    settings = RunSettings.from_config({"partitioning": "iid"})
    split = check_partitions(settings, 3, ["a", "b", "c"])
    lines = split.lines()
    assert lines[0].startswith("data split of digits over 3 nodes: iid")
    assert [line.split()[0] for line in lines[1:]] == ["a", "b", "c"]
    assert sum(split.sizes()) <= 1047
    short = check_partitions(settings, 40, [f"n{i}" for i in range(40)]).lines(most=5)
    assert len(short) == 7 and "and 35 more nodes" in short[-1]
    assert [p.name for p in split.save(tmp_path)] == ["split.json", "split.png"]
