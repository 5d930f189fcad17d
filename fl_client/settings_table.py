"""The settings table: every run setting and every node key, declared once.

One ``Setting`` per key holds its kebab-case name, its TOML type, its default, the check
that both validates a value and says in words what it allows, the line of documentation,
its scope (a run setting, a node key, or both) and who reads it (the server, the node, or
both). Everything else derives from this table:

* ``RunSettings.from_config`` (``fl_client.settings``) is a loop over ``RUN_SETTINGS``
  (``parse_settings``), with the unknown-key and did-you-mean check written once;
* ``[tool.flwr.app.config]`` in pyproject.toml holds exactly these run keys and defaults
  (a test fails when the two disagree);
* ``docs/configuration.md`` is rendered from the type, default, check and doc
  (``fl_client.settings_docs``);
* the command-line options that mirror a key (``powerfl select --cap-margin``, …) take their
  help, default and check from the entry (``fl_client.cli_tools``);
* the studies check the run settings they override against the table (``check_run_keys``).

A node key's own parsing is ``fl_client.settings``' (``p-max-w``, ``p-max-schedule``, …)
or, for a backend option, its entry here: ``device_options`` builds
``fl_client.devices.DeviceOptions`` from the parsed values (the devices package may not
import settings, so those entries take their defaults from ``DeviceOptions``).

Free of Flower and PyTorch, importable on Python 3.10.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from fl_client.balance import BALANCE_MODES  # ``balance``: its modes, one entry each
from fl_client.contract import METHODS, SettingsError, key_of
from fl_client.devices import BACKENDS, POWER_SOURCES, DeviceOptions, unknown_key_message
from fl_client.feasibility import PEAK_SIGMA_K
from fl_client.selector import TIE_TOLERANCE
from fl_client.setting_checks import (
    AsGiven,
    AutoFlag,
    BatchSizes,
    CapCheck,
    Check,
    Choice,
    DatasetName,
    Documented,
    Flag,
    Integer,
    KnobName,
    Names,
    Number,
    OptionalNumber,
    OrBlank,
    PathText,
    Range,
    SafeName,
    Text,
    TrackingURI,
)

Scope = Literal["run", "node", "run+node"]
ReadBy = Literal["server", "node", "both"]

#: The ``model`` setting's values: the image models ``fl_client.model_zoo`` builds (its
#: ``MODEL_NAMES``; a test keeps the two equal). Named here so that checking a command's
#: settings never imports PyTorch.
MODEL_NAMES = ("cnn", "resnet18", "mobilenetv2")
#: ``partitioning``: Flower Datasets' partitioners a run can split its data with.
PARTITIONINGS = ("iid", "dirichlet", "pathological")
#: ``staleness-weight``: how a buffered update's weight falls with its staleness
#: (``strategies.fedbuff.staleness_weight``; a test keeps the two equal).
STALENESS_FORMS = ("inverse-sqrt", "inverse", "constant")
#: ``rate-weight``: fedbuff's per-update weight beside staleness (``strategies.fedbuff``)
RATE_WEIGHTS = ("off", "device-time")
#: ``buffer-step``: the weight of a full fedbuff step (``strategies.fedbuff``)
BUFFER_STEPS = ("mean", "fleet")
#: ``update-budget``: how long a fedbuff run may go (``strategies.fedbuff.UpdateBudget``)
UPDATE_BUDGETS = ("each-node", "fleet")
#: ``while-waiting``: what a fedbuff node does until its kind's LUT is merged
#: (``strategies.shared_exchange.SharedExchange.train_while_waiting``)
WHILE_WAITING = ("train", "idle")
#: ``tracking``: where finished runs are logged besides their folders (``simulations.tracking``).
TRACKERS = ("none", "mlflow")
#: The shortest ``round-timeout-s`` taken as meant. Every node's first reply needs a fresh
#: worker process to start, import the client app (PyTorch, Flower) and build the model
#: before it can answer the QUERY round: the import alone took 16–22 s on this project's
#: 2-core host under load. A TRAIN round adds LUT profiling and ``local-epochs`` of training
#: on top. A timeout below this drops every node of the first rounds, which no one asks for
#: on purpose (minutes typed as seconds, a lost digit).
MIN_ROUND_TIMEOUT_S = 30.0
#: Allowed forms of ``p-max-schedule``.
SCHEDULE_FORMS = (
    "'1:7.0,5:4.5,9:none' (from round 1 7 W, from round 5 4.5 W, from round 9 no cap)",
    "a path to a .csv file with a 'round,p-max-w' header and one row per round 1, 2, …, N (the"
    " last cap holds after round N)",
)


def _device_kinds() -> tuple[str, ...]:
    from fl_client.devices.descriptors import DEVICE_KINDS

    return DEVICE_KINDS


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class Setting:
    """One key: its name (kebab-case), TOML type, default (as written in TOML), check,
    meaning (Markdown, one sentence), scope and who reads it.

    ``default_text`` replaces the default in the docs where the default is not a value
    (``required``, ``node-<i>``); ``node_doc`` is the meaning of a ``run+node`` key in a
    fleet entry."""

    key: str
    type: type | tuple[type, ...]
    default: Any
    check: Check
    doc: str
    scope: Scope = "run"
    read_by: ReadBy = "both"
    default_text: str = ""
    node_doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.key != self.key.lower() or "_" in self.key or not self.doc.strip():
            raise ValueError(f"setting {self.key!r}: a kebab-case key and a meaning, please")

    @property
    def field_name(self) -> str:
        """The key as a Python name (``cap-margin`` → ``cap_margin``)."""
        return self.key.replace("-", "_")

    def parse(self, raw: object) -> Any:
        """``raw`` checked and in its parsed form; a SettingsError naming the key."""
        return self.check.parse(self.key, raw)

    @property
    def value(self) -> Any:
        """The default, parsed (``"4,8"`` → ``[4, 8]``, 0 for unset → None)."""
        return self.parse(self.default)

    @property
    def type_name(self) -> str:
        """The TOML type in words: ``string``, ``integer``, ``number``, ``boolean``."""
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        return " or ".join(names.get(t, t.__name__) for t in types)

    def plain_doc(self) -> str:
        """The meaning without Markdown (links to the docs dropped), for command-line help."""
        text = re.sub(r"\s*\(\[[^\]]*\]\([^)]*\)\)", "", self.doc)
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        return text.replace("`", "").replace("\\*", "*")


#: ``cap-margin``: a run setting, and a node's own in its fleet entry or node_config.
# fmt: off
CAP_MARGIN = Setting("cap-margin", float, 0.05, Range(0.0, 1.0), scope="run+node", read_by="both",
    doc=
    "share of P_max kept free: a (b, f) is feasible only if its profiled peak is below "
    "P_max·(1 − cap-margin); a node's own `cap-margin` overrides it; 0 is the paper's rule "
    "([The cap margin](method.md#the-cap-margin))",
    node_doc=
        "this node's share of P_max kept free of profiled peaks, instead of the run's "
        "`cap-margin`")
# fmt: on

#: Every run setting, in the docs' order (``RunSettings``' fields follow it).
# fmt: off
RUN_SETTINGS: tuple[Setting, ...] = (
    Setting("method", str, "power-aware", Choice(METHODS), read_by="both", doc=
        "how clients pick (b, f): `power-aware` (Eq. 4 with the proxy r), `b1` (the state of "
        "practice: the largest b at the highest frequency at or below the device's fixed safe"
        " frequency for its cap), `b2` (the b with the smallest proxy r at B1's frequency), "
        "`oracle` (Eq. 4 with r measured on the node's own data), `fixed` (`fixed-batch-size`"
        " at `fixed-freq-mhz` on every node)"),
    Setting("fleet", str, "default", Text(), read_by="both", doc=
        "the fleet file: one `[[node]]` table per node ([Fleet "
        "entries](#fleet-entries-and-node-config)); simulated node *i* is Flower partition "
        "*i*. A path (relative to the current folder), or the name of a fleet the package "
        "ships in `configs/fleets` (`default`, `drift`, `nano-only`, `varying-cap`)"),
    Setting("model", str, "cnn", Choice(MODEL_NAMES), read_by="both", doc=
        "`cnn` (a small CNN trained from scratch), `resnet18`, `mobilenetv2` (torchvision, "
        "adapted to 32×32)"),
    Setting("partitioning", str, "dirichlet", Choice(PARTITIONINGS), read_by="node", doc=
        "how the clients' data is split over the nodes, by Flower Datasets' partitioners: "
        "`dirichlet` (non-IID), `iid` or `pathological` (`classes-per-node`)"),
    Setting("dirichlet-alpha", float, 0.5, Number(lo=0.0), read_by="node", doc=
        "the concentration of the Dirichlet split (`partitioning = \"dirichlet\"`)"),
    Setting("seed", int, 7, Integer(lo=0), read_by="both", doc=
        "seeds the data split, the partitions, the twins' sensor noise and the training order"),
    Setting("num-rounds", int, 30, Integer(lo=1), read_by="server", doc=
        "round budget: the run stops after this many rounds or once it reaches "
        "`target-accuracy` (`target-window`), whichever comes first; with `aggregation = "
        "\"fedbuff\"`, what `update-budget` makes of it"),
    Setting("target-accuracy", float, 0.85, Number(lo=0.0, hi=1.0), read_by="server", doc=
        "test accuracy of the global model at which the run stops, reached as "
        "`target-window` says"),
    Setting("target-window", int, 3, Integer(lo=1), read_by="server", doc=
        "the run reaches `target-accuracy` at the first round whose mean global accuracy "
        "over its last `target-window` evaluated rounds reaches it (a full window: never "
        "before round `target-window`), so a lucky round does not decide it; 1: the first "
        "round at the target. The run stops there; its summary also gives the first round "
        "at the target (`first-round-at-target`). A window longer than `num-rounds` is "
        "allowed with a warning at start (the run cannot reach the target by it)"),
    Setting("local-epochs", int, 5, Integer(lo=1), read_by="both", doc=
        "local work per round, in passes over the node's data (the same samples whatever b\\* "
        "is)"),
    Setting("batch-sizes", str, "4,8,16,32,64,128", BatchSizes(), read_by="both", doc=
        "the candidate batch sizes B, comma-separated and ascending"),
    Setting("lr-ref", float, 0.005, Number(lo=0.0), read_by="both", doc=
        "Adam learning rate at `b-ref`; another b uses lr-ref·sqrt(b/b-ref) (the paper's "
        "rule; the paper's 5e-4 is for fine-tuning pretrained CNNs, the default CNN trains "
        "from scratch)"),
    Setting("b-ref", int, 128, Integer(lo=1), read_by="both", doc=
        "the batch size at which the learning rate is `lr-ref`"),
    Setting("proxy-target-accuracy", float, 0.8, Number(lo=0.0, hi=1.0), read_by="both", doc=
        "accuracy on the server's proxy set that defines N_s_acc(b), the samples each batch "
        "size needs, and with it r (Eq. 3)"),
    Setting("r-seeds", int, 1, Integer(lo=1), read_by="server", doc=
        "how many data-order seeds r estimation averages N_s_acc(b) over"),
    Setting("fraction-train", float, 1.0, Number(lo=0.0, hi=1.0), read_by="server", doc=
        "share of the connected nodes sent a TRAIN message each round (at least "
        "`min-train-nodes`)"),
    Setting("min-train-nodes", int, 2, Integer(lo=1), read_by="server", doc=
        "the minimum number of nodes a round is sent to; a simulated fleet smaller than this "
        "is refused before the engine starts"),
    Setting("round-timeout-s", float, 600.0, Number(lo=0.0, inf_ok=True), read_by="server", doc=
        f"bound on every QUERY and TRAIN round, in seconds; below {MIN_ROUND_TIMEOUT_S:g} s it is "
        "refused (a node's first reply imports the client app)"),
    Setting("output-dir", str, "runs", Text(), read_by="server", doc=
        "where run folders go (relative: to the current folder)"),
    Setting("cache-dir", str, ".powerfl-cache", Text(), read_by="both", doc=
        "LUTs, r and oracle caches, and the server's LUT library (`<cache-dir>/library`; "
        "relative: to the current folder)"),
    Setting("profile-grid", str, "efficient", Choice(("efficient", "full")), read_by="node", doc=
        "`efficient`: only the cells that matter under each node's cap (paper §4.1, with the "
        "robust feasibility of `peak-sigma-k`: each b walks up in f past its first infeasible"
        " cell until two infeasible cells in a row, at most 2 infeasible cells beyond the "
        "first; each smaller b from there; without a cap each b at its highest f, which Eq. 4"
        " would pick); `full`: every (b, f)"),
    Setting("schedule-profiling", str, "upfront", Choice(("upfront", "lazy")), read_by="node", doc=
        "when a node with a `p-max-schedule` profiles its caps' LUTs: `upfront` profiles "
        "every cap in round 1, while every node profiles anyway, so the fleet waits once; "
        "`lazy` profiles a cap the first round it applies, so an unreached cap costs nothing,"
        " but each cap step makes its round wait for that node's profiling ([Cap "
        "schedules](method.md#cap-schedules))"),
    Setting("fixed-batch-size", int, 0, OptionalNumber("a batch size ≥ 1", integer=True),
            read_by="both", doc=
        "the `fixed` method's batch size, one of `batch-sizes`; only the `fixed` method reads"
        " it"),
    Setting("fixed-freq-mhz", float, 0.0, OptionalNumber("a GPU frequency in MHz > 0"),
            read_by="both", doc=
        "the `fixed` method's GPU frequency in MHz, in every node's frequency table; on a node"
        " whose knob is the GPU power limit (`knob = \"power-limit\"`) the value is that limit"
        " in W, one of its grid of limits. Only the `fixed` method reads it"),
    Setting("balance", str, "off", Choice(BALANCE_MODES.keys), read_by="both", doc=
        "what a node that would finish before the round's planned deadline does with its "
        "slack: `off` its own Eq. 4 choice; `samples` the most sample-efficient cell (least "
        "r_b) that meets the deadline; `steps` more local steps until the deadline; `energy` "
        "at its own b* the frequency of least energy above idle power that meets it (a node "
        "that finishes early waits at idle power; what `pacing = \"deadline\"` did; `pacing` is"
        " deprecated). The node that sets the pace takes its fastest cell, or with "
        "`critical-r-weight` > 0 its least time × r_b^w ([The round "
        "plan](method.md#the-round-plan))"),
    Setting("straggler-work", float, 1.0, Range(0.0, 1.0, lo_open=True, hi_open=False),
            read_by="node", doc=
        "the share of its local work the node that sets the pace runs, with `balance` on (1: "
        "all of it)"),
    Setting("max-work-share", float, 16.0, Range(1.0, math.inf), read_by="node", doc=
        "with `balance = \"steps\"`: the most a node with slack runs of its local work (16: up "
        "to 16 times it, however long the deadline); the round's warnings name the nodes it "
        "bounds"),
    Setting("round-deadline-s", float, 0.0, Range(0.0, math.inf), read_by="server", doc=
        "a fixed round deadline in seconds of local training time, with `balance` on; 0: the "
        "critical node's best predicted round time (`pacing-deadline-s` is its deprecated "
        "name)"),
    Setting("critical-r-weight", float, 0.0, Range(0.0, 1.0, hi_open=False), read_by="both", doc=
        "how much r_b still weighs in the choice of the node that sets the pace, with "
        "`balance` on: its cell of least time × r_b^w (0: its fastest cell, the least round "
        "time; 1: its own Eq. 4 cell); the server plans the round's deadline from the same "
        "cell"),
    Setting("deadline-margin", float, 0.05, Range(0.0, 1.0), read_by="both", doc=
        "share of the round's deadline a node with slack keeps in reserve against noise, with"
        " `balance` on; a node later than the deadline by more than this share has missed it "
        "(`pacing-margin` is its deprecated name)"),
    CAP_MARGIN,
    Setting("peak-sigma-k", float, PEAK_SIGMA_K, Range(0.0, math.inf), read_by="both", doc=
        "a cell is feasible when its profiled peak plus this many σ of its per-step peaks is "
        "below P_max·(1 − cap-margin); 0: the peak alone ([The selection "
        "rule](method.md#the-selection-rule))"),
    Setting("tie-tolerance", float, TIE_TOLERANCE, Range(0.0, 1.0), read_by="both", doc=
        "cells whose time × r_b is within this share of the least (the noise level of LUT "
        "cells) are ties, broken by the least energy to accuracy (average power × time × r_b)"),
    Setting("drift-check-every", int, 0, Integer(lo=0), read_by="node", doc=
        "every k rounds a node re-measures its operating point and compares it with its LUT; "
        "0 = never ([Drift checks](method.md#drift-checks))"),
    Setting("drift-threshold", float, 0.15, Number(lo=0.0), read_by="node", doc=
        "relative deviation beyond which a drift check re-profiles the batch size's row up to"
        " the cap less `cap-margin`; also how far a trained round's peak may exceed what its "
        "LUT cell promised (peak + `peak-sigma-k`·σ, checked every round at no cost) before "
        "the LUT file is set aside and profiled again"),
    Setting("dataset", str, "digits", DatasetName(), read_by="both", doc=
        "the run's data: `digits` (scikit-learn's bundled digits, shaped 3×32×32, offline), a"
        " data-kit subset (`cifar10-subset`, `mnist-subset` under `../shared/data`), an npz "
        "path, or a Hugging Face dataset name or folder (10 classes; `HF_DATASETS_OFFLINE=1` "
        "keeps it from downloading); checked before any engine starts"),
    Setting("classes-per-node", int, 2, Integer(lo=1), read_by="node", doc=
        "classes each node holds with `partitioning = \"pathological\"`"),
    Setting("r-eval-every-samples", int, 256, Integer(lo=1), read_by="both", doc=
        "r estimation evaluates on the proxy set every this many training samples"),
    Setting("r-max-samples", int, 40000, Integer(lo=1), read_by="both", doc=
        "a batch size that has not reached `proxy-target-accuracy` after this many samples is"
        " left out of B; the oracle uses the same budget on a node's data"),
    Setting("shared-profiling", str, "fleet", Choice(("fleet", "off")), read_by="both", doc=
        "`fleet`: nodes of one kind (device kind, backend, model, input shape, B) measure one"
        " LUT together in slices, each node checks its own chosen cell (`shared-verify`), and"
        " the server keeps the LUT in its library; `off`: every node profiles its own "
        "([Fleet-shared profiling](method.md#fleet-shared-profiling))"),
    Setting("shared-seed-cells", int, 8, Integer(lo=2), read_by="server", doc=
        "cells spread over the (b, f) grid that fleet-shared profiling measures first"),
    Setting("shared-cells-per-cap", int, 2, Integer(lo=0), read_by="server", doc=
        "further cells per distinct cap, in one pool per kind (a settled cap leaves its share"
        " to the others), where a fit to the cells so far is unsure of a cap's choice and "
        "boundary"),
    Setting("profile-steps-train", bool, True, Flag(), read_by="server", doc=
        "keep the updates of the profiled minibatches (real local batches, lr scaled for "
        "their b), so profiling also moves the model"),
    Setting("shared-verify", str, "training", Choice(("training", "before")), read_by="node", doc=
        "how a node checks its chosen cell of its kind's LUT on its board: `training`: by the"
        " round's own training steps (time against the cell's, peak against its promise, no "
        "cap-guard step-down), free, while the cap guard holds the cap; `before`: one cell "
        "measured before training. A board found off the LUT by more than `drift-threshold` "
        "has the cell measured before its next round and its row re-profiled"),
    Setting("allow-untrained-nodes", bool, False, Flag(), read_by="server", doc=
        "a run in which a node never trained (its device could not be opened, every TRAIN it "
        "got failed) still ends with exit status 0; by default `powerfl simulate` names such "
        "nodes in its last line and exits 1"),
    Setting("run-dir", str, "", PathText(), read_by="server", doc=
        "the run's own folder, created if missing (one that holds a finished run's "
        "`summary.json` is refused); empty: a new `<output-dir>/<UTC time>-<method>`. "
        "`powerfl simulate --engine runtime` sets it to read back exactly its own run "
        "([Flower's Simulation "
        "Runtime](simulation.md#flowers-simulation-runtime-and-ray-clusters)); `powerfl "
        "simulate` refuses it with more than one method"),
    Setting("simulated-fleet", bool, False, Flag(), read_by="server", doc=
        "the run's nodes are the fleet file's (Flower's partition *i* is fleet node *i*), so "
        "the server names a node that failed by its fleet entry; `powerfl simulate --engine "
        "runtime` sets it (the in-process engine hands the fleet to the server itself)"),
    Setting("aggregation", str, "auto",
            Choice(("auto", "fedavg", "fednova", "fedavg-capped", "fedbuff")), read_by="server",
            doc=
        "`auto` (the default): `fedbuff` for the methods that pick (b, f) from a LUT "
        "(`power-aware`, `oracle`) with `balance = \"off\"`, `fedavg` for `b1`, `b2` and "
        "`fixed` (the synchronous state of practice) and for a round plan (`balance` on); "
        "the run records the one it resolved to ([The "
        "default](async.md#the-default-asynchronous-for-the-power-aware-method)). Else how "
        "the server combines the nodes' arrays each round: `fedavg` (weighted by local "
        "samples), `fednova` (FedNova's normalised averaging: each node's update divided by"
        " its local work, `local-steps` × `local-lr`, then scaled by the fleet's mean work) "
        "or `fedavg-capped` (FedAvg with the weight of a node that did more than the "
        "fleet's mean work scaled down to that mean: the new model is a weighted mean of the "
        "nodes' models, no update extrapolated); the last two "
        "are FedAvg exactly when every node did equal work "
        "([Aggregation](method.md#aggregation)); `fedbuff`: no rounds, buffered "
        "asynchronous aggregation on the twins' device time (every node kept busy, the "
        "global model updated every `buffer-size` updates, for as long as `update-budget` "
        "says; [Asynchronous aggregation](async.md))"),
    Setting("buffer-size", int, 3, Integer(lo=1), read_by="server", doc=
        "with `aggregation = \"fedbuff\"`: K, the updates the server buffers before it "
        "applies them to the global model as one new version; at most the fleet's size"),
    Setting("staleness-weight", str, "inverse-sqrt", Choice(STALENESS_FORMS),
            read_by="server", doc=
        "with `aggregation = \"fedbuff\"`: how an update's weight falls with its staleness "
        "s (the versions the global model moved on since the update's base): "
        "`inverse-sqrt` 1/√(1+s), `inverse` 1/(1+s), `constant` 1; the weight is the "
        "node's local samples times this"),
    Setting("buffer-step", str, "fleet", Choice(BUFFER_STEPS), read_by="server", doc=
        "with `aggregation = \"fedbuff\"`: how far a version moves the model. `mean`: to "
        "the buffer's weighted mean of the updates (FedBuff's server step, learning rate "
        "1); `fleet`: each update moves it by its samples' share of the whole fleet's (the "
        "nodes in the run × their mean samples), as it would in a round, so K updates make "
        "about K/N of a round's step, with staleness weighing the buffer's updates against "
        "each other; never more than a full step"),
    Setting("rate-weight", str, "off", Choice(RATE_WEIGHTS), read_by="server", doc=
        "with `aggregation = \"fedbuff\"`: `device-time` also weighs each update by its "
        "training time over the fleet's mean, so a board that updates k times as often "
        "weighs 1/k per update and each node counts by its samples over time, as in a "
        "round; a buffer of fast updates then moves the model by less than a full step "
        "(never more); `off`: FedBuff's weight, samples × staleness factor"),
    Setting("update-budget", str, "each-node", Choice(UPDATE_BUDGETS), read_by="server", doc=
        "with `aggregation = \"fedbuff\"`: how long the run may go without reaching the "
        "target. `each-node`: until every node still in the run has had `num-rounds` of its "
        "trained updates applied, as long as `num-rounds` synchronous rounds take at least "
        "(a round lasts as long as its slowest node), so a fleet whose fast boards send most "
        "updates is not cut short before its slow boards' data count; `fleet`: the updates "
        "of `num-rounds` rounds of the fleet, `num-rounds` × its nodes, in versions of "
        "`buffer-size` (rounded up), whoever sends them. Profiled updates come on top of "
        "either, as a synchronous run's profiling step is no round of its `num-rounds`"),
    Setting("while-waiting", str, "train", Choice(WHILE_WAITING), read_by="server", doc=
        "with `aggregation = \"fedbuff\"` in a simulation (the twins' device time): what a "
        "node does from the end of its own fleet-shared profiling slices until its kind's "
        "LUT is merged. `train`: it trains from its profiled weights at the fastest cell its "
        "cap allows of the first slices of its kind that have ended by then (its own "
        "included; where none is feasible, from the end of the next slice that brings one), "
        "as many steps as fit, and the steps end its profiled update; `idle`: it waits. "
        "A deployment waits either way: the profiling exchange is a barrier on the wall "
        "clock "
        "([Asynchronous aggregation](async.md))"),
    Setting("idle-accounting", str, "on", Choice(("on", "off")), read_by="server", doc=
        "`on`: the headline fleet energy (`fleet-energy-j`, `fleet-energy-to-target-j`, the "
        "console's *energy→target*) counts each board's idle power while it waits for the "
        "round's slowest node; `off`: training and profiling only, the figure of earlier "
        "runs. The records hold both parts either way ([Records](design.md#5-records))"),
    Setting("initial-weights", str, "", PathText(), read_by="server", doc=
        "a checkpoint the run starts from (empty: the model's seeded random initialisation): "
        "a safetensors file or a PyTorch state dict (`fl_client.checkpoint`). The server "
        "reads it, sends it as the round-0 global model and starts r estimation from it; its "
        "sha256 is recorded and keys the r cache"),
    Setting("proxy-dataset", str, "", DatasetName(optional=True), read_by="server", doc=
        "where the server's proxy set for r comes from (empty: the run's `dataset`), checked "
        "before any engine starts like `dataset`"),
    Setting("tracking", str, "none", Choice(TRACKERS), read_by="server", doc=
        "experiment tracking by `powerfl simulate` and the studies: `mlflow` logs each finished"
        " run to MLflow (its settings as params, per-round metrics with step = round, per-node"
        " totals, its folder's files as artifacts; `pip install 'powerfl[tracking]'`); a "
        "tracking failure costs a warning, never the run ([Tracking runs in "
        "MLflow](simulation.md#tracking-runs-in-mlflow))"),
    Setting("tracking-uri", str, "", TrackingURI(), read_by="server", doc=
        "where `tracking = \"mlflow\"` logs: an MLflow tracking server or store by URI; empty: "
        "a local store in `output-dir` (`mlflow.db`, its files in `mlartifacts/`)"),
)
# fmt: on


def _option(key: str, type_: type | tuple[type, ...], check: Check, doc: str) -> Setting:
    """A backend option (a ``DeviceOptions`` field): its default is ``DeviceOptions``' own."""
    defaults = {key_of(f.name): f.default for f in fields(DeviceOptions)}
    return Setting(key, type_, defaults[key], check, doc, scope="node", read_by="node")


