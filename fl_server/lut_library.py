"""The server's LUT library: one shared LUT per node kind, kept across runs and fleets.

A library file holds one LUT (``grid="shared"``, or any grid an operator imports) with the
kind it serves and a SHA-256 checksum of the LUT's content. A file that does not parse, whose
checksum does not match or whose kind is not the one asked for is never used: it is set
aside as ``<name>.corrupt-<UTC time>`` with a warning, and the kind is profiled again.
``powerfl lut export | import | list`` (``fl_server.lut_cli``) ship a table profiled on
one board to a fleet.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fl_client.devices.descriptors import DeviceSpec
from fl_client.devices.simulated import power_w, time_per_sample_s
from fl_client.files import set_aside, write_atomic
from fl_client.lut import LUT, KindKey, lut_checksum
from fl_client.lut_format import LUTFormatError
from fl_client.names import UnsafeNameError, check_safe_name

log = logging.getLogger(__name__)

LIBRARY_FORMAT = "powerfl-lut-library"
LIBRARY_VERSION = 1


class LibraryError(ValueError):
    """A library file is corrupt, or serves another kind than the one asked for."""


@dataclass(frozen=True)
class LibraryEntry:
    """One file of the library."""

    path: Path
    kind: KindKey
    lut: LUT
    source: str  # who made it: "fleet-shared", "import <file>", ...
    saved_utc: str


def entry_json(lut: LUT, source: str) -> str:
    """A library file's content: the LUT, its kind, where it came from, and its checksum."""
    kind = KindKey.of_lut(lut)
    return json.dumps(
        {
            "format": LIBRARY_FORMAT,
            "version": LIBRARY_VERSION,
            "kind": kind.label,
            "kind-digest": kind.digest,
            "source": source,
            "saved-utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "lut-sha256": lut_checksum(lut),
            "lut": json.loads(lut.to_json()),
        },
        indent=1,
        allow_nan=False,
    )


