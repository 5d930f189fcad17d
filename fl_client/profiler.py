"""On-device profiling of LUT_time / LUT_power per (batch size, GPU frequency), with a disk cache.

Paper §4.1: for each profiled (b, f) lock the GPU at f, run a few real minibatches of the
model at b (warm-up discarded) and record time per sample, peak power and the σ of the
per-step peaks. Under a known P_max only the cells that matter are profiled (efficient
mode). Tables are cached per (device kind, backend, model, input shape, B, cap) by
``fl_client.lut``. No Flower import.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

from fl_client.devices.base import Device, Measurement, Workload
from fl_client.devices.replay import GPU_FREQ_MHZ, Knob
from fl_client.lut import LUT, FloatArray, LUTKey, load_cached, merge_cells
from fl_client.selector import (
    PEAK_SIGMA_K,
    feasible_cells,
    validate_batch_sizes,
    validate_p_max_w,
)

log = logging.getLogger(__name__)

StepFactory = Callable[[int], Callable[[], object]]


@dataclass(frozen=True)
class MeasureContext:
    """Where a node measures cells outside profiling (pacing, drift checks): its device, the
    workload, the factory of its training step per batch size, and its LUT cache."""

    device: Device
    workload: Workload
    step_factory: StepFactory
    cache_dir: Path


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

    def cell(self, b: int, freq_mhz: float, m: Measurement) -> None:
        self._done += 1
        if not self._enabled:
            return
        tps_ms = 1e3 * m.time_s / max(m.samples, 1)
        what = (
            f"b={b} f={freq_mhz:g} {self._knob.unit}: {tps_ms:.3f} ms/sample, "
            f"peak {m.peak_power_w:.2f} W"
        )
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"{self._title} {what}")
        else:
            of = f"/{self._total}" if self._total is not None else ""
            print(f"{self._title} [{self._done}{of}] {what}", file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _run_steps(
    device: Device, workload: Workload, batch_size: int, step: Callable[[], object], n: int
) -> tuple[Measurement, list[float]]:
    """Run ``n`` steps in one measurement; it and each step's peak power (the highest power
    sample the step added; a step that added none has no peak)."""
    step_peaks_w: list[float] = []
    with device.measure(workload) as meter:
        for _ in range(n):
            before = len(meter.measurement.power_samples_w)
            meter.step(batch_size, step)
            added = meter.measurement.power_samples_w[before:]
            if added:
                step_peaks_w.append(max(added))
    return meter.measurement, step_peaks_w


def peak_sigma_w(step_peaks_w: Sequence[float]) -> float:
    """σ of a cell's per-step peak powers (sample standard deviation, ddof = 1); NaN (not
    recorded: the selector counts it as 0) with fewer than 2 steps."""
    if len(step_peaks_w) < 2:
        return math.nan
    peaks = np.asarray(step_peaks_w, dtype=np.float64)
    return float(np.std(peaks - peaks[0], ddof=1))  # shifted: equal peaks give exactly 0


def device_knob(device: Device) -> Knob:
    """The knob a device's ``gpu_freqs_mhz`` are values of: the GPU frequency unless the
    device names another (a replay table of a power limit)."""
    knob = getattr(device, "knob", GPU_FREQ_MHZ)
    return knob if isinstance(knob, Knob) else GPU_FREQ_MHZ


def time_per_sample_s(m: Measurement, batch_size: int, steps: int) -> float:
    """A measurement's time per sample (the samples it counted, else ``batch_size × steps``)."""
    return m.time_s / (m.samples if m.samples > 0 else batch_size * steps)


def _new_tables(shape: tuple[int, int]) -> dict[str, FloatArray]:
    """Empty (all NaN) time, peak power, average power and σ tables of a (|B|, |F|) grid."""
    return {name: np.full(shape, np.nan) for name in ("time", "peak", "avg", "sigma")}


def _record(
    tables: dict[str, FloatArray],
    i: int,
    j: int,
    cell: tuple[Measurement, float],
    batch_size: int,
    steps: int,
) -> None:
    """Write one measured cell (its measurement and σ of its per-step peaks) into
    ``_new_tables``' tables."""
    m, sigma_w = cell
    tables["time"][i, j] = time_per_sample_s(m, batch_size, steps)
    tables["peak"][i, j] = m.peak_power_w
    tables["avg"][i, j] = m.avg_power_w
    tables["sigma"][i, j] = sigma_w