def _node(
    key: str,
    type_: type | tuple[type, ...],
    default: Any,
    check: Check,
    *,
    doc: str,
    default_text: str = "",
) -> Setting:
    """A node key (``scope = "node"``, read by the node)."""
    return Setting(key, type_, default, check, doc, "node", "node", default_text)


#: The node's own settings (``NodeSettings``), in a fleet entry or ``--node-config``.
# fmt: off
NODE_OWN_SETTINGS: tuple[Setting, ...] = (
    _node("name", str, None, SafeName(), default_text="`node-<i>`", doc=
        "the node's name in logs and records; with `count`, `-1` … `-N` is appended"),
    _node("device", str, None, Choice(_device_kinds), default_text="required", doc=
        "the device kind: its descriptor in `configs/devices/` (frequency table, "
        "power rail, B1's frequency bands, twin coefficients)"),
    _node("backend", str, "simulated", Choice(BACKENDS), doc=
        "`simulated` (a digital twin), `jetson` (devfreq and the INA3221 monitor), `nvml` (an"
        " NVIDIA GPU), `replay` (a measured table), `auto` (the first available, real "
        "hardware first)"),
    _node("p-max-w", (float, str), "none", CapCheck(), doc=
        "the power cap in W on the device's board rail, `\"none\"` for no cap"),
    _node("p-max-schedule", str, None, Documented(" or ".join(SCHEDULE_FORMS)), doc=
        "a cap per round instead of `p-max-w` (give one of the two); a CSV path is relative "
        "to the fleet file's folder (in `--node-config`, to the current folder) ([Cap "
        "schedules](method.md#cap-schedules))"),
    CAP_MARGIN,
)
# fmt: on