def read_entry(path: Path) -> LibraryEntry:
    """Parse and verify one library file; LibraryError says what is wrong with it."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LibraryError(f"{path.name}: not a readable JSON file ({err})") from None
    if not isinstance(rec, dict) or rec.get("format") != LIBRARY_FORMAT:
        raise LibraryError(f"{path.name}: not a {LIBRARY_FORMAT} file")
    if rec.get("version") != LIBRARY_VERSION:
        raise LibraryError(f"{path.name}: version {rec.get('version')!r} is not supported")
    try:
        lut = LUT.from_json(json.dumps(rec["lut"]))
    except (KeyError, LUTFormatError) as err:
        raise LibraryError(f"{path.name}: invalid LUT ({err})") from None
    if rec.get("lut-sha256") != lut_checksum(lut):
        raise LibraryError(
            f"{path.name}: checksum mismatch: the LUT was changed after it was saved"
        )
    kind = KindKey.of_lut(lut)
    if rec.get("kind-digest") != kind.digest:
        raise LibraryError(f"{path.name}: kind-digest does not match the LUT it holds")
    return LibraryEntry(path, kind, lut, str(rec.get("source", "")), str(rec.get("saved-utc")))


#: How far (relative) an imported cell may differ from the library's measured one.
IMPORT_TOLERANCE = 0.15


def cells_disagree(new: LUT, known: LUT, tolerance: float) -> str:
    """The first cell both LUTs measured whose time per sample or peak power differs by
    more than ``tolerance`` (relative to ``known``), in words; "" when none does."""
    for i, b in enumerate(known.batch_sizes):
        for j, f in enumerate(known.knob_values):
            for what, table_new, table_old, unit in (
                ("peak power", new.peak_power_w, known.peak_power_w, "W"),
                ("time per sample", new.time_per_sample_s, known.time_per_sample_s, "s"),
            ):
                a, o = float(table_new[i, j]), float(table_old[i, j])
                if math.isfinite(a) and math.isfinite(o) and o > 0 and abs(a / o - 1) > tolerance:
                    return (
                        f"cell (b={b}, f={f:g} {known.knob.unit}) {what} {a:.4g} {unit} "
                        f"against the library's measured {o:.4g} {unit} ({100 * (a / o - 1):+.0f}%)"
                    )
    return ""


#: How far an imported cell may be from the kind's twin (the noiseless model of the board
#: in its device descriptor) before it is refused: a factor either way, in peak power and in
#: time per sample. Wide on purpose: it catches gross errors (mW or ms for W or s, a table of
#: another board or model), not a calibration gap between a twin and a real board, which
#: the first round's check of every node catches (``drift-threshold``).
TWIN_POWER_FACTOR = 2.0
TWIN_TIME_FACTOR = 4.0


@dataclass(frozen=True)
class TwinModel:
    """The kind's twin, for checking imported numbers: its descriptor and the model's
    training FLOPs per sample."""

    spec: DeviceSpec
    flops_per_sample: float


def cells_off_twin(new: LUT, twin: TwinModel) -> str:
    """The first profiled cell whose peak power is below the board's idle power or more
    than ``TWIN_POWER_FACTOR`` from the twin's, or whose time per sample is more than
    ``TWIN_TIME_FACTOR`` from the twin's, in words; "" when every cell is in range."""
    spec, flops = twin.spec, twin.flops_per_sample
    for i, b in enumerate(new.batch_sizes):
        for j, f in enumerate(new.knob_values):
            peak, tps = float(new.peak_power_w[i, j]), float(new.time_per_sample_s[i, j])
            if not (math.isfinite(peak) and math.isfinite(tps)):
                continue  # not profiled
            cell = f"cell (b={b}, f={f:g} MHz)"
            if peak < spec.idle_power_w:
                return (
                    f"{cell} peak power {peak:.4g} W is below the board's idle power "
                    f"{spec.idle_power_w:g} W ({spec.kind} descriptor: power.idle-w)"
                )
            for what, value, model, factor, unit in (
                ("peak power", peak, power_w(spec, b, f, flops), TWIN_POWER_FACTOR, "W"),
                (
                    "time per sample",
                    tps,
                    time_per_sample_s(spec, b, f, flops),
                    TWIN_TIME_FACTOR,
                    "s",
                ),
            ):
                if not model / factor <= value <= model * factor:
                    return (
                        f"{cell} {what} {value:.4g} {unit} against the {spec.kind} twin's "
                        f"{model:.4g} {unit} ({value / model:.2g}×), beyond the {factor:g}× "
                        "either way an imported cell may differ from it (a unit, another "
                        "board or model?)"
                    )
    return ""


