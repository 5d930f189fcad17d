"""What is checked before a simulation's engine starts (``fl_client.preflight``): the fleet
against the run settings, the folders a run writes, the device files and replay tables, the
methods against the nodes' caps; all without PyTorch or Flower."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fl_client.devices.simulated import load_device_spec
from fl_client.preflight import check_before_start, check_writable_dir
from fl_client.settings import (
    MIN_ROUND_TIMEOUT_S,
    REPO_ROOT,
    RunSettings,
    SettingsError,
    fleet_buffer_size,
    load_fleet,
)
from fl_client.shipped import shipped_dir

ORIN6 = 'name = "orin-6w"\ndevice = "jetson-orin-nano"\np-max-w = 6.0'


def _fleet(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(f"[[node]]\n{e}\n" for e in entries))
    return path


NANO = 'name = "nano"\ndevice = "jetson-nano"\np-max-w = 5'
ORIN = 'name = "orin"\ndevice = "jetson-orin-nano"\np-max-w = "none"'


def _check(tmp_path: Path, fleet: Path, **overrides: object) -> None:
    cfg = {
        "fleet": str(fleet),
        "output-dir": str(tmp_path / "runs"),
        "cache-dir": str(tmp_path / "cache"),
        **{k.replace("_", "-"): v for k, v in overrides.items()},
    }
    settings = RunSettings.from_config(cfg)
    check_before_start(settings, load_fleet(settings.fleet))


def test_a_good_run_passes(tmp_path: Path) -> None:
    _check(tmp_path, _fleet(tmp_path, NANO, ORIN))


# ------------------------------------------------------------------------ the hang (§2)


def test_the_default_min_train_nodes_with_a_one_node_fleet_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, _fleet(tmp_path, NANO))
    assert str(err.value).startswith(
        "min-train-nodes: 2, but the fleet (fleet.toml) has 1 node: every round would wait"
    )
    assert "set min-train-nodes to at most 1" in str(err.value)
    _check(tmp_path, _fleet(tmp_path, NANO), min_train_nodes=1)


def test_min_train_nodes_above_the_fleet_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"min-train-nodes: 3, but .* has 2 nodes"):
        _check(tmp_path, _fleet(tmp_path, NANO, ORIN), min_train_nodes=3)


def test_a_fedbuff_buffer_larger_than_the_fleet_is_refused(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, NANO, ORIN)
    with pytest.raises(SettingsError, match=r"buffer-size: 4, but the fleet .* has 2 nodes"):
        _check(tmp_path, fleet, aggregation="fedbuff", buffer_size=4)
    _check(tmp_path, fleet, aggregation="fedbuff", buffer_size=2)


def test_buffer_sizes_default_takes_a_smaller_fleets_size(tmp_path: Path) -> None:
    """The default (3) on a 2-node fleet: K = 2, so the default run works on two boards."""
    fleet = _fleet(tmp_path, NANO, ORIN)
    _check(tmp_path, fleet, aggregation="fedbuff", buffer_size=3)
    assert fleet_buffer_size(3, 2) == 2 and fleet_buffer_size(3, 8) == 3
    assert fleet_buffer_size(4, 2) == 4  # refused where the fleet is known (above)


# ----------------------------------------------------------------------- timeouts, dirs


@pytest.mark.parametrize("timeout", [0.5, 5, MIN_ROUND_TIMEOUT_S - 1])
def test_a_round_timeout_too_short_to_be_meant_is_refused(tmp_path: Path, timeout: float) -> None:
    with pytest.raises(SettingsError, match=f"round-timeout-s: {timeout:g} s is too short"):
        _check(tmp_path, _fleet(tmp_path, NANO, ORIN), round_timeout_s=timeout)
    _check(tmp_path, _fleet(tmp_path, NANO, ORIN), round_timeout_s=MIN_ROUND_TIMEOUT_S)


@pytest.mark.parametrize("key", ["output-dir", "cache-dir"])
def test_a_directory_that_is_a_file_is_refused(tmp_path: Path, key: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    fleet = _fleet(tmp_path, NANO, ORIN)
    with pytest.raises(SettingsError, match=f"{key}: {re.escape(str(blocker))} is a file"):
        _check(tmp_path, fleet, **{key.replace("-", "_"): str(blocker)})
    under = blocker / "sub" / "dir"
    with pytest.raises(SettingsError, match=f"{key}: cannot create .*: .* is a file"):
        _check(tmp_path, fleet, **{key.replace("-", "_"): str(under)})


def test_a_read_only_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # root may write anywhere: the check's answer comes from os.access, faked here
    monkeypatch.setattr("fl_client.preflight.os.access", lambda path, mode: False)
    with pytest.raises(SettingsError, match=r"output-dir: cannot write into .*not writable"):
        check_writable_dir(tmp_path / "runs", "output-dir")


def test_a_missing_directory_under_a_writable_one_is_fine(tmp_path: Path) -> None:
    assert check_writable_dir(tmp_path / "a" / "b", "cache-dir") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checking creates nothing


# ------------------------------------------------------------------------------ fixed


def test_fixed_batch_size_must_be_in_b(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="fixed-batch-size: 33 is not one of batch-sizes 4,8"):
        _check(
            tmp_path,
            _fleet(tmp_path, NANO, ORIN),
            method="fixed",
            fixed_batch_size=33,
            fixed_freq_mhz=306,
        )


def test_fixed_frequency_must_be_in_every_twins_table(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, NANO, ORIN)
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, fleet, method="fixed", fixed_batch_size=32, fixed_freq_mhz=460.8)
    # the Nano has 460.8 MHz, the Orin Nano does not: the error names the node and its table
    assert "fixed-freq-mhz: 460.8 MHz is not in the frequency table of node orin" in str(err.value)
    orin = load_device_spec("jetson-orin-nano").gpu_freqs_mhz
    assert f"its frequencies: {orin[0]:g}, {orin[1]:g}" in str(err.value)
    nanos = _fleet(tmp_path, NANO, 'name = "nano-2"\ndevice = "jetson-nano"')
    _check(tmp_path, nanos, method="fixed", fixed_batch_size=32, fixed_freq_mhz=460.8)


def test_fixed_frequency_of_a_hardware_node_is_left_to_the_node(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 'name = "j"\ndevice = "jetson-nano"\nbackend = "jetson"', NANO)
    _check(tmp_path, fleet, method="fixed", fixed_batch_size=32, fixed_freq_mhz=460.8)


def test_checking_settings_imports_neither_torch_nor_flower() -> None:
    code = (
        "import sys\n"
        "from fl_client.preflight import check_before_start\n"
        "from fl_client.settings import RunSettings, load_fleet\n"
        "s = RunSettings.from_config({'model': 'resnet18'})\n"
        "check_before_start(s, load_fleet(s.fleet))\n"
        "print(sorted(m for m in ('torch', 'flwr', 'torchvision') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------- device files, replay tables


def test_every_nodes_device_file_invalid_is_one_clear_error_before_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "devices"
    folder.mkdir()
    for spec in shipped_dir("devices").glob("*.toml"):
        (folder / spec.name).write_text(spec.read_text())
    nano = folder / "jetson-nano.toml"
    nano.write_text(nano.read_text().replace("[power]", "[power]\nidle-watts = 1"))
    monkeypatch.setenv("POWERFL_CONFIG_DIR", str(folder))
    fleet = _fleet(tmp_path, NANO, 'name = "nano-2"\ndevice = "jetson-nano"')
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, fleet)
    msg = str(err.value)
    assert msg.startswith("device: node nano (jetson-nano): ")
    assert "jetson-nano.toml" in msg and "idle-watts: unknown key" in msg


def test_a_replay_table_that_does_not_read_is_refused_before_start(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("this,is,not\na,replay,table\n")
    fleet = _fleet(
        tmp_path,
        NANO,
        'name = "r"\ndevice = "jetson-nano"\nbackend = "replay"\n'
        'replay-table = "bad.csv"\np-max-w = 5',
    )
    with pytest.raises(SettingsError, match=r"^replay-table: node r: .*bad\.csv"):
        _check(tmp_path, fleet)


# --------------------------------------------------------------- methods against nodes


@pytest.mark.parametrize("method", ["b1", "b2"])
def test_a_band_method_below_a_nodes_lowest_band_names_node_and_choices(
    tmp_path: Path, method: str
) -> None:
    fleet = _fleet(tmp_path, NANO, ORIN6)
    with pytest.raises(SettingsError) as err:
        _check(tmp_path, fleet, method=method)
    msg = str(err.value)
    assert f"method: {method} cannot serve 1 node(s): orin-6w (jetson-orin-nano, cap 6 W <" in msg
    assert "its lowest band 7 W" in msg
    assert f"drop {method}" in msg and "raise the node's cap" in msg
    assert "-c allow-untrained-nodes=true" in msg
    _check(tmp_path, fleet, method=method, **{"allow-untrained-nodes": True})  # accepted
    _check(tmp_path, fleet, method="power-aware")  # the method that can serve it


def test_a_schedule_step_below_the_band_counts_too(tmp_path: Path) -> None:
    fleet = _fleet(
        tmp_path, NANO, 'name = "o"\ndevice = "jetson-orin-nano"\np-max-schedule = "1:15,3:6.5"'
    )
    with pytest.raises(SettingsError, match=r"o \(jetson-orin-nano, cap 6\.5 W < its lowest"):
        _check(tmp_path, fleet, method="b1")
