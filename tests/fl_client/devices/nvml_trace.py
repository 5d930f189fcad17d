"""Replay a real H100 NVML trace on a virtual clock: a fake ``pynvml`` and a derived INA3221.

``tests/fixtures/hardware/h100-resnet18-nvml-trace.json`` (README there) holds what one
H100 reported while ResNet18 trained: the instantaneous power field, the 1 s average, the
energy counter and the graphics clock, read every ~13 ms, and the time of every 10th step.

``TraceGpu`` plays it back on a ``VirtualTime``:

* a training step of batch size b (``TraceGpu.step``, or ``ReplaySteps(gpu)(b)`` as a
  profiler step factory) lasts the step time the trace recorded at that point, and the GPU
  is busy for it: the trace position advances with it (the 20 warm-up steps first, then the
  4 s of training, looping). Time the host spends elsewhere (an NVML call on the training
  thread, say) is GPU idle: the trace position stands still and the GPU draws ``idle_w``
  (the trace's own idle level). So a loop that reads the sensor between steps measures its
  own gaps, as on the GPU;
* while busy, every reading is the trace's reading at the trace position, held between the
  recorded reads as the sensor held it (the instant field and 1 s average change about
  every 100 ms on this GPU). The energy counter is re-latched every ``COUNTER_PERIOD_S`` of
  virtual time from the true energy: the trace's counter interpolated through its update
  instants while busy, ``idle_w`` while idle (``true_energy_j`` is that truth);
* every NVML call costs ``call_cost_s`` of virtual time: on the training thread it moves the
  clock (the GPU idles), on the sampler "thread" it delays that thread's next sample.

``virtual_sampling(vt)`` runs the real ``PowerSampler`` on the virtual clock: its thread is
replaced by a periodic tick of ``VirtualTime`` (start: one sample, then one every
``1 / rate`` plus the time the sample took, as the thread's ``wait`` loop does), and the
devices' ``now_s`` is the virtual clock. A tick that falls while the training thread holds
the sampler's lock waits for it, as the thread would.

``JetsonTraceBoard`` is the Jetson counterpart. There is no recorded board trace, so its
trace is DERIVED: the H100 trace's power shape scaled by ``JETSON_W_PER_H100_W`` to a Jetson
Orin Nano's watts, written to the fake INA3221 ``VDD_IN`` channel and held constant between
updates at the INA3221 update period the backend documents
(``sensors.INA3221_UPDATE_PERIOD_S``, 6.6 ms).
"""

from __future__ import annotations

import bisect
import json
import math
import types
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from tests.fl_client.devices.conftest import FI_DEV_POWER_INSTANT, NVMLError, pynvml_module

TRACE_PATH = Path(__file__).parents[2] / "fixtures" / "hardware" / "h100-resnet18-nvml-trace.json"
#: The energy counter's re-latch period on the virtual clock (the trace's counter changes
#: about every 100 ms).
COUNTER_PERIOD_S = 0.1
#: Warm-up steps the recorder ran before each 4 s training window.
TRACE_WARMUP_STEPS = 20
#: Derived Jetson trace: H100 watts × this = Jetson Orin Nano board watts (525 W → 15.75 W).
JETSON_W_PER_H100_W = 0.03
JETSON_RAIL = "VDD_IN"
JETSON_RAIL_MV = 5040


@dataclass(frozen=True)
class TraceRun:
    batch_size: int
    warmup_start_s: float
    train_start_s: float
    train_end_s: float
    step_marks: tuple[tuple[int, float], ...]

    def step_time_s(self, pos_s: float) -> float:
        """The recorded step time at trace position ``pos_s``. The warm-up's 20 steps were
        timed only together: its first step (allocation, kernel selection) is taken to
        hold all of its excess over 20 steps at the first training steps' pace."""
        if pos_s < self.train_start_s:
            pace_s = self.step_time_s(self.train_start_s)
            if pos_s <= self.warmup_start_s + 1e-9:
                total_s = self.train_start_s - self.warmup_start_s
                return max(total_s - (TRACE_WARMUP_STEPS - 1) * pace_s, pace_s)
            return min(pace_s, self.train_start_s - pos_s) or pace_s
        marks = self.step_marks
        times = [t for _, t in marks]
        k = min(max(bisect.bisect_right(times, pos_s) - 1, 0), len(marks) - 2)
        (n0, t0), (n1, t1) = marks[k], marks[k + 1]
        return (t1 - t0) / max(n1 - n0, 1)