#: Keys Flower's simulation puts in node_config, and a fleet entry's ``count``.
# fmt: off
FLOWER_NODE_SETTINGS: tuple[Setting, ...] = (
    _node("partition-id", int, 0, Integer(lo=0), doc=
        "which data partition the node trains on; Flower sets it in simulation (node *i* of "
        "the fleet file), give each real device its own"),
    _node("num-partitions", int, None, Integer(lo=1),
          default_text="the fleet's size, else `1`", doc=
        "how many partitions the data is split into; the same on every device"),
    _node("count", int, 1, AsGiven(), doc=
        "fleet files only: this entry stands for `count` identical nodes"),
)
# fmt: on

#: A rate, window or step of a backend: a finite number > 0 (inf would mean none).
POSITIVE = Range(0.0, math.inf, lo_open=True)

#: The backends' options (``fl_client.devices.DeviceOptions``).
# fmt: off
DEVICE_OPTION_SETTINGS: tuple[Setting, ...] = (
    _option("sysfs-root", str, OrBlank(Text(), "/"), doc=
        "`jetson`: the folder holding `sys/` and `proc/`, or the sysfs mount"),
    _option("state-dir", str, OrBlank(Text()), doc=
        "where a hardware backend saves the GPU limits found at start, to restore them after "
        "a crash; unset: `$POWERFL_STATE_DIR`, else `~/.cache/powerfl/state`"),
    _option("power-source", str, OrBlank(Choice(POWER_SOURCES), "auto"), doc=
        "`jetson`: read power from the INA3221 in sysfs, from the jtop service, or `auto`"),
    _option("power-rails", str, Names(), doc=
        "`jetson`: comma-separated INA3221 rails summed as board power; unset: the board's "
        "input rail (e.g. `VDD_IN`), else the sum of its rails"),
    _option("sample-rate-hz", float, POSITIVE, doc=
        "power samples per second; energy is the time integral of the samples"),
    _option("cap-window-s", float, POSITIVE, doc=
        "how long sampled power may stay above P_max before the cap guard steps the GPU "
        "frequency down one level"),
    _option("replay-table", str, OrBlank(Text()), doc=
        "`replay`: the measured table, CSV or JSON (format: "
        "[configs/replay/README.md](../configs/replay/README.md))"),
    _option("nvml-index", int, Integer(lo=0), doc=
        "`nvml`: the GPU as CUDA numbers it (`cuda:N`), via `CUDA_VISIBLE_DEVICES`"),
    _option("lock-clocks", (bool, str), AutoFlag(), doc=
        "`nvml`: `auto` (unset) locks clocks when root, `false` only measures"),
    _option("knob", str, KnobName(), doc=
        "what the grid's second axis sets: the GPU `frequency` (MHz), the GPU `power-limit` "
        "(W; `nvml` as root, from the GPU's range; a replay table of `power_limit_w`), or "
        "`auto` (the clocks where they can be locked, else the power limit). The original "
        "limit is restored on every exit ([gpu.md](gpu.md#the-power-limit-as-the-knob))"),
    _option("power-limit-step-w", float, POSITIVE, doc=
        "`nvml` with `knob = \"power-limit\"`: the step of the grid of power limits, from the "
        "GPU's highest limit down to its lowest"),
    _option("twin-slowdown", float, Range(1.0, math.inf), doc=
        "`simulated`: from `twin-drift-from-round` on, every step takes this many times "
        "longer (simulated drift such as thermal throttling)"),
    _option("twin-extra-power-w", float, Range(0.0, math.inf), doc=
        "`simulated`: from `twin-drift-from-round` on, every step draws this much more power"),
    _option("twin-drift-from-round", int, Integer(lo=1), doc=
        "`simulated`: the first round of the twin's drift"),
)
# fmt: on