class LUTLibrary:
    """The LUT library in ``root`` (the server's ``<cache-dir>/library``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path_for(self, kind: KindKey) -> Path:
        """The file of ``kind``'s entry, in ``root``; a kind whose device kind, backend or
        model is not a safe name (``fl_client.names``: it came from a node's reply or an
        imported file) is a LibraryError naming it: no entry is read or written outside
        the library."""
        try:
            parts = [
                check_safe_name(kind.device_kind, "device-kind"),
                check_safe_name(kind.backend, "backend"),
                check_safe_name(kind.model_name.replace("/", "-"), "model-name"),
            ]
        except UnsafeNameError as err:
            raise LibraryError(f"LUT library: {err}") from None
        return self.root / f"{'_'.join(parts)}_{kind.digest}.json"

    def get(self, kind: KindKey) -> LUT | None:
        """The verified LUT of ``kind``, or None; a bad file is set aside, never used; a
        kind with an unsafe name (``path_for``) has no entry."""
        try:
            path = self.path_for(kind)
        except LibraryError as err:
            log.warning("%s; no entry is read for it", err)
            return None
        if not path.is_file():
            return None
        try:
            entry = read_entry(path)
            diff = kind.differences(entry.kind)
            if diff:
                raise LibraryError(f"{path.name}: holds another kind ({'; '.join(diff)})")
        except LibraryError as err:
            self._set_aside(path, str(err))
            return None
        return entry.lut

    def put(self, lut: LUT, source: str) -> Path:
        """Write ``lut`` as its kind's entry (atomically); returns the file."""
        return write_atomic(self.path_for(KindKey.of_lut(lut)), entry_json(lut, source))

    def entries(self) -> tuple[list[LibraryEntry], list[str]]:
        """Every valid entry, and a line per file that is not one (files are left as they are)."""
        good: list[LibraryEntry] = []
        bad: list[str] = []
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                good.append(read_entry(path))
            except LibraryError as err:
                bad.append(str(err))
        return good, bad

    def import_file(
        self,
        src: Path,
        expected: KindKey | None = None,
        *,
        replace: bool = False,
        tolerance: float = IMPORT_TOLERANCE,
        twin: TwinModel | None = None,
    ) -> tuple[Path, Path | None]:
        """Add a library file or a plain LUT file (``powerfl profile`` output) to the library;
        returns the entry and, when it replaced one, where the old entry is kept
        (``<name>.replaced-<UTC time>``, never deleted).

        With ``expected``, a LUT of another kind is refused, naming what differs. A LUT
        whose cells disagree with the kind's entry by more than ``tolerance`` (relative, in
        time per sample or peak power, on cells both measured) is refused unless ``replace``:
        one of the two is wrong, and a wrong peak lets nodes run over their cap. With
        ``twin`` (the kind's descriptor), a LUT with a cell out of the twin's range
        (``cells_off_twin``) is refused too unless ``replace``, whether or not the library
        has an entry of the kind to compare with.
        """
        try:
            lut = read_entry(src).lut
        except LibraryError as first:
            try:
                lut = LUT.load(src)
            except (LUTFormatError, OSError) as err:
                raise LibraryError(
                    f"{src}: neither a library file ({first}) nor a LUT file ({err})"
                ) from None
        if expected is not None:
            diff = expected.differences(KindKey.of_lut(lut))
            if diff:
                raise LibraryError(f"{src}: a LUT for another kind: {'; '.join(diff)}")
        if twin is not None and not replace:
            off = cells_off_twin(lut, twin)
            if off:
                raise LibraryError(
                    f"{src}: {off}; check the file, or give --replace to import it anyway"
                )
        path = self.path_for(KindKey.of_lut(lut))
        if path.is_file() and not replace:
            try:
                known = read_entry(path).lut
            except LibraryError:
                known = None  # a bad entry is no measurement to compare with
            if known is not None:
                disagreement = cells_disagree(lut, known, tolerance)
                if disagreement:
                    raise LibraryError(
                        f"{src}: {disagreement}, beyond {100 * tolerance:.0f}%: its numbers "
                        f"disagree with the kind's measurements in {path.name}; check the "
                        "file, or give --replace to replace the entry anyway (the old one "
                        "is kept)"
                    )
        backup = None
        if path.exists():
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
            backup = path.with_name(f"{path.name}.replaced-{stamp}")
            shutil.copy2(path, backup)
        return self.put(lut, f"import {src.name}"), backup

    def set_aside(self, kind: KindKey, reason: str) -> str:
        """Set aside ``kind``'s entry (a node's round disagreed with it): renamed, never
        read again, so the kind is profiled again and its new LUT replaces it; returns
        what happened."""
        path = self.path_for(kind)
        if not path.is_file():
            return "no entry"
        kept = set_aside(path)
        log.warning("LUT library: %s: %s; %s; the kind is profiled again", path.name, reason, kept)
        return kept

    def _set_aside(self, path: Path, reason: str) -> None:
        kept = set_aside(path)
        log.warning("LUT library: %s; %s; the kind is profiled again", reason, kept)