@dataclass(frozen=True)
class Trace:
    """The recorded columns (W, J, MHz) and runs of the trace file."""

    t_s: np.ndarray
    instant_w: np.ndarray
    average_w: np.ndarray
    energy_j: np.ndarray
    clock_mhz: np.ndarray
    runs: dict[int, TraceRun]
    gpu: str
    change_t_s: np.ndarray  # the counter's update instants (midpoint of the reads around)
    change_e_j: np.ndarray  # ... and its value from then on

    @classmethod
    def load(cls, path: Path = TRACE_PATH) -> Trace:
        data = json.loads(path.read_text())
        rows = np.asarray(data["samples"], dtype=np.float64)
        t, inst, avg, e, clk = rows.T
        changed = np.flatnonzero(np.diff(e) != 0) + 1
        change_t = np.concatenate(([t[0]], 0.5 * (t[changed - 1] + t[changed])))
        change_e = np.concatenate(([e[0]], e[changed])) / 1000.0
        runs = {
            int(r["batch_size"]): TraceRun(
                int(r["batch_size"]),
                float(r["warmup_start_s"]),
                float(r["train_start_s"]),
                float(r["train_end_s"]),
                tuple((int(n), float(ts)) for n, ts in r["step_marks"]),
            )
            for r in data["runs"]
        }
        return cls(t, inst / 1000.0, avg / 1000.0, e / 1000.0, clk, runs, str(data["gpu"]),
                   change_t, change_e)  # fmt: skip

    def held(self, column: np.ndarray, pos_s: float) -> float:
        """The value last read at or before trace position ``pos_s``."""
        i = int(np.searchsorted(self.t_s, pos_s, side="right")) - 1
        return float(column[max(i, 0)])

    def energy_lin_j(self, pos_s: float) -> float:
        """The counter interpolated linearly through its update instants."""
        return float(np.interp(pos_s, self.change_t_s, self.change_e_j))

    @property
    def idle_w(self) -> float:
        """Mean instant power over the idle stretches (2 s before each warm-up)."""
        mask = np.zeros_like(self.t_s, dtype=bool)
        for run in self.runs.values():
            mask |= (self.t_s > run.warmup_start_s - 1.5) & (self.t_s < run.warmup_start_s - 0.2)
        return float(self.instant_w[mask].mean())


# ------------------------------------------------------------------------------ virtual time


@dataclass
class _Periodic:
    due_s: float
    interval_s: float
    fn: Callable[[], None]
    ready: Callable[[], bool]
    busy_s: float = 0.0
    alive: bool = True


class VirtualTime:
    """A clock that moves only when told (``advance``), firing periodic ticks on the way."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now = start_s
        self._ticks: list[_Periodic] = []
        self._in_tick: _Periodic | None = None
        self.hooks: list[Callable[[float], None]] = []

    def time(self) -> float:
        return self.now

    def every(
        self, interval_s: float, fn: Callable[[], None], ready: Callable[[], bool] = lambda: True
    ) -> _Periodic:
        tick = _Periodic(self.now + interval_s, interval_s, fn, ready)
        self._ticks.append(tick)
        return tick

    def cancel(self, tick: _Periodic) -> None:
        tick.alive = False
        if tick in self._ticks:
            self._ticks.remove(tick)

    def _set(self, t_s: float) -> None:
        self.now = max(self.now, t_s)
        for hook in self.hooks:
            hook(self.now)

    def _fire_due(self, until_s: float) -> None:
        while True:
            due = [p for p in self._ticks if p.due_s <= until_s and p.ready()]
            if not due or self._in_tick is not None:
                return
            tick = min(due, key=lambda p: p.due_s)
            self._set(tick.due_s)
            self._in_tick, tick.busy_s = tick, 0.0
            try:
                tick.fn()
            finally:
                self._in_tick = None
            tick.due_s = self.now + tick.busy_s + tick.interval_s

    def advance(self, dt_s: float) -> None:
        """Move the clock by ``dt_s`` (the calling thread is busy), firing due ticks."""
        target = self.now + max(dt_s, 0.0)
        self._fire_due(target)
        self._set(target)
        self._fire_due(self.now)

    def spend(self, cost_s: float) -> None:
        """The cost of a call: a tick's own time inside a tick, else the clock moves."""
        if self._in_tick is not None:
            self._in_tick.busy_s += cost_s
        else:
            self.advance(cost_s)


