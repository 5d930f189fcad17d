"""The LUT file's JSON format: its name and versions, the optional per-cell tables, and the
checks of a record and its tables (``LUT.from_json``). Malformed input is a
``LUTFormatError`` naming the key.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from fl_client.devices.base import GPU_POWER_LIMIT_W
from fl_client.power import PowerLimit, parse_p_max_w

LUT_FORMAT = "powerfl-lut"
#: 2: ``cap-margin`` stored beside the bare cap ``p-max-w`` (version 1 stored the cap less
#: its margin as ``p-max-w``; such files read as that cap with margin 0).
#: 3: optional ``peak-sigma-w`` (σ of each cell's per-step peak powers) and ``knob`` (what
#: the columns are, when not the GPU frequency in MHz), and the optional per-cell tables of
#: how each cell was measured (``CELL_TABLES``: power samples, window, settled, the real
#: board's window). A LUT with none of them is still written as version 2, byte for byte
#: as before (so checksums of stored LUTs hold); versions 1 and 2, and version 3 files
#: without them, read with σ and those tables not recorded (NaN; σ counts as 0) and the GPU
#: frequency as the knob.
LUT_VERSION = 3
#: Versions ``LUT.from_json`` reads.
LUT_VERSIONS_READ = (1, 2, 3)
#: How much of the (b, f) grid a LUT covers; see ``LUT.grid``.
GRIDS = ("full", "efficient", "highest", "on-demand", "shared")

FloatArray = npt.NDArray[np.float64]

#: Optional per-cell tables of how each cell was measured: LUT field → JSON key. NaN where
#: not profiled or not recorded. ``settled`` is 1 (window, samples and settling met) or 0
#: (the cell stopped at the profiler's hard cap); ``needed-window-s`` is the window the
#: real board's sensor would have needed, recorded on emulated devices (twin, replay) only.
CELL_TABLES = {
    "power_samples": "power-samples",
    "window_s": "window-s",
    "settled": "settled",
    "needed_window_s": "needed-window-s",
    "time_rse": "time-rse",
    "clock_mhz": "clock-mhz",
    "clock_moved": "clock-moved",
    "energy_from_counter": "energy-from-counter",
}
#: Cell tables that hold 1 or 0.
_FLAG_TABLES = {
    "settled": "1 (settled), 0 (stopped at the cap)",
    "clock-moved": "1 (the sampled clock moved by more than one step), 0",
    "energy-from-counter": "1 (the device's energy counter), 0 (sampled power)",
}


class LUTFormatError(ValueError):
    """A LUT file or record is malformed or does not fit together."""


#: The key of a saved LUT file that holds the SHA-256 of its canonical JSON.
CHECKSUM_KEY = "content-sha256"


def sigma_table(sigma_w: npt.ArrayLike | None, not_profiled: npt.NDArray[np.bool_]) -> FloatArray:
    """Check a σ-of-per-step-peaks table: the LUT's shape, NaN where not profiled, finite
    ≥ 0 W or NaN (not recorded) elsewhere. None or an empty array give the all-NaN table
    (a LUT has at least one profiled cell, so an empty table is never a real one)."""
    out = np.asarray(np.nan if sigma_w is None else sigma_w, dtype=np.float64)
    if sigma_w is None or out.size == 0:
        return np.full(not_profiled.shape, np.nan)
    if out.shape != not_profiled.shape:
        raise LUTFormatError(
            f"peak-sigma-w: shape {out.shape} does not match the other tables {not_profiled.shape}"
        )
    if np.isfinite(out[not_profiled]).any():
        raise LUTFormatError("peak-sigma-w: a value in a cell that was not profiled")
    if np.isinf(out).any() or (out < 0).any():
        raise LUTFormatError("peak-sigma-w: measured cells must be finite and ≥ 0 W, or null")
    return out


def cell_table(
    values: npt.ArrayLike | None, not_profiled: npt.NDArray[np.bool_], key: str
) -> FloatArray:
    """Check one of ``CELL_TABLES``: NaN where not profiled, finite ≥ 0 or NaN (not
    recorded) elsewhere; ``power-samples`` whole numbers and ``settled`` 0 or 1. None, an
    empty array or one of another shape give the all-NaN table: these tables describe how
    cells were measured, never what is selected, so a LUT whose grid was changed without
    them (``dataclasses.replace`` taking some rows) drops them. A file is checked for the
    shape first (``LUT.from_json``)."""
    out = np.asarray(np.nan if values is None else values, dtype=np.float64)
    if values is None or out.size == 0 or out.shape != not_profiled.shape:
        return np.full(not_profiled.shape, np.nan)
    if np.isfinite(out[not_profiled]).any():
        raise LUTFormatError(f"{key}: a value in a cell that was not profiled")
    known = out[~np.isnan(out)]
    if np.isinf(known).any() or (known < 0).any():
        raise LUTFormatError(f"{key}: measured cells must be finite and ≥ 0, or null")
    if key == "power-samples" and (known != np.round(known)).any():
        raise LUTFormatError(f"{key}: counts must be whole numbers")
    if key in _FLAG_TABLES and not np.isin(known, (0.0, 1.0)).all():
        raise LUTFormatError(f"{key}: must be {_FLAG_TABLES[key]} or null")
    return out


def checked_record(text: str) -> dict[str, Any]:
    """A LUT file's JSON object with every key present, known and of its type, its format
    and version readable, and its integer and number lists as such (``LUT.from_json``)."""
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as err:
        raise LUTFormatError(f"not valid JSON: {err}") from None
    if not isinstance(rec, dict):
        raise LUTFormatError("a LUT file holds one JSON object")
    values_key = "freqs-mhz"
    if GPU_POWER_LIMIT_W.values_key in rec:  # the columns of a power-limit LUT, in W
        values_key = GPU_POWER_LIMIT_W.values_key
        if rec.get("knob") != GPU_POWER_LIMIT_W.key.replace("_", "-") or "freqs-mhz" in rec:
            raise LUTFormatError(
                f"{values_key}: the columns of a LUT whose knob is power-limit-w, instead of "
                "freqs-mhz"
            )
        rec["freqs-mhz"] = rec.pop(values_key)  # read as the knob's values
    expected = {
        "format": str,
        "version": int,
        "device-kind": str,
        "backend": str,
        "model-name": str,
        "input-shape": list,
        "workload-key": str,
        "batch-sizes": list,
        "freqs-mhz": list,
        "p-max-w": (int, float, type(None)),
        "time-per-sample-s": list,
        "peak-power-w": list,
        "avg-power-w": list,
        "profile-time-s": (int, float),
        "profile-energy-j": (int, float),
        "created-utc": str,
        "warmup-steps": int,
        "steps": int,
    }
    # absent in files written before they existed (and in version 3 files without σ or
    # with the GPU frequency as the knob)
    optional = {"grid": str, "cap-margin": (int, float), "peak-sigma-w": list, "knob": str}
    optional.update({key: list for key in CELL_TABLES.values()})
    missing = sorted(set(expected) - set(rec))
    unknown = sorted(set(rec) - set(expected) - set(optional) - {"clocks-locked"})
    if not isinstance(rec.get("clocks-locked", False), bool):
        raise LUTFormatError("clocks-locked: must be true or false")
    expected.update({k: v for k, v in optional.items() if k in rec})
    if missing or unknown:
        raise LUTFormatError(f"keys: missing {missing}, unknown {unknown}")
    for key, kind in expected.items():
        if not isinstance(rec[key], kind) or isinstance(rec[key], bool):  # type: ignore[arg-type]
            raise LUTFormatError(f"{key}: wrong type {type(rec[key]).__name__}")
    if rec["format"] != LUT_FORMAT or rec["version"] not in LUT_VERSIONS_READ:
        raise LUTFormatError(
            f"format: expected {LUT_FORMAT} v{LUT_VERSION}, got {rec['format']} v{rec['version']}"
        )
    since_3 = {"peak-sigma-w", "knob", "clocks-locked", *CELL_TABLES.values()}
    too_new = sorted(since_3 & set(rec)) if rec["version"] < 3 else []
    if too_new:
        raise LUTFormatError(f"keys: {too_new} are not keys of a version {rec['version']} file")
    for key in ("input-shape", "batch-sizes"):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in rec[key]):
            raise LUTFormatError(f"{key}: must be a list of integers")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rec["freqs-mhz"]):
        raise LUTFormatError(f"{values_key}: must be a list of numbers")
    return rec


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def limit_of_record(p_max_w: object, cap_margin: float) -> PowerLimit:
    """The cap with its margin a record's ``p-max-w`` and ``cap-margin`` hold (files keep
    the two numbers; a LUT holds one ``PowerLimit``). A margin without a cap is refused."""
    try:
        cap_w = parse_p_max_w(p_max_w)
    except ValueError as err:
        raise LUTFormatError(str(err)) from None
    if not 0.0 <= cap_margin < 1.0 or (math.isinf(cap_w) and cap_margin != 0.0):
        raise LUTFormatError(
            f"cap-margin: must be in [0, 1), and 0 without a cap; got {cap_margin!r}"
        )
    return PowerLimit(cap_w, cap_margin)


def table_from_json(rows: list[Any], key: str) -> FloatArray:
    if not all(isinstance(row, list) for row in rows):
        raise LUTFormatError(f"{key}: must be a list of rows")
    lengths = {len(row) for row in rows}
    if len(lengths) > 1:
        raise LUTFormatError(f"{key}: rows of different lengths {sorted(lengths)}")
    for row in rows:
        for x in row:
            if x is not None and not _is_number(x):
                raise LUTFormatError(f"{key}: cells must be numbers or null; got {x!r}")
    n_f = lengths.pop() if lengths else 0
    out = np.array(
        [[math.nan if x is None else float(x) for x in row] for row in rows], dtype=np.float64
    )
    return out.reshape(len(rows), n_f)
