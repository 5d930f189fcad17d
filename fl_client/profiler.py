"""On-device profiling of LUT_time / LUT_power per (batch size, GPU frequency), with a disk cache.

Paper §4.1: for each profiled (b, f) lock the GPU at f, run a few real minibatches of the
model at b (warm-up discarded) and record time per sample, peak power and the σ of the
per-step peaks. Under a known P_max only the cells that matter are profiled (efficient
mode). Tables are cached per (device kind, backend, model, input shape, B, cap) by
``fl_client.lut``. No Flower import.

Each cell is measured for as long as its device's power sensor needs (``CellWindow``), as
``fl_client.cell_measure`` measures one cell.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

import numpy as np

from fl_client.cell_measure import (
    MAX_STEPS_PER_CELL,
    MAX_WINDOW_S,
    SETTLE_TOLERANCE,
    CellMeasurement,
    CellWindow,
    StepFactory,
    measure_locked,
    time_per_sample_s,
)
from fl_client.devices.base import (
    GPU_FREQ_MHZ,
    Device,
    Knob,
    Workload,
    device_knob,
)
from fl_client.feasibility import PEAK_SIGMA_K, feasible_cells
from fl_client.lut import LUT, NO_CAP, LUTKey, load_cached
from fl_client.lut_format import FloatArray
from fl_client.power import PowerLimit
from fl_client.selector_inputs import validate_batch_sizes

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- profiling


class _Progress:
    """A rich progress bar on a terminal, one plain line per cell otherwise, or nothing."""

    def __init__(
        self,
        enabled: bool,
        title: str,
        total: int | None,
        stream: IO[str],
        knob: Knob = GPU_FREQ_MHZ,
    ):
        self._stream = stream
        self._knob = knob
        self._title = title
        self._total = total
        self._done = 0
        self._bar: Any = None
        self._task: Any = None
        self._enabled = enabled
        if enabled and stream.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(file=stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(title, total=total)

    def cell(self, b: int, knob_value: float, cell: CellMeasurement) -> None:
        self._done += 1
        if not self._enabled:
            return
        m = cell.measurement
        tps_ms = 1e3 * m.time_s / max(m.samples, 1)
        unsettled = "" if cell.settled else ", unsettled"
        clock_mhz = getattr(m, "clock_mhz", math.nan)
        ran_at = f", clock {clock_mhz:g} MHz" if math.isfinite(clock_mhz) else ""
        moved = " (moved)" if ran_at and getattr(m, "clock_moved", False) else ""
        what = (
            f"b={b} f={knob_value:g} {self._knob.unit}: {tps_ms:.3f} ms/sample, "
            f"peak {m.peak_power_w:.2f} W, avg {m.avg_power_w:.2f} W{ran_at}{moved} "
            f"({m.steps} steps, {cell.window_s:.3g} s, {cell.power_samples} samples"
            f"{unsettled})"
        )
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"{self._title} {what}")
        else:
            of = f"/{self._total}" if self._total is not None else ""
            print(f"{self._title} [{self._done}{of}] {what}", file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


#: How cells are sized: by the device's sensor (``sensor``, the default), or exactly
#: ``steps`` steps each as before sensors were considered (``fixed``).
SIZINGS = ("sensor", "fixed")


#: The tables ``profile`` fills, by LUT field: time, peak, average power and σ, and what
#: each cell's measurement was (power samples, window, settled, the board's window).
_TABLES = {
    "time": "time_per_sample_s",
    "peak": "peak_power_w",
    "avg": "avg_power_w",
    "sigma": "peak_sigma_w",
    "samples": "power_samples",
    "window": "window_s",
    "settled": "settled",
    "needed": "needed_window_s",
    "rse": "time_rse",
    "clock": "clock_mhz",
    "moved": "clock_moved",
    "counter": "energy_from_counter",
}


def _new_tables(shape: tuple[int, int]) -> dict[str, FloatArray]:
    """Empty (all NaN) tables of a (|B|, |F|) grid (``_TABLES``)."""
    return {name: np.full(shape, np.nan) for name in _TABLES}


def _record(
    tables: dict[str, FloatArray], i: int, j: int, cell: CellMeasurement, batch_size: int
) -> None:
    """Write one measured cell into ``_new_tables``' tables."""
    m = cell.measurement
    tables["time"][i, j] = time_per_sample_s(m, batch_size, m.steps)
    tables["peak"][i, j] = m.peak_power_w
    tables["avg"][i, j] = m.avg_power_w
    tables["sigma"][i, j] = cell.peak_sigma_w
    tables["samples"][i, j] = cell.power_samples
    tables["window"][i, j] = cell.window_s
    tables["settled"][i, j] = 1.0 if cell.settled else 0.0
    tables["needed"][i, j] = cell.needed_window_s
    tables["rse"][i, j] = cell.time_rse if math.isfinite(cell.time_rse) else math.nan
    clock_mhz = getattr(m, "clock_mhz", math.nan)
    if math.isfinite(clock_mhz):  # a real sensor's cell: the clock sampled while it ran
        tables["clock"][i, j] = clock_mhz
        tables["moved"][i, j] = 1.0 if getattr(m, "clock_moved", False) else 0.0
    source = getattr(m, "energy_source", "")
    if source:
        tables["counter"][i, j] = 1.0 if source == "counter" else 0.0