#: Every key of a fleet entry or a node_config, in the docs' order.
NODE_SETTINGS: tuple[Setting, ...] = (
    *NODE_OWN_SETTINGS,
    *FLOWER_NODE_SETTINGS,
    *DEVICE_OPTION_SETTINGS,
)

#: Run settings and node keys by key.
RUN: dict[str, Setting] = {s.key: s for s in RUN_SETTINGS}
NODE: dict[str, Setting] = {s.key: s for s in NODE_SETTINGS}


# ------------------------------------------------------------------------------ reading


def table_keys(table: Sequence[Setting]) -> tuple[str, ...]:
    """The keys of ``table``, in its order."""
    return tuple(s.key for s in table)


def run_defaults() -> dict[str, Any]:
    """Every run setting's default as written in ``[tool.flwr.app.config]``."""
    return {s.key: s.default for s in RUN_SETTINGS}


def choices(key: str) -> tuple[str, ...]:
    """The values a run setting of a ``Choice`` allows (``choices("aggregation")``)."""
    check = RUN[key].check
    if not isinstance(check, Choice):
        raise TypeError(f"{key}: not a choice")
    return check.choices()


def check_known(given: Iterable[str], known: Sequence[str], where: str) -> None:
    """A key of ``given`` not in ``known``: a SettingsError naming it and the nearest known
    one (``<where>: unknown key 'cap-margn' (did you mean cap-margin?)``)."""
    for key in given:
        if key not in known:
            raise SettingsError(unknown_key_message(str(key), known, where))


