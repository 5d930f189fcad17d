"""The power cap below the node: one parser for ``p-max-w`` and ``cap-margin``, and the cap
with its margin (``PowerLimit``), the one value every feasibility check judges peaks by.

``contract.Cap`` (the bare cap on the wire and on disk), the selector, profiling, LUTs and
the device layer's B1 bands and cap guard all parse a cap here. Pure Python: no NumPy
needed, nothing of the rest of ``fl_client`` imported.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

#: The spellings of "no cap" (any case, spaces around ignored); ``None`` and ``math.inf`` too.
NO_CAP_WORDS = ("none", "", "inf", "+inf", "infinity")


def parse_p_max_w(value: object, key: str = "p-max-w") -> float:
    """A power cap P_max in W from any door, ``math.inf`` for no cap.

    Accepts a number of watts > 0 (``4.5``, ``"4.5"``, its label ``"4.5 W"``, a NumPy
    scalar) or no cap as ``None`` (JSON null), ``"none"``, ``""``, ``"inf"`` or
    ``math.inf``. Anything else is a ValueError naming ``key``.
    """
    if isinstance(value, float) and 0 < value <= math.inf:  # the common case
        return value
    if value is None:
        return math.inf
    expected = f"{key}: expected a number of watts > 0 or 'none', got {value!r}"
    watts: float
    if isinstance(value, str):
        text = value.strip().lower()
        text = text[:-1].strip() if text.endswith("w") else text  # its own label, "4.5 W"
        if text in NO_CAP_WORDS:
            return math.inf
        try:
            watts = float(text)
        except ValueError:
            raise ValueError(expected) from None
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        watts = float(value)
    else:
        raise ValueError(expected)
    if math.isnan(watts) or watts <= 0:
        raise ValueError(f"{key}: must be > 0 W (or 'none' for no cap), got {value!r}")
    return watts


def check_cap_margin(cap_margin: object) -> float:
    """``cap-margin``: the share of P_max kept free of profiled peak power, in [0, 1).

    A ValueError naming the key for a non-number, NaN, a negative value or one ≥ 1.
    """
    if isinstance(cap_margin, float) and 0.0 <= cap_margin < 1.0:  # the common case
        return cap_margin
    allowed = "a number in [0, 1) (a share of P_max, e.g. 0.05)"
    if isinstance(cap_margin, bool) or not isinstance(cap_margin, numbers.Real):
        raise ValueError(f"cap-margin: must be {allowed}; got {cap_margin!r}")
    value = float(cap_margin)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"cap-margin: must be {allowed}; got {cap_margin!r}")
    return value


@dataclass(frozen=True)
class PowerLimit:
    """The power cap with its margin: the one value every feasibility check below the node
    judges a cell's robust peak by.

    Attributes
    ----------
    p_max_w : float
        The bare cap P_max in W (``math.inf``: no cap); anything ``parse_p_max_w`` takes is
        accepted and stored as a float.
    cap_margin : float
        ``cap-margin``: the share of P_max kept free of profiled peak power, in [0, 1)
        (``check_cap_margin``); 0 without a cap. One profiled peak is a noisy sample
        of a cell's power and training runs many more steps than profiling: keeping
        profiled peaks this share below P_max leaves room for the sensor's excursions.
    """

    p_max_w: float = math.inf
    cap_margin: float = 0.0

    def __post_init__(self) -> None:
        cap = parse_p_max_w(self.p_max_w)
        margin = check_cap_margin(self.cap_margin)
        object.__setattr__(self, "p_max_w", cap)
        object.__setattr__(self, "cap_margin", margin if math.isfinite(cap) else 0.0)

    @classmethod
    def of(cls, limit: PowerLimit | float | str | None) -> PowerLimit:
        """``limit`` itself, or a bare cap (a number, ``"none"``, None) with no margin."""
        return limit if isinstance(limit, PowerLimit) else cls(limit)  # type: ignore[arg-type]

    @property
    def capped(self) -> bool:
        return math.isfinite(self.p_max_w)

    @property
    def cap_w(self) -> float | None:
        """The bare cap in W, None without one (the form ``Selection.p_max_w`` keeps)."""
        return self.p_max_w if self.capped else None

    @property
    def limit_w(self) -> float:
        """What a robust peak must stay below: ``P_max · (1 − cap_margin)`` (inf: no cap)."""
        return self.p_max_w * (1.0 - self.cap_margin) if self.capped else math.inf


__all__ = ["NO_CAP_WORDS", "PowerLimit", "check_cap_margin", "parse_p_max_w"]
