"""Run settings and node settings: parsed once, validated with errors that name the key."""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 on JetPack 6
    import tomli as tomllib

from fl_client.contract import (
    METHODS,
    Cap,
    SettingsError,
    parse_batch_sizes,
    parse_int_list,
)
from fl_client.node_checks import (
    check_no_partition_keys,
    check_node_options,
    node_name,
)
from fl_client.settings_table import (
    BALANCE_MODES,
    CAP_MARGIN,
    FLOWER_NODE_SETTINGS,
    MIN_ROUND_TIMEOUT_S,
    MODEL_NAMES,
    NODE,
    NODE_OWN_SETTINGS,
    NODE_SETTINGS,
    PARTITIONINGS,
    RUN,
    RUN_SETTINGS,
    SCHEDULE_FORMS,
    choices,
    parse_settings,
    run_defaults,
    table_keys,
)
from fl_client.shipped import app_pyproject, shipped_file, shipped_names

__all__ = [
    "BALANCE_MODES",
    "METHODS",
    "MIN_ROUND_TIMEOUT_S",
    "MODEL_NAMES",
    "PARTITIONINGS",
    "SCHEDULE_FORMS",
    "Cap",
    "SettingsError",
    "parse_batch_sizes",
    "parse_int_list",
]

#: The source tree (None for an installed wheel): its docs and the data kit beside it.
REPO_ROOT = Path(__file__).resolve().parents[1]
#: The aggregations ``aggregation`` names (its entry in the settings table, less ``auto``,
#: which resolves to one of them per run: ``auto_aggregation``), and ``idle-accounting``'s
#: values.
AGGREGATIONS = tuple(a for a in choices("aggregation") if a != "auto")
IDLE_ACCOUNTING = choices("idle-accounting")


#: The methods that pick (b, f) from a LUT by Eq. 4 and so can plan a round (``balance``);
#: B1, B2 and fixed run their fixed rule.
LUT_METHODS = ("power-aware", "oracle")


def auto_aggregation(method: str, balance: str) -> str:
    """What ``aggregation = "auto"`` resolves to for a run of ``method``: ``fedbuff`` (no
    node waits for the slowest) for the methods that pick from a LUT without a round plan;
    ``fedavg`` for B1, B2 and fixed, the synchronous state of practice the power-aware
    method is compared with, and for a round plan, which needs rounds. The default, as
    the robustness study chose it (docs/experiments.md)."""
    return "fedbuff" if method in LUT_METHODS and balance == "off" else "fedavg"


def fleet_buffer_size(buffer_size: int, num_nodes: int) -> int:
    """``fedbuff``'s K on a fleet of ``num_nodes``: ``buffer-size``, except that its default
    becomes the fleet's size on a smaller fleet (so a run that leaves it works on a fleet of
    one or two boards). Any other value above the fleet's size is refused where the fleet is
    known: ``fl_client.preflight`` and the server's start (``fl_server.async_loop``)."""
    default = int(RUN["buffer-size"].value)
    return min(buffer_size, num_nodes) if buffer_size == default else buffer_size


def unknown_key_error(key: str, known: list[str] | tuple[str, ...], where: str) -> SettingsError:
    """``<where>: unknown key 'cap-margn' (did you mean cap-margin?)``."""
    from fl_client.devices import unknown_key_message  # the one wording, shared with devices

    return SettingsError(unknown_key_message(key, known, where))