def parse_settings(cfg: Mapping[str, Any], table: Sequence[Setting], where: str) -> dict[str, Any]:
    """``cfg`` checked against ``table``: an unknown key is refused (``check_known``), and
    every key's value (its default when absent) parsed by its check; the result maps each
    key's Python name (``cap_margin``) to its parsed value."""
    check_known(cfg, table_keys(table), where)
    return {s.field_name: s.parse(cfg.get(s.key, s.default)) for s in table}


def device_options(config: Mapping[str, Any], where: str = "device options") -> DeviceOptions:
    """The backends' options from ``config``, which holds only their keys (a fleet entry's
    or node_config's other keys are the node's own): each key checked and parsed by its
    entry of ``DEVICE_OPTION_SETTINGS`` (absent: its default), an unknown key refused
    naming the nearest; a SettingsError naming the key."""
    values = parse_settings(config, DEVICE_OPTION_SETTINGS, where)
    try:
        return DeviceOptions(**values)
    except ValueError as err:  # a rule across keys (``DeviceOptions.__post_init__``)
        raise SettingsError(str(err)) from None


def check_run_keys(overrides: Mapping[str, Any], where: str, also: Iterable[str] = ()) -> None:
    """Run-setting overrides (a study's, a command's) hold only run settings (and the keys
    of ``also``, such as the deprecated names ``translate_deprecated`` still runs); else a
    SettingsError naming the key and the nearest run setting."""
    check_known(overrides, (*table_keys(RUN_SETTINGS), *also), where)