@contextmanager
def virtual_sampling(vt: VirtualTime) -> Iterator[None]:
    """The real ``PowerSampler`` and devices on ``vt`` (module docstring)."""
    from fl_client.devices import sampler as sampler_mod

    ticks: dict[int, _Periodic] = {}

    def start(self: Any) -> Any:
        if id(self) in ticks:
            return self
        self.try_sample()
        lock = self._lock
        ticks[id(self)] = vt.every(1.0 / self.rate_hz, self.try_sample, lambda: not lock.locked())
        return self

    def stop(self: Any) -> None:
        tick = ticks.pop(id(self), None)
        if tick is None:
            return
        vt.cancel(tick)
        self.try_sample()

    def running(self: Any) -> bool:
        return id(self) in ticks

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(sampler_mod.PowerSampler, "start", start))
        stack.enter_context(mock.patch.object(sampler_mod.PowerSampler, "stop", stop))
        stack.enter_context(
            mock.patch.object(sampler_mod.PowerSampler, "running", property(running))
        )
        stack.enter_context(
            mock.patch.object(sampler_mod.SampledDevice, "now_s", lambda self: vt.time())
        )
        yield


# ------------------------------------------------------------------------------ the GPU


@dataclass
class _Segment:
    v0_s: float  # virtual time the GPU starts this step
    v1_s: float
    p0_s: float  # trace position at v0
    e0_j: float  # true energy at v0


@dataclass
class TraceGpu:
    """The H100 of the trace on a virtual clock (module docstring)."""

    vt: VirtualTime
    trace: Trace = field(default_factory=Trace.load)
    idle_w: float = math.nan
    counter_phase_s: float = 0.037
    steps_run: int = 0
    _segs: list[_Segment] = field(default_factory=list)
    _v0s: list[float] = field(default_factory=list)
    _cursor: dict[int, float] = field(default_factory=dict)
    _energy_at_last_j: float = 0.0
    _last_end: tuple[float, float] | None = None  # (virtual end, trace position) of the last step

    def __post_init__(self) -> None:
        if math.isnan(self.idle_w):
            self.idle_w = self.trace.idle_w
        self._e_base_j = float(self.trace.energy_j[0])

    # -- training
    def step(self, batch_size: int) -> None:
        """One training step of ``batch_size``: the GPU is busy for the recorded step time."""
        run = self.trace.runs[batch_size]
        pos = self._cursor.get(batch_size, run.warmup_start_s)
        d = run.step_time_s(pos)
        if pos + d > run.train_end_s:  # loop over the 4 s of training
            pos = run.train_start_s
            d = run.step_time_s(pos)
        now = self.vt.now
        seg = _Segment(now, now + d, pos, self.true_energy_j(now))
        self._segs.append(seg)
        self._v0s.append(now)
        self.vt.advance(d)
        self._cursor[batch_size] = pos + d
        self._last_end = (seg.v1_s, pos + d)
        self.steps_run += 1

    def _segment(self, t_s: float) -> _Segment | None:
        """The last step that started at or before ``t_s``."""
        i = bisect.bisect_right(self._v0s, t_s) - 1
        return self._segs[i] if i >= 0 else None

    def position(self, t_s: float) -> float | None:
        """Trace position at virtual ``t_s`` while a step runs, else None (idle)."""
        seg = self._segment(t_s)
        if seg is None or t_s >= seg.v1_s:
            return None
        return seg.p0_s + (t_s - seg.v0_s)

    # -- readings
    def instant_w(self, t_s: float) -> float:
        pos = self.position(t_s)
        return self.idle_w if pos is None else self.trace.held(self.trace.instant_w, pos)

    def average_w(self, t_s: float) -> float:
        pos = self.position(t_s)
        return self.idle_w if pos is None else self.trace.held(self.trace.average_w, pos)

    def clock_mhz(self, t_s: float) -> float:
        pos = self.position(t_s)
        if pos is None:
            seg = self._segment(t_s)
            pos = seg.p0_s + (seg.v1_s - seg.v0_s) if seg is not None else self.trace.t_s[0]
        return self.trace.held(self.trace.clock_mhz, pos)

    def true_energy_j(self, t_s: float) -> float:
        """Energy since the start (J): the counter's interpolation while busy, idle_w idle."""
        seg = self._segment(t_s)
        if seg is None:
            first = self._segs[0].v0_s if self._segs else t_s
            return self.idle_w * (t_s - min(first, t_s))
        inside = min(t_s, seg.v1_s) - seg.v0_s
        lin = self.trace.energy_lin_j
        e = seg.e0_j + lin(seg.p0_s + inside) - lin(seg.p0_s)
        return e + self.idle_w * max(t_s - seg.v1_s, 0.0)

    def counter_j(self, t_s: float) -> float:
        """What the energy counter shows at ``t_s``: the true energy at its last latch."""
        p = COUNTER_PERIOD_S
        latched = math.floor((t_s - self.counter_phase_s) / p) * p + self.counter_phase_s
        return self._e_base_j + self.true_energy_j(min(latched, t_s))

    def held_readings(self, t0_s: float, t1_s: float) -> Iterator[tuple[float, float, float]]:
        """``(start, end, watts)``: the instant readings the sensor held over ``[t0_s,
        t1_s]`` in virtual time, one per recorded read while busy, idle stretches between."""
        t = t0_s
        ts = self.trace.t_s
        for seg in self._segs[max(bisect.bisect_right(self._v0s, t0_s) - 1, 0) :]:
            if seg.v0_s > t1_s:
                break
            a, b = max(seg.v0_s, t0_s), min(seg.v1_s, t1_s)
            if b <= a:
                continue
            if a > t:
                yield t, a, self.idle_w
            i = max(int(np.searchsorted(ts, seg.p0_s + (a - seg.v0_s), side="right")) - 1, 0)
            start = a
            while start < b:
                nxt = seg.v0_s + (float(ts[i + 1]) - seg.p0_s) if i + 1 < len(ts) else b
                end = min(nxt, b)
                yield start, end, float(self.trace.instant_w[i])
                start, i = end, i + 1
            t = b
        if t < t1_s:
            yield t, t1_s, self.idle_w

    def max_instant_w(self, t0_s: float, t1_s: float) -> float:
        """The highest instant reading the sensor showed in ``[t0_s, t1_s]``."""
        return max(w for _, _, w in self.held_readings(t0_s, t1_s))

    def shown_energy_j(self, t0_s: float, t1_s: float) -> float:
        """The integral of the instant readings the sensor showed over ``[t0_s, t1_s]`` (each
        held until the next): what a perfect sampler of the instant field would give."""
        return sum(w * (b - a) for a, b, w in self.held_readings(t0_s, t1_s))

    def over_cap_episodes(
        self, t0_s: float, t1_s: float, cap_w: float
    ) -> list[tuple[float, float]]:
        """The stretches of ``[t0_s, t1_s]`` whose held instant reading was above ``cap_w``."""
        out: list[tuple[float, float]] = []
        for a, b, w in self.held_readings(t0_s, t1_s):
            if w <= cap_w or b <= a:
                continue
            if out and abs(out[-1][1] - a) < 1e-9:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out