@functools.lru_cache(maxsize=4)
def _app_defaults_cached(path: Path, mtime_ns: int) -> dict[str, Any]:
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    return dict(data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


def app_defaults(pyproject: Path | None = None) -> dict[str, Any]:
    """The run settings in ``[tool.flwr.app.config]`` of the app's pyproject.toml.

    Flower merges these into ``context.run_config`` for ``flwr run``; the in-process
    simulation (``powerfl simulate``) reads them here so both paths share one source. The
    app's pyproject.toml is the source tree's, or the copy a wheel carries
    (``fl_client.shipped.app_pyproject``): the defaults are written once.
    """
    path = pyproject or app_pyproject()
    if path is None or not path.is_file():
        return {}
    return dict(_app_defaults_cached(path, path.stat().st_mtime_ns))


#: The keys of deadline pacing, which ``balance = "energy"`` replaced (issue 22): each old
#: key and the key to write instead. ``pacing = "deadline"`` is ``balance = "energy"``;
#: ``pacing = "off"`` changes nothing. A config that uses them still runs
#: (``translate_deprecated``), and the server prints what to write instead.
DEPRECATED_KEYS = {
    "pacing": "balance",
    "pacing-margin": "deadline-margin",
    "pacing-deadline-s": "round-deadline-s",
}


def translate_deprecated(
    cfg: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """``cfg`` with the deprecated pacing keys (``DEPRECATED_KEYS``) written as their
    replacements, and one note per key saying what to write instead.

    ``defaults``: the app defaults merged into ``cfg`` (Flower merges them into every run
    config): a replacement still at its default takes the old key's value; one set to
    another value beside its old key is refused, naming both. An unknown ``pacing`` value,
    or ``pacing = "deadline"`` beside another ``balance`` mode, is refused the same way."""
    out, notes, defaults = dict(cfg), [], defaults or {}
    for old, new in DEPRECATED_KEYS.items():
        if old not in out:
            continue
        value = out.pop(old)
        if old == "pacing":
            if value == "off":
                notes.append('pacing: deprecated; "off" changes nothing: leave it out')
                continue
            if value != "deadline":
                raise SettingsError(
                    f"pacing: unknown value {value!r}; pacing is deprecated: write "
                    'balance = "energy" for what pacing = "deadline" did, or leave it out'
                )
            value = "energy"
            if out.get(new, "off") not in ("off", "energy"):
                raise SettingsError(
                    f'pacing: "deadline" is balance = "energy" now, which conflicts with '
                    f"balance = {out[new]!r}; remove pacing"
                )
        elif new in out and out[new] != defaults.get(new, value) and out[new] != value:
            raise SettingsError(
                f"{old}: the deprecated name of {new}, and both are set ({value!r} and "
                f"{out[new]!r}); keep {new} alone"
            )
        out[new] = value
        shown = f'"{value}"' if isinstance(value, str) else f"{value!r}"
        what = 'pacing = "deadline"' if old == "pacing" else old
        notes.append(f"{what}: deprecated; it runs as {new} = {shown} (write that instead)")
    return out, notes


#: Settings that only one partitioner reads: given for another, they would be ignored.
def key_values(items: Sequence[str], option: str) -> dict[str, Any]:
    """``KEY=VALUE`` items of a repeatable option (``-c``, ``--set``) as a mapping; VALUE
    parsed as a TOML value when it parses (``4``, ``"cuda"``, ``["cnn"]``), else kept as a
    string. A key given twice with different values is a SettingsError naming it: one of
    them would be dropped without a word (the same value twice is accepted)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        key, eq, raw = (part.strip() for part in item.partition("="))
        if not eq or not key:
            raise SettingsError(f"{option}: expected KEY=VALUE, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        if key in out and out[key] != value:
            raise SettingsError(
                f"{key}: given twice ({option} {given[key]}, {option} {item.strip()}); give it once"
            )
        out[key], given[key] = value, item.strip()
    return out


PARTITIONER_KEYS = {"dirichlet-alpha": "dirichlet", "classes-per-node": "pathological"}


def check_partitioner_keys(typed: Mapping[str, Any]) -> None:
    """A partitioner's own setting given (``typed``: what the user gave, not the defaults)
    for a run that uses another partitioner: a SettingsError, since nothing would read it."""
    partitioning = str(typed.get("partitioning", app_defaults().get("partitioning", "")))
    for key, owner in PARTITIONER_KEYS.items():
        if key in typed and partitioning != owner:
            raise SettingsError(
                f"{key}: only partitioning = {owner!r} uses it, and this run's partitioning "
                f"is {partitioning!r}; leave {key} out, or give -c partitioning={owner}"
            )


@dataclass(frozen=True)
class RunSettings:
    """Validated run settings: one field per ``settings_table.RUN_SETTINGS`` entry, in order."""

    method: str
    fleet: str
    model: str
    partitioning: str
    dirichlet_alpha: float
    seed: int
    num_rounds: int
    target_accuracy: float
    target_window: int
    local_epochs: int
    batch_sizes: list[int]
    lr_ref: float
    b_ref: int
    proxy_target_accuracy: float
    r_seeds: int
    fraction_train: float
    min_train_nodes: int
    round_timeout_s: float
    output_dir: str
    cache_dir: str
    profile_grid: str
    schedule_profiling: str
    fixed_batch_size: int | None
    fixed_freq_mhz: float | None
    balance: str
    straggler_work: float
    max_work_share: float
    round_deadline_s: float
    critical_r_weight: float
    deadline_margin: float
    cap_margin: float
    peak_sigma_k: float
    tie_tolerance: float
    drift_check_every: int
    drift_threshold: float
    dataset: str
    classes_per_node: int
    r_eval_every_samples: int
    r_max_samples: int
    shared_profiling: str
    shared_seed_cells: int
    shared_cells_per_cap: int
    profile_steps_train: bool
    shared_verify: str
    allow_untrained_nodes: bool
    run_dir: str
    simulated_fleet: bool
    aggregation: str
    buffer_size: int
    staleness_weight: str
    buffer_step: str
    rate_weight: str
    update_budget: str
    while_waiting: str
    idle_accounting: str
    initial_weights: str
    proxy_dataset: str
    tracking: str
    tracking_uri: str

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every run setting's key (kebab-case)."""
        return table_keys(RUN_SETTINGS)

    @classmethod
    def from_config(cls, run_config: Mapping[str, Any]) -> RunSettings:
        """Merge ``run_config`` over the app defaults and validate every key."""
        defaults = {**run_defaults(), **app_defaults()}
        cfg, _ = translate_deprecated({**defaults, **dict(run_config)}, defaults)
        settings = cls(**parse_settings(cfg, RUN_SETTINGS, "run settings"))
        if settings.aggregation == "auto":
            settings = replace(
                settings, aggregation=auto_aggregation(settings.method, settings.balance)
            )
        if settings.method == "fixed" and None in (
            settings.fixed_batch_size,
            settings.fixed_freq_mhz,
        ):
            raise SettingsError(
                "method: 'fixed' needs fixed-batch-size and fixed-freq-mhz run settings"
            )
        if settings.aggregation == "fedbuff" and settings.balance != "off":
            raise SettingsError(
                f"balance: {settings.balance!r} plans synchronous rounds, and aggregation = "
                '"fedbuff" has none (every node trains without waiting); leave balance '
                'out (it is "off" by default) or choose another aggregation'
            )
        if settings.r_max_samples < settings.r_eval_every_samples:
            raise SettingsError(
                f"r-max-samples: {settings.r_max_samples} is below r-eval-every-samples "
                f"({settings.r_eval_every_samples}): r estimation would train each batch size "
                "less than one evaluation period; give r-max-samples ≥ r-eval-every-samples"
            )
        return settings


def resolve_path(path: str, base: Path | None = None) -> Path:
    """A relative path is relative to ``base``, else to the current directory: the one rule
    for every path setting. ``powerfl`` makes them absolute where it starts
    (``with_app_paths``), so every process of a run sees the same absolute paths."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base or Path.cwd()) / p


#: Run settings that are paths. A relative one, typed or an app default (pyproject.toml),
#: is relative to the current directory of the command that starts the run; ``powerfl``
#: makes them absolute before anything else reads them (``with_app_paths``).
PATH_SETTINGS = ("fleet", "cache-dir", "output-dir", "run-dir", "initial-weights")


def fleet_path(value: str, base: Path | None = None) -> Path:
    """The fleet file a ``fleet`` setting names: a path (relative to ``base``, else the
    current directory), or the name of a fleet the package ships (``default``,
    ``nano-only``, …) when no file of that name is there."""
    path = resolve_path(value, base)
    if path.exists():
        return path
    shipped = shipped_file("fleets", value.strip())
    return shipped if shipped is not None else path


def dataset_setting(value: object, base: Path | None = None) -> object:
    """A ``dataset`` setting that is a path made absolute (``resolve_path``): one ending in
    .npz, or a file or folder that exists; a name (``digits``, ``cifar10-subset``, a Hugging
    Face Hub name) is kept as it is."""
    if not isinstance(value, str) or not value.strip():
        return value
    text = value.strip()
    path = resolve_path(text, base)
    if text.endswith(".npz") or path.exists():
        return str(path)
    return value


def with_app_paths(overrides: Mapping[str, Any], base: Path | None = None) -> dict[str, Any]:
    """``overrides`` with every path setting absolute, typed or an app default: relative to
    ``base``, else the current directory (``resolve_path``); ``fleet`` may name a shipped
    fleet (``fleet_path``), ``dataset`` and ``proxy-dataset`` a path (``dataset_setting``)."""
    defaults = app_defaults()
    out = dict(overrides)
    for key in PATH_SETTINGS:
        value = out.get(key, defaults.get(key))
        if value is not None and str(value) != "":
            if key == "fleet":
                out[key] = str(fleet_path(str(value), base))
            else:
                out[key] = str(resolve_path(str(value), base))
    for key in ("dataset", "proxy-dataset"):
        if key in out:
            out[key] = dataset_setting(out[key], base)
    return out


@dataclass(frozen=True)
class NodeSettings:
    """One node of the fleet: which device, through which backend, under which cap."""

    name: str
    device: str
    backend: str
    p_max: Cap
    #: The entry's other keys (backend options such as ``sysfs-root``, ``replay-table``,
    #: ``cap-window-s``), handed to ``fl_client.devices.DeviceOptions``.
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    #: ``p-max-schedule``: (first round, cap) steps, ascending, the first at round 1;
    #: empty = the fixed ``p_max`` every round.
    p_max_schedule: tuple[tuple[int, Cap], ...] = ()
    #: ``cap-margin`` of this node (None: the run setting's).
    cap_margin: float | None = None

    def p_max_at(self, server_round: int) -> Cap:
        """The cap of ``server_round``: the schedule's step, else ``p_max``."""
        cap = self.p_max
        for first_round, step_cap in self.p_max_schedule:
            if server_round >= first_round:
                cap = step_cap
        return cap

    @property
    def scheduled_caps(self) -> tuple[Cap, ...]:
        """Every distinct cap this node runs under, ascending (no cap last)."""
        caps = {c for _, c in self.p_max_schedule} or {self.p_max}
        return tuple(sorted(caps))


def parse_p_max_schedule(
    value: object, where: str, base: Path | None = None
) -> tuple[tuple[int, Cap], ...]:
    """A node's ``p-max-schedule``: inline steps or a per-round CSV trace (see SCHEDULE_FORMS).

    Raises SettingsError naming ``where`` and the key for gaps, unsorted or repeated
    rounds, a first step after round 1, and caps that are not numbers > 0 or 'none'.
    """
    key = f"{where}: p-max-schedule"
    allowed = "; allowed: " + " or ".join(SCHEDULE_FORMS)
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{key}: expected a string, got {value!r}{allowed}")
    text = value.strip()
    pairs: list[tuple[str, str]] = []
    per_round = text.lower().endswith(".csv")
    if per_round:
        path = resolve_path(text, base)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "schedule file not found"
            raise SettingsError(f"{key}: {what}: {path}")
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
        head = [h.strip() for h in lines[0].split(",")] if lines else []
        if head != ["round", "p-max-w"]:
            raise SettingsError(f"{key}: {path.name} must start with the header 'round,p-max-w'")
        for ln in lines[1:]:
            cells = [c.strip() for c in ln.split(",")]
            if len(cells) != 2:
                raise SettingsError(f"{key}: {path.name}: expected 'round,p-max-w', got {ln!r}")
            pairs.append((cells[0], cells[1]))
    else:
        for item in text.split(","):
            first, sep, cap = item.partition(":")
            if not sep:
                raise SettingsError(f"{key}: entry {item.strip()!r} is not 'round:cap'{allowed}")
            pairs.append((first.strip(), cap.strip()))
    if not pairs:
        raise SettingsError(f"{key}: empty schedule{allowed}")
    steps: list[tuple[int, Cap]] = []
    for first, cap in pairs:
        try:
            rnd = int(first)
        except ValueError:
            raise SettingsError(f"{key}: round {first!r} is not an integer ≥ 1") from None
        if not cap:
            raise SettingsError(f"{key}: round {rnd} has no cap{allowed}")
        try:
            cap_w = Cap.parse(cap, key=f"{key} (round {rnd})")
        except SettingsError as err:
            raise SettingsError(f"{err}{allowed}") from None
        steps.append((rnd, cap_w))
    rounds = [r for r, _ in steps]
    if rounds[0] != 1:
        raise SettingsError(f"{key}: must start at round 1, starts at round {rounds[0]}")
    if any(b <= a for a, b in itertools.pairwise(rounds)):
        raise SettingsError(f"{key}: rounds must be strictly ascending, got {rounds}")
    if per_round and rounds != list(range(1, len(rounds) + 1)):
        missing = sorted(set(range(1, rounds[-1] + 1)) - set(rounds))
        raise SettingsError(f"{key}: a per-round trace has gaps: rounds {missing} are missing")
    return tuple(steps)


#: Keys of a fleet entry or node_config that are node settings, not backend options.
NODE_KEYS = table_keys(NODE_OWN_SETTINGS)
#: Keys Flower's simulation puts in node_config, and a fleet entry's ``count``.
FLOWER_NODE_KEYS = table_keys(FLOWER_NODE_SETTINGS)
#: Keys of a fleet entry that may name a file or folder (``p-max-schedule`` only in its CSV
#: form): a relative path there is relative to the fleet file's folder (``fleet_entry_paths``).
FLEET_PATH_KEYS = ("p-max-schedule", "replay-table", "sysfs-root", "state-dir")


def fleet_entry_paths(entry: Mapping[str, Any], fleet_dir: Path) -> dict[str, Any]:
    """A fleet file's ``[[node]]`` table with each relative path in it (``FLEET_PATH_KEYS``)
    made absolute against ``fleet_dir``, the fleet file's folder, as users of config files
    expect; absolute paths (``~`` expanded) and every other value are kept. Done once, where
    the fleet file is read, so the node's options and schedule hold paths that mean the
    same in every process, whatever its current directory."""
    out = dict(entry)
    for key in FLEET_PATH_KEYS:
        value = out.get(key)
        if not isinstance(value, str) or not value.strip():
            continue
        text = value.strip()
        if key == "p-max-schedule" and not text.lower().endswith(".csv"):
            continue  # inline steps ("1:7.0,5:4.5"), not a path
        out[key] = str(resolve_path(text, fleet_dir))
    return out


def node_entry_keys() -> tuple[str, ...]:
    """Every key a fleet entry or a node_config may have: node settings, Flower's own keys
    and the backends' options (``fl_client.settings_table.NODE_SETTINGS``)."""
    return table_keys(NODE_SETTINGS)


def _node_from_mapping(entry: Mapping[str, Any], where: str, default_name: str) -> NodeSettings:
    from fl_client.devices import BACKENDS

    if "device" not in entry:
        raise SettingsError(f'{where}: device: missing (e.g. device = "jetson-nano")')
    backend = str(entry.get("backend", "simulated"))
    if backend not in BACKENDS:
        raise SettingsError(
            f"{where}: backend: unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}"
        )
    device = str(entry["device"])
    if backend == "simulated":
        from fl_client.devices.descriptors import DEVICE_KINDS

        if device not in DEVICE_KINDS:
            raise SettingsError(
                f"{where}: device: unknown device kind {device!r}; "
                f"allowed: {', '.join(DEVICE_KINDS)}"
            )
    name = node_name(entry, where, default_name)
    allowed = node_entry_keys()
    for key in entry:
        if key not in allowed:
            raise unknown_key_error(key, allowed, f"{where} ({name})")
    raw_cap = entry.get("p-max-w", "none")
    if isinstance(raw_cap, str) and not raw_cap.strip():
        raise SettingsError(
            f"{where} ({name}): p-max-w: empty; give a number of watts > 0 (e.g. 5.0), or "
            "'none' for no cap"
        )
    try:
        p_max = Cap.parse(raw_cap)
    except SettingsError as err:
        raise SettingsError(f"{where}: {err}") from None
    schedule: tuple[tuple[int, Cap], ...] = ()
    if "p-max-schedule" in entry:
        if "p-max-w" in entry:
            raise SettingsError(
                f"{where} ({name}): p-max-w and p-max-schedule: give one of them, not both"
            )
        schedule = parse_p_max_schedule(entry["p-max-schedule"], f"{where} ({name})")
        p_max = schedule[0][1]
    cap_margin = None
    if "cap-margin" in entry:
        try:
            cap_margin = CAP_MARGIN.parse(entry["cap-margin"])
        except SettingsError as err:
            raise SettingsError(f"{where} ({name}): {err}") from None
    options = {k: v for k, v in entry.items() if k not in (*NODE_KEYS, *FLOWER_NODE_KEYS)}
    check_node_options(options, backend, f"{where} ({name})")
    return NodeSettings(
        name=name,
        device=device,
        backend=backend,
        p_max=p_max,
        options=options,
        p_max_schedule=schedule,
        cap_margin=cap_margin,
    )


def load_fleet(path: str | Path) -> list[NodeSettings]:
    """Read a fleet file (``configs/fleets/*.toml``): one ``[[node]]`` table per node.

    A node table may carry ``count = N`` to stand for N identical nodes (named
    ``name-1`` … ``name-N``). Simulated node *i* is mapped to ``partition-id`` *i*. A
    relative path in an entry (a CSV ``p-max-schedule``, ``replay-table``, ``sysfs-root``,
    ``state-dir``) is relative to the fleet file's folder (``fleet_entry_paths``).
    """
    p = fleet_path(str(path))
    if not p.is_file():
        shipped = ", ".join(shipped_names("fleets"))
        what = "is a folder, not a fleet file" if p.is_dir() else "fleet file not found"
        raise SettingsError(
            f"fleet: {what}: {p}; give a fleet TOML file or a shipped fleet's name ({shipped})"
        )
    return list(_load_fleet_cached(p, p.stat().st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _load_fleet_cached(p: Path, mtime_ns: int) -> tuple[NodeSettings, ...]:
    """A fleet file is read once per process and version (every message used to re-read it)."""
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"fleet: {p} is not valid TOML: {err}") from None
    for key in data:
        if key != "node":
            raise unknown_key_error(key, ("node",), f"fleet {p}")
    entries = data.get("node")
    if not isinstance(entries, list) or not entries:
        raise SettingsError(
            f"fleet: {p} has no [[node]] tables; a fleet file has one [[node]] table per "
            'node, e.g. [[node]] name = "nano" device = "jetson-nano" p-max-w = 5.0'
        )
    nodes: list[NodeSettings] = []
    for i, entry in enumerate(entries):
        where = f"fleet {p.name} node #{i + 1}"
        if not isinstance(entry, dict):
            raise SettingsError(
                f"{where}: node: expected a [[node]] table (name, device, p-max-w, …), got "
                f"{type(entry).__name__} {entry!r}; write one [[node]] table per node, not "
                "node = [...]"
            )
        count = entry.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise SettingsError(f"{where}: count: expected an integer ≥ 1, got {count!r}")
        check_no_partition_keys(entry, where)
        entry = fleet_entry_paths(entry, p.parent)
        base = _node_from_mapping(entry, where, default_name=f"node-{i}")
        for k in range(count):
            name = base.name if count == 1 else f"{base.name}-{k + 1}"
            nodes.append(replace(base, name=name, options=dict(base.options)))
    names = [n.name for n in nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SettingsError(f"fleet: node names must be unique, repeated: {', '.join(dupes)}")
    return tuple(nodes)


def node_settings(
    node_config: Mapping[str, Any], fleet: list[NodeSettings] | None
) -> tuple[NodeSettings, int, int]:
    """This node's settings and its (partition-id, num-partitions).

    Deployment: ``device``/``backend``/``p-max-w`` come from ``--node-config``.
    Simulation: Flower sets ``partition-id``; the fleet file says what node that is.
    """
    pid = int(NODE["partition-id"].parse(node_config.get("partition-id", 0)))
    num = int(
        NODE["num-partitions"].parse(node_config.get("num-partitions", len(fleet) if fleet else 1))
    )
    if "device" in node_config:
        node = _node_from_mapping(node_config, "node-config", default_name=f"node-{pid}")
        return node, pid, num
    if fleet is None:
        raise SettingsError("node-config: no 'device' key and no fleet file to map partition-id")
    if not 0 <= pid < len(fleet):
        raise SettingsError(
            f"partition-id: {pid} has no node in the fleet file ({len(fleet)} nodes); "
            f"run the simulation with num-supernodes = {len(fleet)}"
        )
    return fleet[pid], pid, num
