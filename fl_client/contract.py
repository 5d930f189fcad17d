"""What crosses Flower and what lands on disk: one type per message and per record row.

* ``Cap`` — a power cap, parsed once from any door ("none", ``inf``, ``null``, a number).
* ``TrainConfig`` — the TRAIN ``ConfigRecord`` the server builds and the node parses once.
* ``NodeDescriptor`` — the QUERY reply.
* ``TrainReport`` — the TRAIN reply's ``MetricRecord``; its keys are its fields.
* ``NodeRow`` / ``RoundRow`` — one line of ``nodes.jsonl`` / ``rounds.jsonl``.

Every key is kebab-case and derived from the dataclass field (``train_time_s`` →
``train-time-s``), so a key is written in one place. On the wire (Flower records) no cap is
``inf``; on disk every record is standard JSON: no cap, an unknown value and "not a number"
are ``null`` (``to_record``), never ``Infinity`` or ``NaN``. No Flower import: the records
are plain dicts that ``client_app`` and the strategy wrap in Flower's records.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from fl_client.devices.base import GPU_FREQ_MHZ, GPU_POWER_LIMIT_W
from fl_client.names import check_safe_name
from fl_client.power import PowerLimit, parse_p_max_w

#: The selection rules a round can run (``fl_client.selector.select`` implements each).
METHODS = ("power-aware", "b1", "b2", "oracle", "fixed")

#: Version of the record files (rounds.jsonl, nodes.jsonl, summary.json). 2: kebab-case,
#: training and profiling energy apart, nulls. 3: idle waiting in the headline
#: (``idle-accounting``), energy by node role. 4: ``round-to-target`` by ``target-window``.
RECORD_VERSION = 4


class SettingsError(ValueError):
    """A run, node or message setting is missing or invalid; the message names the key."""


def key_of(name: str) -> str:
    """The record key of a Python field name: ``train_time_s`` → ``train-time-s``."""
    return name.replace("_", "-")


def to_record(value: Any) -> Any:
    """``value`` as standard JSON: inf / NaN → None, tuples → lists, ``Cap`` → its record
    form, nested dicts and lists converted alike."""
    if isinstance(value, Cap):
        return value.to_record()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): to_record(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_record(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return to_record(value.tolist())
    return value


# --------------------------------------------------------------------------- the cap


@dataclass(frozen=True, order=True)
class Cap:
    """A power cap P_max in watts; ``Cap.NONE`` (``watts`` = inf) is "no cap".

    Parse every door through ``Cap.parse``; write it with ``to_wire`` (Flower records:
    a float, inf for none) or ``to_record`` (JSON: a number, null for none).
    """

    watts: float

    NONE: ClassVar[Cap]

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "watts", parse_p_max_w(self.watts))
        except ValueError as err:
            raise SettingsError(str(err)) from None

    @classmethod
    def parse(cls, value: object, key: str = "p-max-w") -> Cap:
        """A cap from a setting, a record or its own label: a number of W > 0 (``4.5``,
        ``"4.5"``, ``"4.5 W"``), or no cap as ``"none"``, ``""``, ``None`` (JSON null),
        ``"inf"`` or ``math.inf``."""
        if isinstance(value, Cap):
            return value
        try:
            watts = parse_p_max_w(value, key)  # the one parser (``fl_client.power``)
        except ValueError as err:
            raise SettingsError(str(err)) from None
        return cls.NONE if math.isinf(watts) else cls(watts)

    @property
    def capped(self) -> bool:
        return math.isfinite(self.watts)

    @property
    def label(self) -> str:
        """``"4.5 W"``, or ``"none"``."""
        return f"{self.watts:g} W" if self.capped else "none"

    @property
    def setting(self) -> str:
        """The form a user types in a setting: ``"4.5"`` or ``"none"``."""
        return f"{self.watts:g}" if self.capped else "none"

    def with_margin(self, cap_margin: float) -> PowerLimit:
        """This cap with ``cap-margin``: the one value every check below the node judges
        profiled peaks by (``PowerLimit.limit_w``: P_max less its margin, inf without a cap)."""
        try:
            return PowerLimit(self.watts, cap_margin)
        except ValueError as err:
            raise SettingsError(str(err)) from None

    def to_wire(self) -> float:
        return float(self.watts)

    def to_record(self) -> float | None:
        return float(self.watts) if self.capped else None

    def __str__(self) -> str:
        return self.label


Cap.NONE = Cap(math.inf)


# --------------------------------------------------------------------------- small parsers


def parse_int_list(value: object, key: str) -> list[int]:
    """``"4,8,16"`` or ``[4, 8, 16]`` → ``[4, 8, 16]``."""
    items: list[object]
    if isinstance(value, str):
        items = [s for s in (p.strip() for p in value.split(",")) if s]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise SettingsError(f"{key}: expected a comma-separated list of integers, got {value!r}")
    try:
        return [int(str(v)) for v in items]
    except ValueError:
        raise SettingsError(f"{key}: expected integers, got {value!r}") from None


def parse_batch_sizes(value: object, key: str = "batch-sizes") -> list[int]:
    """Non-empty, positive, strictly ascending batch sizes."""
    sizes = parse_int_list(value, key)
    if not sizes:
        raise SettingsError(f"{key}: must not be empty (e.g. '4,8,16,32,64,128')")
    if any(b <= 0 for b in sizes):
        raise SettingsError(f"{key}: batch sizes must be positive, got {sizes}")
    if any(b2 <= b1 for b1, b2 in itertools.pairwise(sizes)):
        raise SettingsError(f"{key}: must be strictly ascending, got {sizes}")
    return sizes


def _required(
    cfg: Mapping[str, Any], key: str, where: str, kind: Callable[[Any], Any] | None = None
) -> Any:
    if key not in cfg:
        raise SettingsError(f"{key}: missing from the {where}")
    return cfg[key] if kind is None else _as(cfg[key], kind, key)


def _renamed(cfg: Mapping[str, Any]) -> dict[str, Any]:  # an older peer's profiling keys
    return {("cells-knob-value" if k == "cells-freq-mhz" else k): v for k, v in cfg.items()}


def _as(value: Any, kind: Callable[[Any], Any], key: str) -> Any:
    """``kind(value)``; a value of the wrong form is a SettingsError naming ``key``."""
    try:
        return kind(value)
    except SettingsError:
        raise
    except (TypeError, ValueError):
        raise SettingsError(f"{key}: malformed value {value!r}") from None


def _floats(value: Any) -> tuple[float, ...]:
    """A list of numbers (not a string) as floats."""
    if isinstance(value, str | bytes):
        raise TypeError(f"expected a list of numbers, got {value!r}")
    return tuple(float(x) for x in value)


def _flag(value: object) -> bool:
    """A boolean of a record: True / False (or 1 / 0)."""
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise TypeError(f"expected a boolean, got {value!r}")


def _positive(value: object, key: str) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SettingsError(f"{key}: expected a number > 0, got {value!r}") from None
    if not (x > 0 and math.isfinite(x)):
        raise SettingsError(f"{key}: must be a finite number > 0, got {value!r}")
    return x


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class TrainConfig:
    """The TRAIN config one node gets for one round (server → node).

    ``batch_sizes`` is B restricted to what fits the node's memory and ``r`` is aligned
    with it (Eq. 3). ``deadline_s``, ``time_calibration`` and ``critical`` (whether this
    node sets the round's pace) come with the round plan (``balance``) from round 2;
    ``fixed_*`` only with ``method = "fixed"``.
    """

    server_round: int
    method: str
    model: str
    batch_sizes: tuple[int, ...]
    r: tuple[float, ...]
    lr_ref: float
    b_ref: int
    local_epochs: int
    fixed_batch_size: int | None = None
    fixed_freq_mhz: float | None = None
    deadline_s: float | None = None
    time_calibration: float = 1.0
    #: Fleet-shared profiling: the LUT of the node's kind (``fl_client.lut.LUT`` JSON), to
    #: select from after verifying the chosen cell; None: the node profiles its own.
    kind_lut: str | None = None
    #: The round plan: this node sets the round's pace (it takes its fastest cell)
    critical: bool = False
    #: sha256 of the checkpoint the run started from (``initial-weights``); None: the
    #: model's seeded random weights. Keys the oracle's r cache, so an r from other weights
    #: is never reused (the node never sees the checkpoint's file).
    initial_weights_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SettingsError(
                f"method: unknown value {self.method!r}; allowed: {', '.join(METHODS)}"
            )
        b = tuple(parse_batch_sizes(list(self.batch_sizes)))
        if len(self.r) != len(b):
            raise SettingsError(f"r: has {len(self.r)} values but batch-sizes has {len(b)}")
        r = tuple(float(x) for x in self.r)
        if not all(0.0 < x <= 1.0 for x in r):
            raise SettingsError(f"r: every value must be in (0, 1], got {list(r)}")
        if self.method == "fixed" and (self.fixed_batch_size is None or not self.fixed_freq_mhz):
            raise SettingsError("method: 'fixed' needs fixed-batch-size and fixed-freq-mhz")
        if self.deadline_s is not None:
            object.__setattr__(self, "deadline_s", _positive(self.deadline_s, "deadline-s"))
        calibration = float(self.time_calibration)
        object.__setattr__(
            self,
            "time_calibration",
            calibration if calibration > 0 and math.isfinite(calibration) else 1.0,
        )
        sha = self.initial_weights_sha256
        if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise SettingsError(f"initial-weights-sha256: expected 64 hex digits, got {sha!r}")
        object.__setattr__(self, "batch_sizes", b)
        object.__setattr__(self, "r", r)

    def to_config(self) -> dict[str, Any]:
        """The ``ConfigRecord`` content (None fields left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[key_of(f.name)] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> TrainConfig:
        """Parse a TRAIN config; a missing or malformed key is a SettingsError naming it."""
        where = "TRAIN config"
        known = {key_of(f.name) for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise SettingsError(f"{', '.join(unknown)}: not part of the {where}")

        def opt(key: str, kind: type) -> Any:
            return None if cfg.get(key) is None else _as(cfg[key], kind, key)

        return cls(
            server_round=_required(cfg, "server-round", where, int),
            method=str(_required(cfg, "method", where)),
            model=str(_required(cfg, "model", where)),
            batch_sizes=tuple(parse_batch_sizes(_required(cfg, "batch-sizes", where))),
            r=_required(cfg, "r", where, _floats),
            lr_ref=_positive(_required(cfg, "lr-ref", where), "lr-ref"),
            b_ref=_required(cfg, "b-ref", where, int),
            local_epochs=_required(cfg, "local-epochs", where, int),
            fixed_batch_size=opt("fixed-batch-size", int),
            fixed_freq_mhz=opt("fixed-freq-mhz", float),
            deadline_s=opt("deadline-s", float),
            time_calibration=_as(cfg.get("time-calibration", 1.0), float, "time-calibration"),
            kind_lut=opt("kind-lut", str),
            critical=_as(cfg.get("critical", False), _flag, "critical"),
            initial_weights_sha256=opt("initial-weights-sha256", str),
        )


def format_schedule(schedule: Sequence[tuple[int, Cap]]) -> str:
    """A cap schedule in its setting form: ``"1:7,5:4.5,9:none"``."""
    return ",".join(f"{r}:{cap.setting}" for r, cap in schedule)


#: The knob's names in the QUERY reply (``Knob.setting``) and the keys of its values there
#: (``NodeDescriptor.knob_values``): a frequency table in MHz, or power limits in W.
KNOB_FREQUENCY, KNOB_POWER_LIMIT = GPU_FREQ_MHZ.setting, GPU_POWER_LIMIT_W.setting
FREQS_KEY, POWER_LIMITS_KEY = "gpu-freqs-mhz", "gpu-power-limits-w"


@dataclass(frozen=True)
class NodeDescriptor:
    """The QUERY reply: who the node is, its device, its cap, the largest b that fits."""

    node_name: str
    partition_id: int
    device: str
    backend: str
    p_max: Cap
    p_max_schedule: str  # ``format_schedule`` form; "" without a schedule
    knob_values: tuple[float, ...]
    memory_bytes: int
    power_rail: str
    max_batch_size: int
    cap_margin: float = 0.0  # the node's share of P_max kept free of profiled peaks
    #: The lowest GPU frequency worth profiling under every cap the node runs under: B1's
    #: frequency for its lowest cap (its safe band holds the largest b, so every b's fastest
    #: feasible frequency is at or above it); 0: none known (no bands, or a cap below them)
    profile_floor_mhz: float = 0.0
    #: What ``knob_values`` holds: the GPU frequency (``frequency``, MHz) or the GPU power
    #: limit (``power-limit``, W). On the wire a power limit's values go under
    #: ``gpu-power-limits-w`` with ``knob``, never under ``gpu-freqs-mhz``; the frequency
    #: path sends neither key, as before.
    knob: str = "frequency"

    def to_config(self) -> dict[str, Any]:
        # the knob's values go on the wire under the knob's own key and unit
        values_key = FREQS_KEY if self.knob == KNOB_FREQUENCY else POWER_LIMITS_KEY
        keys = {"p_max": "p-max-w", "knob_values": values_key}
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            wire = value.to_wire() if isinstance(value, Cap) else value
            out[keys.get(f.name, key_of(f.name))] = list(wire) if isinstance(wire, tuple) else wire
        if self.knob == KNOB_FREQUENCY:
            del out["knob"]
        return out

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> NodeDescriptor:
        where = "QUERY reply"
        knob = str(cfg.get("knob", KNOB_FREQUENCY))
        if knob not in (KNOB_FREQUENCY, KNOB_POWER_LIMIT):
            raise ValueError(
                f"{where}: knob: unknown value {knob!r}; allowed: {KNOB_FREQUENCY}, "
                f"{KNOB_POWER_LIMIT}"
            )
        values_key = POWER_LIMITS_KEY if knob == KNOB_POWER_LIMIT else FREQS_KEY
        for key in ("node-name", "device", "backend"):  # file names on the server (LUT library)
            check_safe_name(_required(cfg, key, where), key, where, SettingsError)
        return cls(
            node_name=str(_required(cfg, "node-name", where)),
            partition_id=_required(cfg, "partition-id", where, int),
            device=str(_required(cfg, "device", where)),
            backend=str(_required(cfg, "backend", where)),
            p_max=Cap.parse(_required(cfg, "p-max-w", where)),
            p_max_schedule=str(cfg.get("p-max-schedule", "")),
            knob_values=_required(cfg, values_key, where, _floats),
            memory_bytes=_required(cfg, "memory-bytes", where, int),
            power_rail=str(cfg.get("power-rail", "")),
            max_batch_size=_required(cfg, "max-batch-size", where, int),
            cap_margin=_as(cfg.get("cap-margin", 0.0), float, "cap-margin"),
            profile_floor_mhz=_as(cfg.get("profile-floor-mhz", 0.0), float, "profile-floor-mhz"),
            knob=knob,
        )

    def to_record(self) -> dict[str, Any]:
        return {**to_record(self.to_config()), "p-max-w": self.p_max.to_record()}

    def all_caps(self) -> tuple[Cap, ...]:
        """Every cap the node runs under: its schedule's steps, else ``p_max``."""
        steps = [
            Cap.parse(item.partition(":")[2]) for item in self.p_max_schedule.split(",") if item
        ]
        return tuple(dict.fromkeys(steps)) or (self.p_max,)

    def cap_at(self, server_round: int) -> Cap:
        """The node's cap in ``server_round`` (its schedule's step, else ``p_max``)."""
        cap = self.p_max
        for item in filter(None, self.p_max_schedule.split(",")):
            first, _, step = item.partition(":")
            if server_round >= int(first):
                cap = Cap.parse(step)
        return cap


@dataclass(frozen=True)
class TrainReport:
    """The TRAIN reply's metrics (node → server): one field, one key, one meaning.

    Device time and energy are apart for training (the round's local epochs at the chosen
    (b, f)) and profiling (every measurement that is not training: LUT profiling, shared
    cells checked, drift checks). ``idle_power_w`` is NaN where the backend does not
    know it. The optional fields are sent only when the round had them.
    """

    num_examples: float
    train_time_s: float
    train_energy_j: float
    avg_power_w: float
    peak_power_w: float
    idle_power_w: float
    p_max_w: float  # the round's cap, inf = none (``Cap.to_wire``)
    cap_margin: float
    batch_size: float
    gpu_freq_mhz: float
    profile_time_s: float
    profile_energy_j: float
    cap_violations: float  # the cap guard's step-downs
    time_over_cap_s: float
    train_loss: float
    lut_from_cache: float = 0.0
    lut_shared: float = 0.0  # 1: selected from the kind's fleet-shared LUT
    # What the LUT predicted for this local work (methods that select from a LUT)
    predicted_time_s: float | None = None
    # The round plan (``balance``): the node's best round time, its deadline and slack, and
    # with ``balance = "energy"`` what its cell is predicted to save
    fastest_time_s: float | None = None
    predicted_energy_saved_j: float | None = None
    # ... with ``steps``: the share of its local work it ran; 1 when max-work-share bound it
    work_share: float | None = None
    work_share_capped: float | None = None
    deadline_s: float | None = None
    slack_s: float | None = None
    deadline_miss: float | None = None
    # Fleet-shared profiling: the chosen cell measured against the kind's LUT
    kind_verify_deviation: float | None = None
    kind_reprofiled: float | None = None
    # Drift checks
    drift_deviation: float | None = None
    drift_reprofiled: float | None = None
    drift_batch_size: float | None = None
    drift_freq_mhz: float | None = None
    # The trained round's peak power against its LUT cell (peak + peak-sigma-k·σ)
    lut_power_deviation: float | None = None
    lut_set_aside: float | None = None
    # Local work: the optimizer steps of the round's training and their learning rate
    # (FedNova's normalisation, ``strategies.fednova``; absent from older nodes)
    local_steps: float | None = None
    local_lr: float | None = None
    # Under the power-limit knob: the limit that ran, in W (``gpu_freq_mhz`` is then the
    # clock sampled while training, NaN where none was read), and the drift check's
    gpu_power_limit_w: float | None = None
    # re-selection at a power limit, in W (instead of ``drift_freq_mhz``)
    drift_power_limit_w: float | None = None

    @property
    def cap(self) -> Cap:
        return Cap.parse(self.p_max_w)

    @classmethod
    def required_keys(cls) -> tuple[str, ...]:
        return tuple(key_of(f.name) for f in fields(cls) if f.default is dataclasses.MISSING)

    def to_metrics(self) -> dict[str, float]:
        """The ``MetricRecord`` content (None fields left out)."""
        return {
            key_of(f.name): float(getattr(self, f.name))
            for f in fields(self)
            if getattr(self, f.name) is not None
        }

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> TrainReport:
        """Parse a reply's metrics; a missing required key is a ValueError naming it."""
        missing = [k for k in cls.required_keys() if k not in metrics]
        if missing:
            raise ValueError(f"reply lacks metrics: {', '.join(missing)}")
        known = {key_of(f.name): f.name for f in fields(cls)}
        unknown = sorted(set(metrics) - set(known))
        if unknown:
            raise ValueError(f"reply has unknown metrics: {', '.join(unknown)}")
        return cls(**{known[k]: float(v) for k, v in metrics.items()})

    def to_record(self) -> dict[str, Any]:
        """Standard-JSON form (``p-max-w`` null without a cap, NaN as null)."""
        return to_record(self.to_metrics())


@dataclass(frozen=True)
class ProfileRequest:
    """A fleet-shared profiling exchange (server → node, message ``train.profile``): the
    cells of its kind's LUT this node measures, each as ``warmup_steps`` + ``steps`` real
    minibatches at (b, f). With ``steps_train`` the minibatches are the node's own data and
    their updates are kept (Adam, lr scaled for b from ``lr_ref`` at ``b_ref``), so
    profiling also moves the model; else they are synthetic and the model is unchanged."""

    server_round: int
    model: str
    batch_sizes: tuple[int, ...]
    cells_b: tuple[int, ...]
    cells_knob_value: tuple[float, ...]
    lr_ref: float
    b_ref: int
    steps_train: bool = False
    warmup_steps: int = 1
    steps: int = 3

    def __post_init__(self) -> None:
        if len(self.cells_b) != len(self.cells_knob_value) or not self.cells_b:
            raise SettingsError("cells: need as many batch sizes as knob values, at least one")
        unknown = sorted(set(self.cells_b) - set(self.batch_sizes))
        if unknown:
            raise SettingsError(f"cells: batch sizes {unknown} are not in batch-sizes")

    @property
    def cells(self) -> list[tuple[int, float]]:
        return list(zip(self.cells_b, self.cells_knob_value, strict=True))

    def to_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[key_of(f.name)] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ProfileRequest:
        where, cfg = "profile request", _renamed(cfg)
        return cls(
            server_round=_required(cfg, "server-round", where, int),
            model=str(_required(cfg, "model", where)),
            batch_sizes=tuple(parse_batch_sizes(_required(cfg, "batch-sizes", where))),
            cells_b=tuple(int(b) for b in _required(cfg, "cells-b", where, _floats)),
            cells_knob_value=_required(cfg, "cells-knob-value", where, _floats),
            lr_ref=_positive(_required(cfg, "lr-ref", where), "lr-ref"),
            b_ref=_required(cfg, "b-ref", where, int),
            steps_train=bool(cfg.get("steps-train", False)),
            warmup_steps=_as(cfg.get("warmup-steps", 1), int, "warmup-steps"),
            steps=_as(cfg.get("steps", 3), int, "steps"),
        )


@dataclass(frozen=True)
class CellsReport:
    """The reply to a ``ProfileRequest`` (a ``MetricRecord``): per measured cell its time per
    sample and peak / average power, aligned with ``cells_b`` / ``cells_knob_value``; the
    device time and energy of the whole exchange; the samples its steps trained on; per cell
    the σ of its measured steps' peaks (NaN: fewer than 2 steps; absent from a node that does
    not record σ, which counts as σ = 0 in selection)."""

    cells_b: tuple[float, ...]
    cells_knob_value: tuple[float, ...]
    time_per_sample_s: tuple[float, ...]
    peak_power_w: tuple[float, ...]
    avg_power_w: tuple[float, ...]
    profile_time_s: float
    profile_energy_j: float
    num_examples: float  # samples the kept training steps processed (0: synthetic steps)
    peak_sigma_w: tuple[float, ...] = ()

    #: Keys a reply may lack (older nodes): their field's default applies.
    OPTIONAL = ("peak-sigma-w",)

    def __post_init__(self) -> None:
        n = len(self.cells_b)
        per_cell = [*fields(self)[1:5], *([fields(self)[8]] if self.peak_sigma_w else [])]
        for f in per_cell:
            if len(getattr(self, f.name)) != n:
                raise ValueError(
                    f"{key_of(f.name)}: has {len(getattr(self, f.name))} values, cells-b has {n}"
                )

    def measurements(self) -> list[tuple[int, float, tuple[float, ...]]]:
        """Per cell ``(b, f, (time per sample, peak, average power, σ))``; σ is NaN when the
        node did not record it."""
        sigmas = self.peak_sigma_w or (math.nan,) * len(self.cells_b)
        return [
            (int(b), float(f), (t, p, a, sd))
            for b, f, t, p, a, sd in zip(
                self.cells_b,
                self.cells_knob_value,
                self.time_per_sample_s,
                self.peak_power_w,
                self.avg_power_w,
                sigmas,
                strict=True,
            )
        ]

    def to_metrics(self) -> dict[str, Any]:
        return {
            key_of(f.name): list(v) if isinstance(v := getattr(self, f.name), tuple) else float(v)
            for f in fields(self)
        }

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> CellsReport:
        metrics = _renamed(metrics)
        missing = [
            key_of(f.name)
            for f in fields(cls)
            if key_of(f.name) not in metrics and key_of(f.name) not in cls.OPTIONAL
        ]
        if missing:
            raise ValueError(f"profile reply lacks: {', '.join(missing)}")
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if key_of(f.name) not in metrics:
                continue
            v = metrics[key_of(f.name)]
            kw[f.name] = tuple(float(x) for x in v) if isinstance(v, list | tuple) else float(v)
        return cls(**kw)


# --------------------------------------------------------------------------- record rows


@dataclass
class NodeRow:
    """One node in one round (a line of ``nodes.jsonl``): its report, or why it has none.

    ``p_max`` is the node's cap that round, also when it failed.
    """

    server_round: int
    node_id: int
    node_name: str
    device: str
    p_max: Cap
    ok: bool
    report: TrainReport | None = None
    error: str = ""
    # Fleet-shared profiling before this round's training: this node's slices
    shared_time_s: float = 0.0
    shared_energy_j: float = 0.0

    def to_record(self) -> dict[str, Any]:
        head = {
            "server-round": self.server_round,
            "node-name": self.node_name,
            "node-id": self.node_id,
            "device": self.device,
            "ok": self.ok,
            "error": self.error,
        }
        body = {} if self.report is None else self.report.to_record()
        shared = {"shared-time-s": self.shared_time_s, "shared-energy-j": self.shared_energy_j}
        return {**head, **body, **shared, "p-max-w": self.p_max.to_record()}


@dataclass
class RoundRow:
    """One round of the run (a line of ``rounds.jsonl``); times are device time."""

    server_round: int
    accuracy: float
    loss: float
    round_time_s: float
    sim_time_s: float
    # The fleet's energy as the run's ``idle-accounting`` counts it (``on``: training,
    # profiling and idle waiting; ``off``: training and profiling), this round / cumulative
    round_energy_j: float
    fleet_energy_j: float
    # Training and profiling, summed over nodes (this round / cumulative)
    round_busy_energy_j: float
    fleet_busy_energy_j: float
    # Idle energy of the nodes waiting for the slowest one (this round / cumulative)
    round_idle_energy_j: float
    fleet_idle_energy_j: float
    nodes_ok: int
    nodes_failed: int
    failed: list[str] = field(default_factory=list)
    # The round plan (null / 0 without a deadline this round)
    deadline_s: float | None = None
    deadline_misses: int = 0
    predicted_energy_saved_j: float = 0.0
    warnings: list[str] = field(default_factory=list)
    # Node roles: the critical node is the round's slowest (it sets the round time), the
    # slack nodes are the others that reported; each role's training + profiling (busy)
    # and idle-waiting energy this round
    critical_node: str | None = None
    critical_busy_energy_j: float = 0.0
    critical_idle_energy_j: float = 0.0
    slack_busy_energy_j: float = 0.0
    slack_idle_energy_j: float = 0.0

    def to_record(self) -> dict[str, Any]:
        return {key_of(f.name): to_record(getattr(self, f.name)) for f in fields(self)}