class ReplaySteps:
    """A profiler step factory: ``ReplaySteps(gpu)(b)`` is one training step of b."""

    def __init__(self, gpu: TraceGpu) -> None:
        self.gpu = gpu

    def __call__(self, batch_size: int) -> Callable[[], None]:
        return lambda: self.gpu.step(batch_size)


# ------------------------------------------------------------------------------ fake pynvml


GRAPHICS_CLOCKS_MHZ = (1980, 1965, 1410, 1005, 345)


@dataclass
class Faults:
    """Calls to fail: ``{name: [call numbers (1-based) that raise]}``; ``stuck_from_s``
    freezes the power readings from that virtual time until ``stuck_until_s``."""

    fail_calls: dict[str, set[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    stuck_from_s: float | None = None
    stuck_until_s: float = math.inf
    stuck_w: float | None = None


def make_trace_pynvml(
    gpu: TraceGpu, *, call_cost_s: float = 0.0, faults: Faults | None = None
) -> types.ModuleType:
    """A fake ``pynvml`` whose readings are ``gpu``'s; every device call costs
    ``call_cost_s`` of virtual time and may fail as ``faults`` says."""
    vt = gpu.vt
    faults = faults if faults is not None else Faults()
    nv = pynvml_module()
    nv.calls = []  # type: ignore[attr-defined]
    nv.power_limit_mw = 700_000  # type: ignore[attr-defined]
    nv.power_limit_range_mw = (200_000, 700_000)  # type: ignore[attr-defined]
    nv.locked = None  # type: ignore[attr-defined]

    def call(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            n = faults.counts[name] = faults.counts.get(name, 0) + 1
            nv.calls.append((name, vt.now))
            t_s = vt.now  # the reading is taken as the call starts
            vt.spend(call_cost_s)
            if n in faults.fail_calls.get(name, set()):
                raise NVMLError(999)
            return fn(t_s, *args)

        return wrapped

    def stuck(t_s: float, value_w: float) -> float:
        if faults.stuck_from_s is not None and faults.stuck_from_s <= t_s < faults.stuck_until_s:
            if faults.stuck_w is None:
                faults.stuck_w = value_w
            return faults.stuck_w
        return value_w

    def field_values(t_s: float, handle: Any, ids: list[int]) -> list[Any]:
        out = []
        for fid in ids:
            ok = fid == FI_DEV_POWER_INSTANT
            mw = round(1000 * stuck(t_s, gpu.instant_w(t_s))) if ok else 0
            out.append(
                types.SimpleNamespace(
                    fieldId=fid,
                    nvmlReturn=0 if ok else 3,
                    valueType=1,
                    value=types.SimpleNamespace(uiVal=mw),
                )
            )
        return out

    def set_limit(t_s: float, handle: Any, mw: int) -> None:
        lo, hi = nv.power_limit_range_mw
        if not lo <= mw <= hi:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        nv.power_limit_mw = int(mw)  # type: ignore[attr-defined]

    def set_locked(t_s: float, handle: Any, lo: int, hi: int) -> None:
        nv.locked = (lo, hi)  # type: ignore[attr-defined]

    def reset_locked(t_s: float, handle: Any) -> None:
        nv.locked = None  # type: ignore[attr-defined]

    table: dict[str, Callable[..., Any]] = {
        "nvmlInit": lambda t: None,
        "nvmlShutdown": lambda t: None,
        "nvmlDeviceGetCount": lambda t: 1,
        "nvmlDeviceGetHandleByIndex": lambda t, i: "gpu0",
        "nvmlDeviceGetHandleByUUID": lambda t, u: "gpu0",
        "nvmlDeviceGetName": lambda t, h: gpu.trace.gpu,
        "nvmlDeviceGetUUID": lambda t, h: "GPU-11111111-2222-3333-4444-555555555555",
        "nvmlDeviceGetMemoryInfo": lambda t, h: types.SimpleNamespace(total=85_520_809_984),
        "nvmlDeviceGetSupportedMemoryClocks": lambda t, h: [2619],
        "nvmlDeviceGetSupportedGraphicsClocks": lambda t, h, m: list(GRAPHICS_CLOCKS_MHZ),
        "nvmlDeviceGetTotalEnergyConsumption": lambda t, h: round(1000 * gpu.counter_j(t)),
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlDeviceGetPowerUsage": lambda t, h: round(1000 * stuck(t, gpu.average_w(t))),
        "nvmlDeviceGetClockInfo": lambda t, h, kind: int(gpu.clock_mhz(t)),
        "nvmlDeviceSetGpuLockedClocks": set_locked,
        "nvmlDeviceResetGpuLockedClocks": reset_locked,
        "nvmlDeviceGetPowerManagementLimit": lambda t, h: nv.power_limit_mw,
        "nvmlDeviceGetPowerManagementLimitConstraints": lambda t, h: nv.power_limit_range_mw,
        "nvmlDeviceSetPowerManagementLimit": set_limit,
        "nvmlSystemGetDriverVersion": lambda t: "580.159.04",
    }
    for name, fn in table.items():
        setattr(nv, name, call(name, fn))
    return nv


# ------------------------------------------------------------------------------ Jetson


class JetsonTraceBoard:
    """Writes the DERIVED Jetson trace (module docstring) into a fake sysfs tree's
    ``VDD_IN`` channel, held between INA3221 updates."""

    def __init__(self, gpu: TraceGpu, fake: Any, *, update_period_s: float | None = None) -> None:
        from fl_client.devices.sensors import INA3221_UPDATE_PERIOD_S

        self.gpu = gpu
        self.fake = fake
        self.update_period_s = update_period_s or INA3221_UPDATE_PERIOD_S
        self._k: int | None = None
        gpu.vt.hooks.append(self._on_time)
        self._on_time(gpu.vt.now)

    def power_w(self, t_s: float) -> float:
        """The derived board power the INA3221 shows at ``t_s`` (held since its update)."""
        p = self.update_period_s
        return JETSON_W_PER_H100_W * self.gpu.instant_w(math.floor(t_s / p) * p)

    def _on_time(self, t_s: float) -> None:
        k = math.floor(t_s / self.update_period_s)
        if k == self._k:
            return
        self._k = k
        ma = round(self.power_w(t_s) * 1e6 / JETSON_RAIL_MV)
        self.fake.set_channel(JETSON_RAIL, JETSON_RAIL_MV, ma)

    def true_energy_j(self, t0_s: float, t1_s: float) -> float:
        """The derived trace's energy over ``[t0_s, t1_s]`` (W held per update)."""
        p = self.update_period_s
        k, t, e = math.floor(t0_s / p), t0_s, 0.0
        while t < t1_s:
            nxt = min((k + 1) * p, t1_s)
            e += JETSON_W_PER_H100_W * self.gpu.instant_w(k * p) * max(nxt - t, 0.0)
            t, k = nxt, k + 1
        return e
