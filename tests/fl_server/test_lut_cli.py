"""``powerfl lut list | export | import`` (``fl_server.lut_cli``) on a parser built from
``add_lut_commands``: ship a table profiled on one board to another server's library."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from fl_client.devices.descriptors import load_device_spec
from fl_client.lut import KindKey, lut_checksum
from fl_client.settings import SettingsError
from fl_server.lut_cli import add_lut_commands
from fl_server.lut_library import LUTLibrary
from tests.fl_server.test_lut_library import make_lut

NANO_FREQS = tuple(load_device_spec("jetson-nano").gpu_freqs_mhz)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="powerfl")
    add_lut_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def lut_cmd(*argv: str) -> int:
    args = _parser().parse_args(["lut", *argv])
    return int(args.func(args))


def _import_args(library: Path, src: Path) -> list[str]:
    base = ["--library", str(library), "import", str(src), "--device", "jetson-nano"]
    return [*base, "--backend", "simulated", "--model", "cnn", "--batch-sizes", "8,16,32,64"]


def test_list_of_an_empty_library_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert lut_cmd("--library", str(tmp_path / "empty"), "list") == 0
    assert "is empty" in capsys.readouterr().out


def test_a_typed_library_that_does_not_exist_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in ``--library`` must not list an empty library and succeed."""
    from simulations.cli import main

    missing = tmp_path / "no-such-library"
    for command in (["list"], ["export", "jetson-nano", str(tmp_path / "x.json")]):
        assert main(["lut", "--library", str(missing), *command]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert err[0].startswith("powerfl: error: --library: ") and str(missing) in err[0]
        assert "does not exist" in err[0]
    assert not missing.exists()  # reading made nothing


def test_the_default_library_may_be_missing_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert lut_cmd("list") == 0
    assert "is empty" in capsys.readouterr().out


def test_import_list_export_ship_a_table_to_another_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lut = make_lut(NANO_FREQS)
    src = lut.save(tmp_path / "board.json")
    lib_a, lib_b = tmp_path / "a", tmp_path / "b"
    assert lut_cmd(*_import_args(lib_a, src)) == 0
    assert "imported" in capsys.readouterr().out
    kind = KindKey.of_lut(lut)
    assert lut_cmd("--library", str(lib_a), "list") == 0
    listed = capsys.readouterr().out
    assert kind.label in listed and f"{lut.cells_profiled} cells" in listed
    assert "from import board.json" in listed
    out = tmp_path / "ship" / "nano.json"
    assert lut_cmd("--library", str(lib_a), "export", "jetson-nano/simulated", str(out)) == 0
    assert out.is_file()
    assert lut_cmd(*_import_args(lib_b, out)) == 0
    shipped = LUTLibrary(lib_b).get(kind)
    assert shipped is not None and lut_checksum(shipped) == lut_checksum(lut)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--model", "resnet18"], "model-name is 'cnn', expected 'resnet18'"),
        (["--batch-sizes", "8,16,32"], "batch-sizes is (8, 16, 32, 64), expected (8, 16, 32)"),
        (["--device", "jetson-agx-orin"], "device-kind is 'jetson-nano', expected"),
        (["--backend", "jetson"], "backend is 'simulated', expected 'jetson'"),
    ],
)
def test_import_for_another_kind_is_refused_naming_what_differs(
    tmp_path: Path, argv: list[str], named: str
) -> None:
    src = make_lut(NANO_FREQS).save(tmp_path / "board.json")
    library = tmp_path / "library"
    with pytest.raises(SettingsError, match=r"lut import: .*a LUT for another kind") as err:
        lut_cmd(*_import_args(library, src), *argv)
    assert named in str(err.value)
    assert LUTLibrary(library).entries() == ([], [])


def test_import_checks_the_input_shape_against_the_models(tmp_path: Path) -> None:
    src = make_lut(NANO_FREQS, input_shape=(1, 28, 28)).save(tmp_path / "board.json")
    with pytest.raises(
        SettingsError, match=r"input-shape is \(1, 28, 28\), expected \(3, 32, 32\)"
    ):
        lut_cmd(*_import_args(tmp_path / "library", src))


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--model", "resnet-9000"], "--model: unknown model 'resnet-9000'"),
        (["--device", "jetson-nono"], "--device: "),
        (["--batch-sizes", "16,8"], "batch-sizes: must be strictly ascending"),
    ],
)
def test_import_with_a_bad_option_names_it(tmp_path: Path, argv: list[str], named: str) -> None:
    src = make_lut(NANO_FREQS).save(tmp_path / "board.json")
    with pytest.raises(SettingsError, match=named):
        lut_cmd(*_import_args(tmp_path / "library", src), *argv)


def test_list_names_a_corrupt_file_and_fails_export_never_ships_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    library = LUTLibrary(tmp_path / "library")
    path = library.put(make_lut(NANO_FREQS), "fleet-shared")
    path.write_text(path.read_text().replace('"steps": 3', '"steps": 4'))
    assert lut_cmd("--library", str(library.root), "list") == 1
    assert "refused:" in capsys.readouterr().err
    assert path.is_file()  # listing leaves it alone
    with pytest.raises(SettingsError, match="matches 0 entries"):
        lut_cmd("--library", str(library.root), "export", "jetson-nano", str(tmp_path / "x.json"))
    assert not (tmp_path / "x.json").exists()