def _lut_of(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    tables: dict[str, FloatArray],
    opts: ProfileOptions,
    cost: tuple[float, float],
) -> LUT:
    """The LUT of ``tables`` measured on ``device`` (its knob's values as columns) as
    ``opts`` say, at ``cost`` (device time in s, energy in J)."""
    info = device.info
    by_field: dict[str, Any] = {field: tables[name] for name, field in _TABLES.items()}
    locked = getattr(device, "clocks_locked", None)
    return LUT(
        device_kind=info.kind,
        backend=info.backend,
        model_name=workload.model_name,
        input_shape=tuple(workload.input_shape),
        batch_sizes=tuple(batch_sizes),
        knob_values=tuple(float(f) for f in device.knob_values),
        knob=device_knob(device),
        clocks_locked=locked if isinstance(locked, bool) else None,
        limit=opts.limit,
        profile_time_s=cost[0],
        profile_energy_j=cost[1],
        warmup_steps=opts.warmup_steps,
        steps=opts.steps,
        grid=opts.grid,
        **by_field,
    )


#: Efficient mode: a batch size's walk up in f stops at this many infeasible cells in a row
#: (one noisy cell above the cap does not end it; two in a row mark the boundary).
WALK_STOP_IN_A_ROW = 2
#: ... and at the latest at this many infeasible cells beyond the first one of the walk
#: (isolated ones included), which bounds what noise can cost.
WALK_EXTRA_INFEASIBLE = 2


def _efficient_row(feasible: Callable[[int], bool], start: int, n_f: int) -> int | None:
    """Walk one batch size's frequencies for efficient mode; its highest feasible index.

    Up from ``start`` (``feasible`` measures each index it is asked about) until
    ``WALK_STOP_IN_A_ROW`` infeasible indices in a row, or ``1 + WALK_EXTRA_INFEASIBLE``
    infeasible ones in all, or the top of the table; if none of those was feasible, down
    from ``start − 1`` until a feasible one.

    **Bound on extra cells.** Compared with stopping at the first infeasible f (the paper's
    walk), each b's walk up measures at most ``WALK_EXTRA_INFEASIBLE`` = 2 more infeasible
    cells beyond its first infeasible one: it stops at the second in a row, and at the
    third in all even when they are apart. Every other cell it measures is feasible, a
    cell the selector may choose. So per b at most 3 measured cells are infeasible on the
    way up, and on a row whose power rises with f the walk costs exactly one cell more than
    the paper's (the confirming second infeasible f, when the row has one). On such tables
    it finds, per b, the same highest feasible f as the full grid.
    """
    highest = None
    in_a_row = infeasible = 0
    j = start
    while j < n_f:
        if feasible(j):
            highest, in_a_row = j, 0
        else:
            in_a_row, infeasible = in_a_row + 1, infeasible + 1
            if in_a_row >= WALK_STOP_IN_A_ROW or infeasible > WALK_EXTRA_INFEASIBLE:
                break
        j += 1
    if highest is None:
        for k in range(start - 1, -1, -1):
            if feasible(k):
                return k
    return highest


