"""The server's LUT library: one verified LUT per node kind across runs; a corrupt file is
refused, set aside and never returned; an import for another kind is refused, naming what
differs."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_client.devices.descriptors import load_device_spec
from fl_client.devices.simulated import power_w, time_per_sample_s
from fl_client.lut import LUT, KindKey, lut_checksum
from fl_client.model_zoo import train_flops_per_sample
from fl_server.lut_library import LibraryError, LUTLibrary, read_entry

FREQS = (307.2, 614.4, 921.6)


def make_lut(knob_values: tuple[float, ...] = FREQS, **over: Any) -> LUT:
    """A shared LUT of the Nano twin's kind (rows 8…64 over ``knob_values``), with every
    other cell measured: the Nano twin's noiseless numbers for the cnn, so an import checks
    out against the twin (``lut import``); time falls and power rises with b and f."""
    spec = load_device_spec("jetson-nano")
    flops = train_flops_per_sample("cnn", (3, 32, 32))
    sizes = (8, 16, 32, 64)
    measured = (np.arange(4)[:, None] + np.arange(len(knob_values))[None, :]) % 2 == 0
    twin_time = [[time_per_sample_s(spec, b, f, flops) for f in knob_values] for b in sizes]
    twin_peak = [[power_w(spec, b, f, flops) for f in knob_values] for b in sizes]
    time_s = np.where(measured, np.array(twin_time), np.nan)
    peak_w = np.where(measured, np.array(twin_peak), np.nan)
    fields: dict[str, Any] = {
        "device_kind": "jetson-nano",
        "backend": "simulated",
        "model_name": "cnn",
        "input_shape": (3, 32, 32),
        "batch_sizes": sizes,
        "knob_values": knob_values,
        "time_per_sample_s": time_s,
        "peak_power_w": peak_w,
        "avg_power_w": peak_w * 0.9,
        "profile_time_s": 1.25,
        "profile_energy_j": 4.5,
        "grid": "shared",
    }
    return LUT(**{**fields, **over})


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_put_then_get_returns_the_same_lut(tmp_path: Path) -> None:
    library = LUTLibrary(tmp_path / "library")
    lut = make_lut()
    kind = KindKey.of_lut(lut)
    assert library.get(kind) is None  # nothing yet, and no folder made for it
    path = library.put(lut, "fleet-shared")
    assert path == library.path_for(kind) and path.parent == tmp_path / "library"
    got = library.get(kind)
    assert got is not None and lut_checksum(got) == lut_checksum(lut)
    np.testing.assert_array_equal(got.time_per_sample_s, lut.time_per_sample_s)
    entry = read_entry(path)
    assert entry.kind == kind and entry.source == "fleet-shared"
    assert _files(tmp_path / "library") == [path.name]  # no temporary file left behind
    # another kind (other B) is another file; the first is untouched
    other = make_lut(
        batch_sizes=(8, 16, 32),
        time_per_sample_s=lut.time_per_sample_s[:3],
        peak_power_w=lut.peak_power_w[:3],
        avg_power_w=lut.avg_power_w[:3],
    )
    assert library.put(other, "import x.json") != path
    good, bad = library.entries()
    assert sorted(e.kind.label for e in good) == sorted([kind.label, KindKey.of_lut(other).label])
    assert bad == []


def test_a_newer_lut_of_a_kind_replaces_the_old_one(tmp_path: Path) -> None:
    library = LUTLibrary(tmp_path)
    library.put(make_lut(), "fleet-shared")
    newer = make_lut(profile_time_s=9.0)
    library.put(newer, "import board.json")
    got = library.get(KindKey.of_lut(newer))
    assert got is not None and got.profile_time_s == 9.0
    assert len(library.entries()[0]) == 1


def _edit_json(path: Path, change: Any) -> None:
    rec = json.loads(path.read_text())
    change(rec)
    path.write_text(json.dumps(rec))


def _faster(rec: dict[str, Any]) -> None:
    rec["lut"]["time-per-sample-s"][0][0] = 1e-6  # a table edited by hand


def _stale_checksum(rec: dict[str, Any]) -> None:
    rec["lut-sha256"] = "0" * 64


def _no_lut(rec: dict[str, Any]) -> None:
    del rec["lut"]


def _other_version(rec: dict[str, Any]) -> None:
    rec["version"] = 99


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (lambda p: p.write_text('{"format": "powerfl-lut-library", "vers'), "not a readable JSON"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00"), "not a readable JSON"),
        (lambda p: p.write_text("[]"), "not a powerfl-lut-library file"),
        (lambda p: _edit_json(p, _faster), "checksum mismatch"),
        (lambda p: _edit_json(p, _stale_checksum), "checksum mismatch"),
        (lambda p: _edit_json(p, _no_lut), "invalid LUT"),
        (lambda p: _edit_json(p, _other_version), "version 99 is not supported"),
    ],
    ids=["truncated", "binary", "not-an-entry", "edited-table", "stale-sum", "no-lut", "version"],
)
def test_a_corrupt_file_is_refused_set_aside_and_never_returned(
    tmp_path: Path, corrupt: Any, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    library = LUTLibrary(tmp_path)
    lut = make_lut()
    kind = KindKey.of_lut(lut)
    path = library.put(lut, "fleet-shared")
    corrupt(path)
    good, bad = library.entries()  # listing only reports it ...
    assert good == [] and len(bad) == 1 and reason in bad[0]
    assert path.is_file()  # ... and leaves the file where it is
    with caplog.at_level(logging.WARNING, logger="fl_server.lut_library"):
        assert library.get(kind) is None
    assert reason in caplog.text and "the kind is profiled again" in caplog.text
    assert not path.exists()
    (aside,) = _files(tmp_path)
    assert aside.startswith(path.name + ".corrupt-")
    assert library.get(kind) is None  # still nothing: the set-aside file is never read
    assert library.entries() == ([], [])
    # the kind profiled again is kept beside the bad file
    library.put(lut, "fleet-shared")
    again = library.get(kind)
    assert again is not None and lut_checksum(again) == lut_checksum(lut)
    assert len(_files(tmp_path)) == 2


def test_a_valid_entry_of_another_kind_under_this_kinds_name_is_refused(tmp_path: Path) -> None:
    library = LUTLibrary(tmp_path)
    nano = make_lut()
    orin = make_lut(device_kind="jetson-agx-orin")
    wrong = library.put(orin, "fleet-shared")
    # a file copied under the nano kind's name: valid, checksummed, but not the nano's
    wrong.rename(library.path_for(KindKey.of_lut(nano)))
    assert library.get(KindKey.of_lut(nano)) is None
    (aside,) = _files(tmp_path)
    assert ".corrupt-" in aside
    assert library.get(KindKey.of_lut(orin)) is None  # never re-used for its own kind either


def test_a_kind_digest_that_does_not_match_its_lut_is_refused(tmp_path: Path) -> None:
    library = LUTLibrary(tmp_path)
    path = library.put(make_lut(), "fleet-shared")
    _edit_json(path, lambda rec: rec.update({"kind-digest": "0123456789ab"}))
    with pytest.raises(LibraryError, match="kind-digest does not match"):
        read_entry(path)
    assert library.get(KindKey.of_lut(make_lut())) is None


# --------------------------------------------------------------------------- import


def test_import_of_a_plain_lut_file_or_an_entry_of_the_expected_kind(tmp_path: Path) -> None:
    lut = make_lut()
    kind = KindKey.of_lut(lut)
    plain = lut.save(tmp_path / "board.json")
    library = LUTLibrary(tmp_path / "library")
    path, backup = library.import_file(plain, expected=kind)
    assert read_entry(path).source == "import board.json" and backup is None
    got = library.get(kind)
    assert got is not None and lut_checksum(got) == lut_checksum(lut)
    # a library file exported elsewhere imports as well
    other = LUTLibrary(tmp_path / "other")
    assert other.import_file(path, expected=kind) == (other.path_for(kind), None)
    assert other.get(kind) is not None


def test_an_import_that_replaces_an_entry_keeps_the_old_one(tmp_path: Path) -> None:
    lut = make_lut()
    kind = KindKey.of_lut(lut)
    library = LUTLibrary(tmp_path / "library")
    path, _ = library.import_file(lut.save(tmp_path / "first.json"), expected=kind)
    old_text = path.read_text()
    again, backup = library.import_file(lut.save(tmp_path / "second.json"), expected=kind)
    assert again == path and backup is not None
    assert backup.name.startswith(f"{path.name}.replaced-")
    assert backup.read_text() == old_text  # the replaced entry, byte for byte
    assert read_entry(path).source == "import second.json"
    assert [e.path for e in library.entries()[0]] == [path]  # the backup is not an entry


@pytest.mark.parametrize(
    ("over", "named"),
    [
        ({"model_name": "mlp"}, "model-name is 'mlp', expected 'cnn'"),
        ({"input_shape": (1, 28, 28)}, "input-shape is (1, 28, 28), expected (3, 32, 32)"),
        ({"device_kind": "jetson-agx-orin"}, "device-kind is 'jetson-agx-orin', expected"),
        ({"backend": "jetson"}, "backend is 'jetson', expected 'simulated'"),
        ({"knob_values": (307.2, 614.4, 1000.0)}, "freqs-mhz: the frequency tables differ"),
    ],
)
def test_import_of_a_lut_for_another_kind_is_refused_naming_what_differs(
    tmp_path: Path, over: dict[str, Any], named: str
) -> None:
    expected = KindKey.of_lut(make_lut())
    src = make_lut(**over).save(tmp_path / "board.json")
    library = LUTLibrary(tmp_path / "library")
    with pytest.raises(LibraryError, match="a LUT for another kind") as err:
        library.import_file(src, expected=expected)
    assert named in str(err.value) and "board.json" in str(err.value)
    assert not (tmp_path / "library").exists()  # nothing written


def test_import_of_a_lut_for_other_batch_sizes_is_refused(tmp_path: Path) -> None:
    lut = make_lut()
    expected = dataclasses.replace(KindKey.of_lut(lut), batch_sizes=(8, 16, 32, 64, 128))
    with pytest.raises(LibraryError, match=r"batch-sizes is \(8, 16, 32, 64\), expected"):
        LUTLibrary(tmp_path / "library").import_file(lut.save(tmp_path / "b.json"), expected)


def test_import_of_something_that_is_no_lut_says_both_reasons(tmp_path: Path) -> None:
    src = tmp_path / "notes.json"
    src.write_text('{"hello": 1}')
    with pytest.raises(LibraryError, match=r"neither a library file .* nor a LUT file"):
        LUTLibrary(tmp_path / "library").import_file(src)
    # an edited library entry is not smuggled in as a plain LUT either
    entry = LUTLibrary(tmp_path / "a").put(make_lut(), "fleet-shared")
    _edit_json(entry, _faster)
    with pytest.raises(LibraryError, match="checksum mismatch"):
        LUTLibrary(tmp_path / "library").import_file(entry)


def test_an_import_whose_numbers_disagree_with_the_kinds_entry_is_refused(
    tmp_path: Path,
) -> None:
    import dataclasses

    lut = make_lut()
    kind = KindKey.of_lut(lut)
    library = LUTLibrary(tmp_path / "library")
    path, _ = library.import_file(lut.save(tmp_path / "measured.json"), expected=kind)
    wrong = dataclasses.replace(lut, peak_power_w=lut.peak_power_w * 0.5)  # peaks halved
    src = wrong.save(tmp_path / "wrong.json")
    with pytest.raises(LibraryError) as err:
        library.import_file(src, expected=kind)
    msg = str(err.value)
    assert "peak power" in msg and "(-50%), beyond 15%" in msg
    assert f"disagree with the kind's measurements in {path.name}" in msg
    assert read_entry(path).source == "import measured.json"  # the entry is untouched
    close = dataclasses.replace(lut, peak_power_w=lut.peak_power_w * 1.05)  # within 15%
    assert library.import_file(close.save(tmp_path / "close.json"), expected=kind)[1]
    again, backup = library.import_file(src, expected=kind, replace=True)
    assert again == path and backup is not None  # replaced on purpose, the old one kept


@pytest.mark.parametrize(
    ("field", "value", "key"),
    [
        ("device_kind", "../../escaped", "device-kind"),
        ("device_kind", "/tmp/escaped", "device-kind"),
        ("backend", "../escaped", "backend"),
        ("model_name", "../../escaped", "model-name"),
        ("device_kind", "", "device-kind"),
    ],
)
def test_a_kind_with_an_unsafe_name_is_never_written_or_read_outside_the_library(
    tmp_path: Path, field: str, value: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The last guard: a kind whose names came from a hostile node or file builds no path."""
    root = tmp_path / "cache" / "library"
    library = LUTLibrary(root)
    over: dict[str, Any] = {field: value}
    lut = make_lut(**over)
    kind = KindKey.of_lut(lut)
    with pytest.raises(LibraryError, match=f"LUT library: {key}: .* cannot be used as a name"):
        library.path_for(kind)
    with pytest.raises(LibraryError, match=key):
        library.put(lut, "fleet-shared")
    with caplog.at_level(logging.WARNING, logger="fl_server.lut_library"):
        assert library.get(kind) is None
    assert key in caplog.text
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing written anywhere


def test_a_model_name_with_a_slash_keeps_its_file_name(tmp_path: Path) -> None:
    """``org/model`` (a Hub name) was always written as ``org-model``: still allowed."""
    library = LUTLibrary(tmp_path / "library")
    lut = make_lut(model_name="org/model")
    path = library.put(lut, "fleet-shared")
    assert path.parent == tmp_path / "library" and "_org-model_" in path.name
    got = library.get(KindKey.of_lut(lut))
    assert got is not None and lut_checksum(got) == lut_checksum(lut)