def test_export_of_an_ambiguous_kind_names_the_candidates(tmp_path: Path) -> None:
    library = LUTLibrary(tmp_path / "library")
    lut = make_lut(NANO_FREQS)
    library.put(lut, "fleet-shared")
    small = make_lut(
        NANO_FREQS,
        batch_sizes=(8, 16, 32),
        time_per_sample_s=lut.time_per_sample_s[:3],
        peak_power_w=lut.peak_power_w[:3],
        avg_power_w=lut.avg_power_w[:3],
    )
    library.put(small, "fleet-shared")
    with pytest.raises(SettingsError, match="matches 2 entries") as err:
        lut_cmd("--library", str(library.root), "export", "jetson-nano", str(tmp_path / "x.json"))
    assert KindKey.of_lut(lut).label in str(err.value)
    assert KindKey.of_lut(small).label in str(err.value)
    out = tmp_path / "x.json"
    assert (
        lut_cmd("--library", str(library.root), "export", "cnn-3x32x32/b8-16-32-64", str(out)) == 0
    )
    assert out.is_file()


def test_the_library_defaults_to_simulates_cache_and_typed_paths_follow_the_cwd(
    tmp_path, monkeypatch
):
    from fl_server.lut_cli import library_dir

    monkeypatch.chdir(tmp_path)
    assert library_dir(None) == tmp_path / ".powerfl-cache" / "library"
    assert library_dir("lib") == tmp_path / "lib"


def test_import_and_export_refuse_a_library_that_is_a_file_or_read_only_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_lut(NANO_FREQS).save(tmp_path / "board.json")
    a_file = tmp_path / "lib.json"
    a_file.write_text("{}")
    with pytest.raises(SettingsError, match=r"--library: .*lib\.json is a file, not a folder"):
        lut_cmd(*_import_args(a_file, src))
    with pytest.raises(SettingsError, match=r"--library: .*lib\.json is a file, not a folder"):
        lut_cmd("--library", str(a_file), "export", "jetson-nano", str(tmp_path / "x.json"))
    library = tmp_path / "library"
    assert lut_cmd(*_import_args(library, src)) == 0
    with pytest.raises(SettingsError, match=r"out: .* is a folder; give the file to write"):
        lut_cmd("--library", str(library), "export", "jetson-nano", str(tmp_path))
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = __import__("os").access
    # root may write anywhere: the check's answer comes from os.access, faked for `locked`
    monkeypatch.setattr(
        "fl_client.settings.os.access",
        lambda path, mode: False if Path(path) == locked else real_access(path, mode),
    )
    with pytest.raises(SettingsError, match=r"out: cannot write into .*locked.*not writable"):
        lut_cmd("--library", str(library), "export", "jetson-nano", str(locked / "x.json"))
    with pytest.raises(SettingsError, match=r"--library: cannot write into .*locked"):
        lut_cmd(*_import_args(locked, src))


def test_an_import_over_an_entry_says_where_the_old_one_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_lut(NANO_FREQS).save(tmp_path / "board.json")
    library = tmp_path / "library"
    assert lut_cmd(*_import_args(library, src)) == 0
    assert "replaced" not in capsys.readouterr().out
    assert lut_cmd(*_import_args(library, src)) == 0
    out = capsys.readouterr().out
    assert "it replaced an entry of the same kind, kept as " in out
    assert len(list(library.glob("*.replaced-*"))) == 1


@pytest.mark.parametrize(
    ("scale", "table", "message"),
    [
        (1e3, "peak_power_w", "cell (b=8, f=76.8 MHz) peak power {v} W against the jetson-nano "
         "twin's {m} W (1e+03×), beyond the 2× either way"),  # mW written as W
        (0.3, "peak_power_w", "cell (b=8, f=76.8 MHz) peak power {v} W is below the board's "
         "idle power 1.25 W"),
        (1e-3, "time_per_sample_s", "cell (b=8, f=76.8 MHz) time per sample {v} s against the "
         "jetson-nano twin's {m} s (0.001×), beyond the 4× either way"),  # ms read as s
    ],
)  # fmt: skip
def test_import_without_a_library_entry_checks_the_numbers_against_the_kinds_twin(
    tmp_path: Path, scale: float, table: str, message: str
) -> None:
    """No entry of the kind to compare with: the kind's twin bounds each cell, so a table
    whose numbers are grossly wrong is refused at import, not after a round over the cap."""
    good = make_lut(NANO_FREQS)
    values = getattr(good, table)
    bad = dataclasses.replace(good, **{table: values * scale})
    src = bad.save(tmp_path / "board.json")
    library = tmp_path / "library"
    with pytest.raises(SettingsError) as err:
        lut_cmd(*_import_args(library, src))
    v, m = float(values[0, 0]) * scale, float(values[0, 0])
    assert str(err.value).startswith(f"lut import: {src}: ")
    assert message.format(v=f"{v:.4g}", m=f"{m:.4g}") in str(err.value)
    assert "give --replace to import it anyway" in str(err.value)
    assert not library.exists() or not list(library.glob("*.json"))
    assert lut_cmd(*_import_args(library, src), "--replace") == 0  # the operator's call
    assert len(list(library.glob("*.json"))) == 1


def test_a_kind_without_a_twin_has_no_numbers_to_check_against(tmp_path: Path) -> None:
    """A device kind with no descriptor (no twin): only the kind itself is checked."""
    from fl_server.lut_cli import _twin

    kind = KindKey.of_lut(make_lut(NANO_FREQS))
    assert _twin(kind) is not None
    assert _twin(dataclasses.replace(kind, device_kind="jetson-thor")) is None