def _lut_of(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    tables: dict[str, FloatArray],
    **fields: Any,
) -> LUT:
    """The LUT of ``tables`` measured on ``device`` (its frequency table as columns)."""
    info = device.info
    return LUT(
        device_kind=info.kind,
        backend=info.backend,
        model_name=workload.model_name,
        input_shape=tuple(workload.input_shape),
        batch_sizes=tuple(batch_sizes),
        freqs_mhz=tuple(float(f) for f in device.gpu_freqs_mhz),
        time_per_sample_s=tables["time"],
        peak_power_w=tables["peak"],
        avg_power_w=tables["avg"],
        peak_sigma_w=tables["sigma"],
        knob=device_knob(device),
        **fields,
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

    ``p_max_w`` is the bare cap (None, "none" or inf: no cap) and ``cap_margin`` the share
    of it kept free: efficient mode judges each cell as the selector does, by its robust
    peak (peak + ``peak_sigma_k``·σ of its per-step peaks) against
    ``p_max_w · (1 − cap_margin)``. The cap and margin are stored in the LUT as such;
    ``peak_sigma_k`` (the run setting ``peak-sigma-k``) only steers where the walk stops.
    """

    p_max_w: float | str | None = None
    cap_margin: float = 0.0
    warmup_steps: int = 1
    steps: int = 3
    progress: bool = True
    progress_stream: IO[str] | None = None
    uncapped: str = "full"
    peak_sigma_k: float = PEAK_SIGMA_K

    def __post_init__(self) -> None:
        cap = validate_p_max_w(self.p_max_w)
        object.__setattr__(self, "p_max_w", cap)
        warmup = self.warmup_steps
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup-steps: must be an integer ≥ 0; got {warmup!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps: must be an integer ≥ 1; got {self.steps!r}")
        if self.uncapped not in ("full", "highest"):
            raise ValueError(f"uncapped: unknown value {self.uncapped!r}; allowed: full, highest")
        if not 0.0 <= self.cap_margin < 1.0:
            raise ValueError(f"cap-margin: expected a number in [0, 1), got {self.cap_margin!r}")
        k = self.peak_sigma_k
        if isinstance(k, bool) or not isinstance(k, int | float) or not 0 <= k < math.inf:
            raise ValueError(f"peak-sigma-k: expected a finite number ≥ 0, got {k!r}")
        if cap is None:
            object.__setattr__(self, "cap_margin", 0.0)

    @property
    def cap_w(self) -> float | None:
        return None if self.p_max_w is None else float(self.p_max_w)

    @property
    def selection_cap_w(self) -> float | None:
        """What a profiled peak must stay below (None: no cap)."""
        return None if self.cap_w is None else self.cap_w * (1.0 - self.cap_margin)

    def feasible(self, peak_w: float, sigma_w: float) -> bool:
        """Whether a cell is feasible by its robust peak, as the selector judges it."""
        limit = self.selection_cap_w
        return bool(
            feasible_cells(
                np.array([peak_w]),
                limit,
                peak_sigma_w=np.array([sigma_w]),
                peak_sigma_k=self.peak_sigma_k,
            )[0]
        )

    @property
    def grid(self) -> str:
        return "efficient" if self.cap_w is not None else self.uncapped


def profile(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    step_factory: StepFactory,
    options: ProfileOptions | None = None,
    **settings: Any,
) -> LUT:
    """Measure LUT_time and LUT_power of ``workload`` on ``device`` (paper §4.1).

    For each profiled (b, f): lock the GPU at f, run ``warmup_steps`` steps (accounted for
    in the profiling cost, not in the tables), then ``steps`` steps through
    ``device.measure``; record time per sample, peak and average power. The device is
    restored at the end whatever happens.

    Without a cap every cell is profiled. With ``p_max_w`` (efficient mode) each cell is
    judged as the selector judges it (``selector.feasible_cells``): feasible when its peak
    + ``peak_sigma_k``·σ of its per-step peaks is below ``p_max_w · (1 − cap_margin)``.
    The largest b goes from the lowest f upward and stops at the second infeasible f in a
    row (``WALK_STOP_IN_A_ROW``), both measured and recorded: one noisy cell above the cap
    (a spike at the lowest f, or a knob that does not bind there) does not end the walk,
    since the selector may still choose the feasible cells above it. Each next smaller b
    starts at the previous b's highest feasible f (the lowest f if it had none) and goes up
    the same way. Should nothing from that start up be feasible (power not monotone in b),
    the b walks down from below the start until a feasible f, so its highest feasible f
    below the start is still found. Cells never visited stay NaN.

    **Bound on extra cells.** Compared with stopping at the first infeasible f (the paper's
    walk), each b's walk up measures at most ``WALK_EXTRA_INFEASIBLE`` = 2 more infeasible
    cells beyond its first infeasible one: it stops at the second in a row, and at the
    third in all even when they are apart. Every other cell it measures is feasible, a
    cell the selector may choose. So per b at most 3 measured cells are infeasible on the
    way up, and on a row whose power rises with f the walk costs exactly one cell more than
    the paper's (the confirming second infeasible f, when the row has one). On such tables
    it finds, per b, the same highest feasible f as the full grid.

    Parameters
    ----------
    device : Device
        The GPU to profile; its frequency table gives the columns.
    workload : Workload
        Model and input shape (the LUT's key).
    batch_sizes : sequence of int
        B, strictly ascending.
    step_factory : callable
        ``step_factory(b)`` returns a zero-argument function that runs ONE real training
        minibatch of size b (e.g. ``fl_client.task.make_train_step``); called once per b.
    options : ProfileOptions, optional
        ``p_max_w`` (the cap for efficient mode; None / "none" / infinity: no cap) and
        ``cap_margin``; ``peak_sigma_k`` (the selector's ``peak-sigma-k``, how efficient
        mode judges a cell); ``warmup_steps`` per cell run first and discarded (≥ 0),
        ``steps`` measured per cell (≥ 1; σ of the per-step peaks needs ≥ 2, else it is
        not recorded); ``progress`` (rich bar on a terminal, plain lines
        otherwise; False: silent) to ``progress_stream`` (default ``sys.stderr``);
        ``uncapped``: without a cap profile every cell (``full``) or each b at the highest
        frequency only (``highest``, what Eq. 4 selects per b when nothing is infeasible).
    **settings
        ``ProfileOptions`` fields, to build ``options`` from keywords instead.

    Returns
    -------
    LUT
        With ``profile_time_s`` the device time (``device.now_s()``) profiling took, σ of
        the per-step peaks of every measured cell (``peak_sigma_w``) and the device's knob.
    """
    opts = options if options is not None else ProfileOptions(**settings)
    b_list = validate_batch_sizes(batch_sizes)
    tables = _new_tables((len(b_list), len(device.gpu_freqs_mhz)))
    bar = _profile_bar(opts, device, workload, (len(b_list), len(device.gpu_freqs_mhz)))
    start_s = device.now_s()
    try:
        energy_j = _profile_rows(device, workload, b_list, step_factory, opts, tables, bar)
    finally:
        bar.close()
        device.restore()
    return _lut_of(
        device,
        workload,
        b_list,
        tables,
        p_max_w=opts.cap_w,
        cap_margin=opts.cap_margin,
        profile_time_s=max(device.now_s() - start_s, 0.0),
        profile_energy_j=energy_j,
        warmup_steps=opts.warmup_steps,
        steps=opts.steps,
        grid=opts.grid,
    )


def _profile_bar(
    opts: ProfileOptions, device: Device, workload: Workload, shape: tuple[int, int]
) -> _Progress:
    """Progress of one ``profile`` call, titled with its mode."""
    if opts.grid == "efficient":
        margin = f" less {100 * opts.cap_margin:g}%" if opts.cap_margin else ""
        mode = f"efficient, P_max {opts.cap_w:g} W{margin}"
    else:
        mode = {"full": "full grid", "highest": "no cap: highest frequency per b"}[opts.grid]
    return _Progress(
        opts.progress,
        f"profile {device.info.kind} {workload.key} ({mode})",
        {"full": shape[0] * shape[1], "highest": shape[0]}.get(opts.grid),
        opts.progress_stream if opts.progress_stream is not None else sys.stderr,
        device_knob(device),
    )


def _profile_rows(
    device: Device,
    workload: Workload,
    b_list: list[int],
    step_factory: StepFactory,
    opts: ProfileOptions,
    tables: dict[str, FloatArray],
    bar: _Progress,
) -> float:
    """Walk the rows as ``profile`` describes, largest b first; returns the energy spent."""
    freqs = tuple(float(f) for f in device.gpu_freqs_mhz)
    energy_j = 0.0
    start_j = 0  # efficient mode: where the next (smaller) b starts
    for i in reversed(range(len(b_list))):
        b = b_list[i]
        step = step_factory(b)

        def cell(j: int, i: int = i, b: int = b, step: Callable[[], object] = step) -> bool:
            """Profile (b, freqs[j]) into the tables; whether it is feasible (robust peak
            below the cap less its margin; always without a cap)."""
            nonlocal energy_j
            device.set_gpu_freq_mhz(freqs[j])
            if opts.warmup_steps:
                energy_j += _run_steps(device, workload, b, step, opts.warmup_steps)[0].energy_j
            m, step_peaks_w = _run_steps(device, workload, b, step, opts.steps)
            energy_j += m.energy_j
            sigma_w = peak_sigma_w(step_peaks_w)
            _record(tables, i, j, (m, sigma_w), b, opts.steps)
            bar.cell(b, freqs[j], m)
            return opts.feasible(m.peak_power_w, sigma_w)

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
    **settings: Any,
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
    device, workload, batch_sizes, step_factory, options, settings
        As in ``profile``; without a cap it profiles (and caches) the full grid, or with
        ``uncapped="highest"`` the highest frequency of each b.
    cache_dir : path
        Folder of the cache files (created if needed).

    Returns
    -------
    (LUT, bool)
        The tables, and whether they came from the cache (no profiling cost this time).
    """
    opts = options if options is not None else ProfileOptions(**settings)
    b_list = validate_batch_sizes(batch_sizes)
    wanted = [LUTKey.of(device, workload, b_list)]  # a full grid serves any cap
    if opts.cap_w is not None:
        wanted.append(
            LUTKey.of(
                device,
                workload,
                b_list,
                p_max_w=opts.cap_w,
                cap_margin=opts.cap_margin,
                grid="efficient",
            )
        )
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


class CellMeasurement(NamedTuple):
    """One cell measured as ``profile`` measures it (``measure_cell_with_sigma``)."""

    measurement: Measurement  # the measured steps
    time_s: float  # device time of the whole check, warm-up included (profiling cost)
    energy_j: float  # its energy
    peak_sigma_w: float  # σ of the measured steps' peaks (NaN: fewer than 2 steps)


def measure_cell_with_sigma(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    freq_mhz: float,
    *,
    warmup_steps: int = 1,
    steps: int = 3,
) -> CellMeasurement:
    """Measure one (b, f) cell as ``profile`` does (warm-up, then ``steps`` steps).

    Returns the measured steps' ``Measurement``, the device time and energy of the whole
    check (warm-up included), which is profiling cost, and σ of the measured steps' peak
    powers. The frequency is restored.
    """
    start_s = device.now_s()
    energy_j = 0.0
    try:
        device.set_gpu_freq_mhz(freq_mhz)
        if warmup_steps:
            energy_j += _run_steps(device, workload, batch_size, step, warmup_steps)[0].energy_j
        m, step_peaks_w = _run_steps(device, workload, batch_size, step, steps)
        energy_j += m.energy_j
    finally:
        device.restore()
    return CellMeasurement(
        m, max(device.now_s() - start_s, 0.0), energy_j, peak_sigma_w(step_peaks_w)
    )


def measure_cell(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    freq_mhz: float,
    *,
    warmup_steps: int = 1,
    steps: int = 3,
) -> tuple[Measurement, float, float]:
    """``measure_cell_with_sigma`` without σ: the measurement, device time and energy."""
    m, time_s, energy_j, _ = measure_cell_with_sigma(
        device, workload, batch_size, step, freq_mhz, warmup_steps=warmup_steps, steps=steps
    )
    return m, time_s, energy_j


def add_measured_cell(
    cells: LUT | None,
    like: LUT,
    device: Device,
    workload: Workload,
    cell: tuple[int, float],
    step: Callable[[], object],
) -> tuple[LUT, float, float]:
    """``cells`` (an on-demand LUT, or None for a new one) with ``cell`` = (b, f) measured now.

    Measured as ``profile`` measures a cell (``measure_cell``), with the batch sizes and
    steps per cell of ``like`` (the selection LUT); the cell replaces any value ``cells``
    had, and its device time and energy are added to ``cells``' profiling cost. Returns the
    new cells and the device time and energy of this measurement.
    """
    batch_size, freq_mhz = cell
    warmup_steps, steps = like.warmup_steps, like.steps
    b_list = validate_batch_sizes(like.batch_sizes)
    freqs = tuple(float(f) for f in device.gpu_freqs_mhz)
    if batch_size not in b_list or freq_mhz not in freqs:
        raise ValueError(f"batch-size / gpu-freq-mhz: ({batch_size}, {freq_mhz:g}) is not a cell")
    m, time_s, energy_j, sigma_w = measure_cell_with_sigma(
        device, workload, batch_size, step, freq_mhz, warmup_steps=warmup_steps, steps=steps
    )
    tables = _new_tables((len(b_list), len(freqs)))
    i, j = b_list.index(batch_size), freqs.index(freq_mhz)
    _record(tables, i, j, (m, sigma_w), batch_size, steps)
    one = _lut_of(
        device,
        workload,
        b_list,
        tables,
        profile_time_s=time_s,
        profile_energy_j=energy_j,
        warmup_steps=warmup_steps,
        steps=steps,
        grid="on-demand",
    )
    if cells is not None:
        one = dataclasses.replace(
            merge_cells(cells, one, overwrite=True),
            profile_time_s=cells.profile_time_s + time_s,
            profile_energy_j=cells.profile_energy_j + energy_j,
        )
    return one, time_s, energy_j
