"""The cap guard: sampled power held against P_max, armed around training only.

A ``CapGuard`` watches the samples of one meter: power above ``p_max_w`` for ``window_s``
or longer calls its ``on_violation`` (the backend steps the GPU one level down), counted,
and the time above the cap is interpolated between samples. ``CapGuarded`` is what every
device with a guard shares (``with dev.cap_guard(p_max_w):``): the hardware backends feed it
their sampled power (``fl_client.devices.sampler``), the twin and the replay backend one
emulated step at a time (``guard_step``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from fl_client.devices.base import GPU_FREQ_MHZ, DeviceInfo, Measurement
from fl_client.power import parse_p_max_w

log = logging.getLogger(__name__)

DEFAULT_CAP_WINDOW_S = 1.0

_M = TypeVar("_M", bound=Measurement)


class CapGuard:
    """Watches sampled power against P_max during training.

    Power above ``p_max_w`` for ``window_s`` or longer calls ``on_violation`` (the backend
    steps the GPU frequency down one level), counted; time above the cap is interpolated.
    """

    def __init__(
        self,
        p_max_w: float,
        *,
        window_s: float = DEFAULT_CAP_WINDOW_S,
        on_violation: Callable[[], None] | None = None,
    ) -> None:
        if not math.isfinite(parse_p_max_w(p_max_w)):
            raise ValueError(f"p-max-w: the cap guard needs a finite cap > 0 W, got {p_max_w!r}")
        if not (math.isfinite(window_s) and window_s >= 0):
            raise ValueError(f"cap-window-s: must be ≥ 0 s, got {window_s!r}")
        self.p_max_w = float(p_max_w)
        self.window_s = float(window_s)
        self._on_violation = on_violation
        self.cap_violations = 0
        self.time_over_cap_s = 0.0
        self.step_down_errors = 0  # step-downs that raised (counted, logged once)
        self._last: tuple[float, float] | None = None
        self._over_since_s: float | None = None
        self._lock = threading.Lock()

    def update(self, t_s: float, power_w: float) -> None:
        fire = False
        with self._lock:
            cap = self.p_max_w
            crossing_s = t_s
            if self._last is not None:
                t_a, p_a = self._last
                dt = t_s - t_a
                if dt > 0:
                    if p_a > cap and power_w > cap:
                        self.time_over_cap_s += dt
                    elif p_a > cap or power_w > cap:
                        # Linear crossing between the two samples.
                        crossing_s = t_a + dt * (cap - p_a) / (power_w - p_a)
                        self.time_over_cap_s += (
                            (t_s - crossing_s) if power_w > cap else (crossing_s - t_a)
                        )
            self._last = (t_s, power_w)
            if power_w > cap:
                if self._over_since_s is None:
                    self._over_since_s = crossing_s
                if t_s - self._over_since_s >= self.window_s:
                    self.cap_violations += 1
                    self._over_since_s = t_s  # the next step down needs another full window
                    fire = True
            else:
                self._over_since_s = None
        if fire and self._on_violation is not None:
            try:
                self._on_violation()
            except Exception as err:  # the sampler thread must live on and keep counting
                self.step_down_errors += 1
                if self.step_down_errors == 1:
                    log.warning(
                        "cap guard: stepping the GPU down failed (%s: %s); still counting "
                        "the time over the %.3g W cap",
                        type(err).__name__,
                        err,
                        self.p_max_w,
                    )


def with_guard_figures(m: _M, guard: CapGuard | None) -> _M:
    """``m`` with the cap guard's ``cap_violations`` and ``time_over_cap_s`` (every meter's
    ``measurement``; without a guard, ``m`` as it is)."""
    if guard is not None:
        m.cap_violations = guard.cap_violations
        m.time_over_cap_s = guard.time_over_cap_s
    return m


def guard_step(guard: CapGuard | None, t0_s: float, t1_s: float, power_w: float) -> None:
    """Feed one emulated step (power ``power_w`` held over ``[t0_s, t1_s]``) to ``guard``.

    The digital twin and the replay backend report one power per step on an emulated clock;
    this gives the guard the two samples that bracket the step.
    """
    if guard is not None:
        guard.update(t0_s, power_w)
        guard.update(t1_s, power_w)


class CapGuarded:
    """The cap guard of a device: armed around training only, by ``with dev.cap_guard(p):``.

    Profiling must measure the configurations above the cap (that is how it finds the
    feasible ones), so the guard is off unless armed. While armed, meters opened inside the
    block get a ``CapGuard`` from ``_new_guard()`` that calls ``step_down_knob_value``
    whenever power stays above P_max for ``cap_window_s``. Subclasses set ``_info`` and
    implement ``step_down_knob_value``.
    """

    _info: DeviceInfo
    cap_window_s: float = DEFAULT_CAP_WINDOW_S
    _armed_p_max_w: float | None = None

    @property
    def info(self) -> DeviceInfo:
        return self._info

    @property
    def knob_values(self) -> tuple[float, ...]:
        """The frequency table (ascending) of ``info``."""
        return self._info.knob_values

    def step_down_knob_value(self) -> float | None:
        """Lock one frequency level lower; None when not locked or already lowest."""
        raise NotImplementedError

    @contextmanager
    def cap_guard(self, p_max_w: float | None, *, window_s: float | None = None) -> Iterator[None]:
        """Arm the guard at ``p_max_w`` (None or inf: no cap, nothing armed) inside the block."""
        armed = p_max_w is not None and not math.isinf(p_max_w)
        window = self.cap_window_s if window_s is None else window_s
        if p_max_w is not None and armed:
            CapGuard(p_max_w, window_s=window)  # validate now, not in the sampler thread
        saved = (self._armed_p_max_w, self.cap_window_s)
        self._armed_p_max_w, self.cap_window_s = (p_max_w if armed else None), window
        try:
            yield
        finally:
            self._armed_p_max_w, self.cap_window_s = saved

    def _new_guard(self) -> CapGuard | None:
        p_max_w = self._armed_p_max_w
        if p_max_w is None:
            return None
        window_s = self.cap_window_s
        backend = self._info.backend
        stuck_told = False

        knob = getattr(self, "knob", GPU_FREQ_MHZ)

        def step_down() -> None:
            nonlocal stuck_told
            new_value = self.step_down_knob_value()
            if new_value is not None:
                log.warning(
                    "%s: power above P_max %.2f W for %.1f s: %s stepped down to %g %s",
                    backend,
                    p_max_w,
                    window_s,
                    knob.label,
                    new_value,
                    knob.unit,
                )
            elif not stuck_told:  # said once; the violations keep being counted
                stuck_told = True
                log.warning(
                    "%s: power above P_max %.2f W for %.1f s and the %s cannot go "
                    "lower (lowest level, or not set): the cap is not met",
                    backend,
                    p_max_w,
                    window_s,
                    knob.label,
                )

        return CapGuard(p_max_w, window_s=window_s, on_violation=step_down)
