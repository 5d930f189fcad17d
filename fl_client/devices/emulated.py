"""What the emulated backends (the digital twin, ``replay``) share: an emulated clock and
the meter that accounts each step on it.

Every step's ``fn`` runs for real on the host (the model really trains); the step's device
time, average and peak power come from the backend's model or table and move the device's
emulated clock on. The cap guard sees each step's power held over its emulated time.
"""

from __future__ import annotations

from fl_client.devices.base import Measurement
from fl_client.devices.guard import CapGuard, CapGuarded, guard_step, with_guard_figures


class EmulatedDevice(CapGuarded):
    """A device on an emulated clock: ``now_s`` is the device time its steps added up to.

    Subclasses set ``_info`` and implement ``current_knob_value``, ``restore`` and
    ``step_down_knob_value``.
    """

    _clock_s: float = 0.0

    def current_knob_value(self) -> float:
        raise NotImplementedError

    def now_s(self) -> float:
        return self._clock_s

    def advance_clock(self, dt_s: float) -> None:
        """Move the emulated clock on by one step's device time."""
        self._clock_s += dt_s

    def restore(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.restore()


class EmulatedMeter:
    """Accounts steps of modelled time and power on ``device``'s clock, feeding ``guard``.

    With a ``guard`` (armed by ``device.cap_guard(p_max_w)``), each step's peak power is
    held over its emulated time and checked against the cap; the guard steps the device's
    frequency down one level when power stays above P_max for its window.
    """

    def __init__(self, device: EmulatedDevice, guard: CapGuard | None = None) -> None:
        self._device = device
        self._guard = guard
        self._m = Measurement()

    def account(
        self, batch_size: int, time_s: float, avg_power_w: float, peak_power_w: float
    ) -> None:
        """One step of ``batch_size`` samples that took ``time_s`` at these powers."""
        t0_s = self._device.now_s()
        self._device.advance_clock(time_s)
        m = self._m
        m.time_s += time_s
        m.energy_j += avg_power_w * time_s
        m.peak_power_w = max(m.peak_power_w, peak_power_w)
        m.power_samples_w.append(peak_power_w)
        m.steps += 1
        m.samples += batch_size
        guard_step(self._guard, t0_s, self._device.now_s(), peak_power_w)

    @property
    def measurement(self) -> Measurement:
        return with_guard_figures(self._m, self._guard)

    @property
    def time_s(self) -> float:
        return self._m.time_s

    def power_samples_since(self, index: int) -> list[float]:
        return self._m.power_samples_w[index:]