@dataclass(frozen=True)
class ProfileOptions:
    """How to profile: the cap (efficient mode), steps per cell, progress, uncapped grid.

    ``limit`` is the cap with its margin (``PowerLimit``; the default: no cap): efficient
    mode judges each cell as the selector does, by its robust peak (peak +
    ``peak_sigma_k``·σ of its per-step peaks) against ``limit.limit_w``, P_max less its
    margin. The cap and margin are stored in the LUT as such; ``peak_sigma_k`` (the run
    setting ``peak-sigma-k``) only steers where the walk stops.

    ``steps`` is the least number of measured steps per cell; with ``sizing="sensor"``
    (the default) a cell goes on until the device's sensor window and sample minimum
    (``min_window_s`` / ``min_power_samples`` replace the sensor's when given) are met
    and time and power settled within ``settle_tolerance``, up to ``max_steps`` steps or
    ``max_window_s`` seconds (``CellWindow``); ``sizing="fixed"``: exactly ``steps``.
    """

    limit: PowerLimit = NO_CAP
    warmup_steps: int = 1
    steps: int = 3
    progress: bool = True
    progress_stream: IO[str] | None = None
    uncapped: str = "full"
    peak_sigma_k: float = PEAK_SIGMA_K
    sizing: str = "sensor"
    min_window_s: float | None = None
    min_power_samples: int | None = None
    settle_tolerance: float = SETTLE_TOLERANCE
    max_steps: int = MAX_STEPS_PER_CELL
    max_window_s: float = MAX_WINDOW_S

    def cell_window(self, device: Device) -> CellWindow:
        """How each cell is measured on ``device``."""
        if self.sizing == "fixed":
            return CellWindow.fixed(self.steps)
        sensor = CellWindow.of(device, self.steps)
        return dataclasses.replace(
            sensor,
            min_window_s=sensor.min_window_s if self.min_window_s is None else self.min_window_s,
            min_power_samples=(
                sensor.min_power_samples
                if self.min_power_samples is None
                else self.min_power_samples
            ),
            settle_tolerance=self.settle_tolerance,
            max_steps=max(self.max_steps, self.steps),
            max_window_s=self.max_window_s,
        )

    def __post_init__(self) -> None:
        if not isinstance(self.limit, PowerLimit):
            raise ValueError(
                f"p-max-w: the cap must be a PowerLimit (parsed once), got {self.limit!r}"
            )
        warmup = self.warmup_steps
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup-steps: must be an integer ≥ 0; got {warmup!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps: must be an integer ≥ 1; got {self.steps!r}")
        if self.uncapped not in ("full", "highest"):
            raise ValueError(f"uncapped: unknown value {self.uncapped!r}; allowed: full, highest")
        k = self.peak_sigma_k
        if isinstance(k, bool) or not isinstance(k, int | float) or not 0 <= k < math.inf:
            raise ValueError(f"peak-sigma-k: expected a finite number ≥ 0, got {k!r}")
        if self.sizing not in SIZINGS:
            raise ValueError(
                f"sizing: unknown value {self.sizing!r}; allowed: {', '.join(SIZINGS)}"
            )
        CellWindow(  # the window's own checks, with a device's minimums left to it
            self.steps,
            0.0 if self.min_window_s is None else self.min_window_s,
            0 if self.min_power_samples is None else self.min_power_samples,
            self.settle_tolerance,
            max(self.max_steps, self.steps),
            self.max_window_s,
        )

    def feasible(self, peak_w: float, sigma_w: float) -> bool:
        """Whether a cell is feasible by its robust peak, as the selector judges it."""
        return bool(
            feasible_cells(
                np.array([peak_w]),
                self.limit,
                peak_sigma_w=np.array([sigma_w]),
                peak_sigma_k=self.peak_sigma_k,
            )[0]
        )

    @property
    def grid(self) -> str:
        return "efficient" if self.limit.capped else self.uncapped


def profile(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    step_factory: StepFactory,
    options: ProfileOptions | None = None,
) -> LUT:
    """Measure LUT_time and LUT_power of ``workload`` on ``device`` (paper §4.1).

    For each profiled (b, f): lock the GPU at f, run ``warmup_steps`` steps (accounted for
    in the profiling cost, not in the tables), then at least ``steps`` steps through
    ``device.measure``, on until the device's sensor window and sample minimum are met and
    time and power settled (``options.cell_window``, ``CellWindow``); record time per
    sample, peak and average power, and per cell the power samples, the measured window,
    whether it settled and, on an emulated device of a real board, the window that board
    would have needed. The device is restored at the end whatever happens.

    Without a cap every cell is profiled. Under a cap (efficient mode) each cell is judged
    as the selector judges it (``feasibility.feasible_cells``): feasible when its peak +
    ``peak_sigma_k``·σ of its per-step peaks is below ``options.limit.limit_w``. The
    largest b goes from the lowest f upward and stops at the second infeasible f in a row
    (``WALK_STOP_IN_A_ROW``; ``_efficient_row`` bounds what this costs), both measured and
    recorded: one noisy cell above the cap (a spike at the lowest f, or a knob that does
    not bind there) does not end the walk, since the selector may still choose the
    feasible cells above it. Each next smaller b starts at the previous b's highest
    feasible f (the lowest f if it had none) and goes up the same way. Should nothing from
    that start up be feasible (power not monotone in b), the b walks down from below the
    start until a feasible f, so its highest feasible f below the start is still found.
    Cells never visited stay NaN.

    Parameters
    ----------
    device : Device
        The GPU to profile; its knob's values (``knob_values``) give the columns.
    workload : Workload
        Model and input shape (the LUT's key).
    batch_sizes : sequence of int
        B, strictly ascending.
    step_factory : callable
        ``step_factory(b)`` returns a zero-argument function that runs ONE real training
        minibatch of size b (e.g. ``fl_client.task.make_train_step``); called once per b.
    options : ProfileOptions, optional
        The cap with its margin (``limit``), how cells are judged and measured and how
        progress is shown (``ProfileOptions``); the default: no cap, the full grid.

    Returns
    -------
    LUT
        With ``profile_time_s`` the device time (``device.now_s()``) profiling took, σ of
        the per-step peaks of every measured cell (``peak_sigma_w``), the per-cell
        ``power_samples``, ``window_s``, ``settled`` and ``needed_window_s``, and the
        device's knob.
    """
    opts = options if options is not None else ProfileOptions()
    b_list = validate_batch_sizes(batch_sizes)
    tables = _new_tables((len(b_list), len(device.knob_values)))
    bar = _profile_bar(opts, device, workload, (len(b_list), len(device.knob_values)))
    start_s = device.now_s()
    try:
        run = _Run(device, workload, step_factory, opts)
        energy_j = _profile_rows(run, b_list, tables, bar)
    finally:
        bar.close()
        device.restore()
    cost = (max(device.now_s() - start_s, 0.0), energy_j)
    return _lut_of(device, workload, b_list, tables, opts, cost)


def _profile_bar(
    opts: ProfileOptions, device: Device, workload: Workload, shape: tuple[int, int]
) -> _Progress:
    """Progress of one ``profile`` call, titled with its mode."""
    if opts.grid == "efficient":
        margin = opts.limit.cap_margin
        less = f" less {100 * margin:g}%" if margin else ""
        mode = f"efficient, P_max {opts.limit.p_max_w:g} W{less}"
    else:
        mode = {"full": "full grid", "highest": "no cap: highest frequency per b"}[opts.grid]
    return _Progress(
        opts.progress,
        f"profile {device.info.kind} {workload.key} ({mode})",
        {"full": shape[0] * shape[1], "highest": shape[0]}.get(opts.grid),
        opts.progress_stream if opts.progress_stream is not None else sys.stderr,
        device_knob(device),
    )


class _Run(NamedTuple):
    """What one ``profile`` call measures with: the device, the workload, its steps and
    the options."""

    device: Device
    workload: Workload
    step_factory: StepFactory
    opts: ProfileOptions


def _profile_rows(
    run: _Run, b_list: list[int], tables: dict[str, FloatArray], bar: _Progress
) -> float:
    """Walk the rows as ``profile`` describes, largest b first; returns the energy spent."""
    device, workload, step_factory, opts = run
    freqs = tuple(float(f) for f in device.knob_values)
    window = opts.cell_window(device)
    energy_j = 0.0
    start_j = 0  # efficient mode: where the next (smaller) b starts
    for i in reversed(range(len(b_list))):
        b = b_list[i]
        step = step_factory(b)

        def cell(j: int, i: int = i, b: int = b, step: Callable[[], object] = step) -> bool:
            """Profile (b, freqs[j]) into the tables; whether it is feasible (robust peak
            below the cap less its margin; always without a cap)."""
            nonlocal energy_j
            device.set_knob_value(freqs[j])
            measured = measure_locked(device, workload, b, step, opts.warmup_steps, window)
            energy_j += measured.energy_j
            _record(tables, i, j, measured, b)
            bar.cell(b, freqs[j], measured)
            return opts.feasible(measured.measurement.peak_power_w, measured.peak_sigma_w)

        if opts.grid == "full":
            for j in range(len(freqs)):
                cell(j)
        elif opts.grid == "highest":
            cell(len(freqs) - 1)
        else:
            highest = _efficient_row(cell, start_j, len(freqs))
            start_j = 0 if highest is None else highest
        del cell, step  # free this b's model before the next one is built
    return energy_j


def load_or_profile(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    step_factory: StepFactory,
    cache_dir: str | os.PathLike[str],
    options: ProfileOptions | None = None,
) -> tuple[LUT, bool]:
    """The cached LUT for these settings, or a new profile (then cached).

    A cached full-grid LUT serves any cap; an efficient-mode LUT serves only its own cap,
    a highest-frequency LUT (``uncapped="highest"``) only runs without a cap.
    A cache file that is corrupt or does not match (device, backend, model, input shape,
    B, frequency table, cap) is renamed ``<name>.corrupt-<UTC timestamp>`` with a logged
    warning, and the tables are profiled again. Files are written atomically; a cache that
    cannot be written only costs a warning.

    Parameters
    ----------
    device, workload, batch_sizes, step_factory, options
        As in ``profile``; without a cap it profiles (and caches) the full grid, or with
        ``uncapped="highest"`` the highest frequency of each b.
    cache_dir : path
        Folder of the cache files (created if needed).

    Returns
    -------
    (LUT, bool)
        The tables, and whether they came from the cache (no profiling cost this time).
    """
    opts = options if options is not None else ProfileOptions()
    b_list = validate_batch_sizes(batch_sizes)
    wanted = [LUTKey.of(device, workload, b_list)]  # a full grid serves any cap
    if opts.limit.capped:
        wanted.append(LUTKey.of(device, workload, b_list, limit=opts.limit, grid="efficient"))
    elif opts.uncapped == "highest":
        wanted.append(LUTKey.of(device, workload, b_list, grid="highest"))
    for key in wanted:
        path = key.path(cache_dir)
        cached = load_cached(path, key)
        if cached is not None:
            return cached, True
    lut = profile(device, workload, b_list, step_factory, opts)
    try:
        lut.save(path)  # the last path tried: the full grid's, or this cap's
    except OSError as err:
        log.warning("could not write the LUT cache %s (%s); profiling again next time", path, err)
    return lut, False
