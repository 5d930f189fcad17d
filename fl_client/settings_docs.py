"""The configuration reference, ``docs/configuration.md``, generated from the settings schema.

    .venv/bin/python -m fl_client.settings_docs           # (re)write docs/configuration.md
    .venv/bin/python -m fl_client.settings_docs --check   # exit 1 when it is out of date

Everything is read from the schema at run time, so a key added to ``fl_client/settings.py``
shows up when the page is regenerated:

* the keys: ``RunSettings.keys()`` for run settings, ``node_entry_keys()`` for fleet entries
  and ``--node-config`` (node settings, Flower's keys, the backends' ``DeviceOptions``);
* the defaults: ``[tool.flwr.app.config]`` of pyproject.toml, else the field's default;
* what a key allows: the message the settings' own validation gives a bad value (a few
  probe values are tried), so the page says exactly what the code accepts;
* what a key means, the first found of: its entry in ``RUN_HELP`` / ``NODE_HELP`` below, or
  the ``#:`` comment right above its field in the schema (``RunSettings`` in
  ``fl_client/settings.py``, ``DeviceOptions`` in ``fl_client/devices/__init__.py``), or
  that field's trailing ``#`` comment.

A key with no meaning is refused (``undocumented()``; ``tests/test_docs.py`` fails, naming
it), and so is a page that differs from what this module writes now.
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from fl_client.contract import key_of
from fl_client.devices import DeviceOptions
from fl_client.settings import (
    MIN_ROUND_TIMEOUT_S,
    NODE_KEYS,
    REPO_ROOT,
    RunSettings,
    app_defaults,
    node_entry_keys,
    node_settings,
)

#: The page this module writes, and the command that writes it.
DOC_PATH = REPO_ROOT / "docs" / "configuration.md"
COMMAND = ".venv/bin/python -m fl_client.settings_docs"

#: What each run setting means. Allowed values and defaults are not written here: they are
#: read from the schema. Links are relative to docs/.
RUN_HELP: dict[str, str] = {
    "method": "how clients pick (b, f): `power-aware` (Eq. 4 with the proxy r), `b1` (the "
    "state of practice: the largest b at the highest frequency at or below the device's "
    "fixed safe frequency for its cap), `b2` (the b with the smallest proxy r at B1's "
    "frequency), `oracle` (Eq. 4 with r measured on the node's own data), `fixed` "
    "(`fixed-batch-size` at `fixed-freq-mhz` on every node)",
    "fleet": "the fleet file: one `[[node]]` table per node ([Fleet entries](#fleet-entries-"
    "and-node-config)); simulated node *i* is Flower partition *i*. A path (relative to the "
    "current folder), or the name of a fleet the package ships in `fl_client/configs/fleets` "
    "(`default`, `drift`, `nano-only`, `varying-cap`)",
    "model": "`cnn` (a small CNN trained from scratch), `resnet18`, `mobilenetv2` "
    "(torchvision, adapted to 32×32)",
    "dataset": "the run's data: `digits` (scikit-learn's bundled digits, shaped 3×32×32, "
    "offline), a data-kit subset (`cifar10-subset`, `mnist-subset` under `../shared/data`), an "
    "npz path, or a Hugging Face dataset name or folder (10 classes; `HF_DATASETS_OFFLINE=1` "
    "keeps it from downloading); checked before any engine starts",
    "partitioning": "how the clients' data is split over the nodes, by Flower Datasets' "
    "partitioners: `dirichlet` (non-IID), `iid` or `pathological` (`classes-per-node`)",
    "classes-per-node": 'classes each node holds with `partitioning = "pathological"`',
    "dirichlet-alpha": 'the concentration of the Dirichlet split (`partitioning = "dirichlet"`)',
    "seed": "seeds the data split, the partitions, the twins' sensor noise and the training order",
    "num-rounds": "round budget: the run stops after this many rounds or at "
    "`target-accuracy`, whichever comes first",
    "target-accuracy": "test accuracy of the global model at which the run stops",
    "local-epochs": "local work per round, in passes over the node's data (the same samples "
    "whatever b\\* is)",
    "batch-sizes": "the candidate batch sizes B, comma-separated and ascending",
    "lr-ref": "Adam learning rate at `b-ref`; another b uses lr-ref·sqrt(b/b-ref) (the "
    "paper's rule; the paper's 5e-4 is for fine-tuning pretrained CNNs, the default CNN "
    "trains from scratch)",
    "b-ref": "the batch size at which the learning rate is `lr-ref`",
    "proxy-target-accuracy": "accuracy on the server's proxy set that defines N_s_acc(b), "
    "the samples each batch size needs, and with it r (Eq. 3)",
    "r-seeds": "how many data-order seeds r estimation averages N_s_acc(b) over",
    "fraction-train": "share of the connected nodes sent a TRAIN message each round (at "
    "least `min-train-nodes`)",
    "min-train-nodes": "the minimum number of nodes a round is sent to; a simulated fleet "
    "smaller than this is refused before the engine starts",
    "round-timeout-s": "bound on every QUERY and TRAIN round, in seconds; below "
    f"{MIN_ROUND_TIMEOUT_S:g} s it is refused (a node's first reply imports the client app)",
    "output-dir": "where run folders go (relative: to the current folder)",
    "cache-dir": "LUTs, r and oracle caches, and the server's LUT library "
    "(`<cache-dir>/library`; relative: to the current folder)",
    "profile-grid": "`efficient`: only the cells that matter under each node's cap (paper "
    "§4.1, with the robust feasibility of `peak-sigma-k`: each b walks up in f past its first "
    "infeasible cell until two infeasible cells in a row, at most 2 infeasible cells beyond "
    "the first; each smaller b from there; without a cap each b at its highest f, which Eq. 4 "
    "would pick); `full`: every (b, f)",
    "schedule-profiling": "when a node with a `p-max-schedule` profiles its caps' LUTs: "
    "`upfront` profiles every cap in round 1, while every node profiles anyway, so the fleet "
    "waits once; `lazy` profiles a cap the first round it applies, so an unreached cap costs "
    "nothing, but each cap step makes its round wait for that node's profiling "
    "([Cap schedules](method.md#cap-schedules))",
    "fixed-batch-size": "the `fixed` method's batch size, one of `batch-sizes`; only the "
    "`fixed` method reads it",
    "fixed-freq-mhz": "the `fixed` method's GPU frequency in MHz, in every node's frequency "
    "table; only the `fixed` method reads it",
    "peak-sigma-k": "a cell is feasible when its profiled peak plus this many σ of its "
    "per-step peaks is below P_max·(1 − cap-margin); 0: the peak alone "
    "([The selection rule](method.md#the-selection-rule))",
    "tie-tolerance": "cells whose time × r_b is within this share of the least (the noise "
    "level of LUT cells) are ties, broken by the least energy to accuracy (average power × "
    "time × r_b)",
    "balance": "what a node that would finish before the round's planned deadline does with "
    "its slack: `off` its own Eq. 4 choice; `samples` the most sample-efficient cell (least "
    "r_b) that meets the deadline; `steps` more local steps until the deadline; `energy` "
    "at its own b* the frequency of least energy above idle power that meets it (a node that "
    'finishes early waits at idle power; what `pacing = "deadline"` did; `pacing` is '
    "deprecated). The node that sets the pace takes its fastest cell, or with "
    "`critical-r-weight` > 0 its least time × r_b^w ([The round plan](method.md#the-round-plan))",
    "critical-r-weight": "how much r_b still weighs in the choice of the node that sets the "
    "pace, with `balance` on: its cell of least time × r_b^w (0: its fastest cell, the least "
    "round time; 1: its own Eq. 4 cell); the server plans the round's deadline from the same "
    "cell",
    "straggler-work": "the share of its local work the node that sets the pace runs, with "
    "`balance` on (1: all of it)",
    "round-deadline-s": "a fixed round deadline in seconds of local training time, with "
    "`balance` on; 0: the critical node's best predicted round time (`pacing-deadline-s` "
    "is its deprecated name)",
    "deadline-margin": "share of the round's deadline a node with slack keeps in reserve "
    "against noise, with `balance` on; a node later than the deadline by more than this "
    "share has missed it (`pacing-margin` is its deprecated name)",
    "cap-margin": "share of P_max kept free: a (b, f) is feasible only if its profiled peak "
    "is below P_max·(1 − cap-margin); a node's own `cap-margin` overrides it; 0 is the "
    "paper's rule ([The cap margin](method.md#the-cap-margin))",
    "drift-check-every": "every k rounds a node re-measures its operating point and compares "
    "it with its LUT; 0 = never ([Drift checks](method.md#drift-checks))",
    "drift-threshold": "relative deviation beyond which a drift check re-profiles the batch "
    "size's row up to the cap less `cap-margin`; also how far a trained round's peak may "
    "exceed what its LUT cell promised (peak + `peak-sigma-k`·σ, checked every round at no "
    "cost) before the LUT file is set aside and profiled again",
    "r-eval-every-samples": "r estimation evaluates on the proxy set every this many "
    "training samples",
    "r-max-samples": "a batch size that has not reached `proxy-target-accuracy` after this "
    "many samples is left out of B; the oracle uses the same budget on a node's data",
    "shared-profiling": "`fleet`: nodes of one kind (device kind, backend, model, input "
    "shape, B) measure one LUT together in slices, each node checks its own chosen cell "
    "(`shared-verify`), and the server keeps the LUT in its library; `off`: every node "
    "profiles its own ([Fleet-shared profiling](method.md#fleet-shared-profiling))",
    "shared-verify": "how a node checks its chosen cell of its kind's LUT on its board: "
    "`training`: by the round's own training steps (time against the cell's, peak against "
    "its promise, no cap-guard step-down), free, while the cap guard holds the cap; "
    "`before`: one cell measured before training. A board found off the LUT by more than "
    "`drift-threshold` has the cell measured before its next round and its row re-profiled",
    "shared-seed-cells": "cells spread over the (b, f) grid that fleet-shared profiling "
    "measures first",
    "shared-cells-per-cap": "further cells per distinct cap, in one pool per kind (a settled "
    "cap leaves its share to the others), where a fit to the cells so far is unsure of a "
    "cap's choice and boundary",
    "profile-steps-train": "keep the updates of the profiled minibatches (real local "
    "batches, lr scaled for their b), so profiling also moves the model",
    "run-dir": "the run's own folder, created if missing (one that holds a finished run's "
    "`summary.json` is refused); empty: a new `<output-dir>/<UTC time>-<method>`. "
    "`powerfl simulate --engine runtime` sets it to read back exactly its own run "
    "([Flower's Simulation Runtime](simulation.md#flowers-simulation-runtime-and-ray-clusters)); "
    "`powerfl simulate` refuses it with more than one method",
    "simulated-fleet": "the run's nodes are the fleet file's (Flower's partition *i* is fleet "
    "node *i*), so the server names a node that failed by its fleet entry; `powerfl simulate "
    "--engine runtime` sets it (the in-process engine hands the fleet to the server itself)",
    "aggregation": "how the server combines the nodes' arrays each round: `fedavg` (weighted "
    "by local samples) or `fednova` (FedNova's normalised averaging: each node's update "
    "divided by its local work, `local-steps` × `local-lr`, then scaled by the fleet's "
    "mean work; FedAvg exactly when every node did equal work) "
    "([Aggregation](method.md#aggregation))",
    "idle-accounting": "`on`: the headline fleet energy (`fleet-energy-j`, "
    "`fleet-energy-to-target-j`, the console's *energy→target*) counts each board's idle "
    "power while it waits for the round's slowest node; `off`: training and profiling "
    "only, the figure of earlier runs. The records hold both parts either way "
    "([Records](design.md#5-records))",
}

#: What each key of a fleet entry (``[[node]]`` in a fleet file) or ``--node-config`` means.
NODE_HELP: dict[str, str] = {
    "name": "the node's name in logs and records; with `count`, `-1` … `-N` is appended",
    "device": "the device kind: its descriptor in `fl_client/configs/devices/` (frequency "
    "table, power rail, B1's frequency bands, twin coefficients)",
    "backend": "`simulated` (a digital twin), `jetson` (devfreq and the INA3221 monitor), "
    "`nvml` (an NVIDIA GPU), `replay` (a measured table), `auto` (the first available, real "
    "hardware first)",
    "p-max-w": 'the power cap in W on the device\'s board rail, `"none"` for no cap',
    "p-max-schedule": "a cap per round instead of `p-max-w` (give one of the two); a CSV path "
    "is relative to the fleet file's folder (in `--node-config`, to the current folder) "
    "([Cap schedules](method.md#cap-schedules))",
    "cap-margin": "this node's share of P_max kept free of profiled peaks, instead of the "
    "run's `cap-margin`",
    "partition-id": "which data partition the node trains on; Flower sets it in simulation "
    "(node *i* of the fleet file), give each real device its own",
    "num-partitions": "how many partitions the data is split into; the same on every device",
    "count": "fleet files only: this entry stands for `count` identical nodes",
    "sysfs-root": "`jetson`: the folder holding `sys/` and `proc/`, or the sysfs mount",
    "state-dir": "where a hardware backend saves the GPU limits found at start, to restore "
    "them after a crash; unset: `$POWERFL_STATE_DIR`, else `~/.cache/powerfl/state`",
    "power-source": "`jetson`: read power from the INA3221 in sysfs, from the jtop service, "
    "or `auto`",
    "power-rails": "`jetson`: comma-separated INA3221 rails summed as board power; unset: the "
    "board's input rail (e.g. `VDD_IN`), else the sum of its rails",
    "sample-rate-hz": "power samples per second; energy is the time integral of the samples",
    "cap-window-s": "how long sampled power may stay above P_max before the cap guard steps "
    "the GPU frequency down one level",
    "replay-table": "`replay`: the measured table, CSV or JSON (format: "
    "[fl_client/configs/replay/README.md](../fl_client/configs/replay/README.md))",
    "nvml-index": "`nvml`: the GPU as CUDA numbers it (`cuda:N`), via `CUDA_VISIBLE_DEVICES`",
    "lock-clocks": "`nvml`: `auto` (unset) locks clocks when root, `false` only measures",
    "knob": "what the grid's second axis sets: the GPU `frequency` (MHz), the GPU "
    "`power-limit` (W; `nvml` as root, from the GPU's range; a replay table of "
    "`power_limit_w`), or `auto` (the clocks where they can be locked, else the power limit). "
    "The original limit is restored on every exit ([gpu.md](gpu.md#the-power-limit-as-the-knob))",
    "power-limit-step-w": '`nvml` with `knob = "power-limit"`: the step of the grid of '
    "power limits, from the GPU's highest limit down to its lowest",
    "twin-slowdown": "`simulated`: from `twin-drift-from-round` on, every step takes this "
    "many times longer (simulated drift such as thermal throttling)",
    "twin-extra-power-w": "`simulated`: from `twin-drift-from-round` on, every step draws "
    "this much more power",
    "twin-drift-from-round": "`simulated`: the first round of the twin's drift",
}

#: Defaults of the fleet-entry keys that are not ``DeviceOptions`` fields (Markdown).
NODE_DEFAULTS: dict[str, str] = {
    "name": "`node-<i>`",
    "device": "required",
    "backend": '`"simulated"`',
    "p-max-w": '`"none"`',
    "p-max-schedule": "unset",
    "cap-margin": "the run's `cap-margin`",
    "partition-id": "`0`",
    "num-partitions": "the fleet's size, else `1`",
    "count": "`1`",
}

#: Values tried on a key to make the schema's validation say what it allows: a tiny
#: positive number (narrow lower bounds), a large negative one, and a string that no key
#: accepts.
PROBES: tuple[object, ...] = (1e-9, -1e9, "\x00?")


# --------------------------------------------------------------------- reading the schema


def _field_comments(cls: type) -> dict[str, str]:
    """Field (kebab-case key) → its ``#:`` comment block, else its trailing ``#`` comment,
    from the class and the dataclasses it extends."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if "__dataclass_fields__" in vars(klass):
            out.update(_class_comments(klass))
    return out


def _class_comments(cls: type) -> dict[str, str]:
    names = set(vars(cls).get("__annotations__", {}))
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # pragma: no cover - no source (frozen app)
        return {}
    out: dict[str, str] = {}
    block: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith(("def ", "@")):
            break
        if stripped.startswith("#:"):
            block.append(stripped[2:].strip())
            continue
        field = re.match(r"(\w+)\s*:[^=]*(?:=\s*([^#]*))?(?:#\s*(.*))?$", stripped)
        if field and field.group(1) in names:
            text = " ".join(block) or (field.group(3) or "")
            if text.strip():
                out[key_of(field.group(1))] = _markdown(text, key_of(field.group(1)))
        block = []
    return out


def _markdown(text: str, key: str) -> str:
    """A schema comment as one Markdown sentence: ``x`` → `x`, a leading "key:" dropped."""
    text = re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split()))
    text = re.sub(rf"^`?{re.escape(key)}`?\s*:\s*", "", text).rstrip(".")
    if text[:1].isupper() and not text[1:2].isupper():  # "A run …" → "a run …"; "GPU" stays
        text = text[:1].lower() + text[1:]
    return text


def _allowed(check: Callable[[dict[str, Any]], object], key: str, base: Mapping[str, Any]) -> str:
    """What ``key`` allows, in the words of the error a bad value gets from ``check``."""
    for probe in PROBES:
        try:
            check({**base, key: probe})
        except Exception as err:  # SettingsError, or ValueError from the device options
            message = str(err)
            at = message.rfind(f"{key}: ")
            if at < 0:
                continue
            return _allowed_text(message[at + len(key) + 2 :])
    return ""


def _allowed_text(message: str) -> str:
    if "allowed: " in message:
        values = message.split("allowed: ", 1)[1].strip()
        items = [v.strip() for v in values.split(",")]
        if all(re.fullmatch(r"[\w.+-]+", v) for v in items):
            return " \\| ".join(f"`{v}`" for v in items)
        return values
    text = re.split(r",? got ", message, maxsplit=1)[0].strip().rstrip(",;")
    return re.sub(r"^(expected |must be )", "", text)


def _toml(value: object) -> str:
    """A default as it is written in pyproject.toml or a fleet file (Markdown)."""
    if value is None or value == ():
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple | list):
        return f'`"{",".join(map(str, value))}"`'
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return f"`{value:.1f}`"
    return f"`{value}`"


def run_settings_rows() -> list[tuple[str, str, str, str]]:
    """(key, default, allowed, meaning) per run setting, in the schema's order."""
    defaults = app_defaults()
    comments = _field_comments(RunSettings)
    rows = []
    for f in fields(RunSettings):
        key = key_of(f.name)
        if key in defaults:
            default = _toml(defaults[key])
        elif f.default is not MISSING:
            default = _toml(f.default)
        else:
            default = "required"
        allowed = _allowed(RunSettings.from_config, key, {})
        rows.append((key, default, allowed, RUN_HELP.get(key) or comments.get(key, "")))
    return rows


def _check_node(entry: dict[str, Any]) -> object:
    return node_settings(entry, None)


def node_rows() -> list[tuple[str, str, str, str]]:
    """(key, default, allowed, meaning) per fleet-entry / node-config key."""
    option_fields = {key_of(f.name): f for f in fields(DeviceOptions)}
    comments = _field_comments(DeviceOptions)
    kind = {"device": _some_device_kind()}
    rows = []
    for key in node_entry_keys():
        if key in option_fields:
            default = _toml(option_fields[key].default)
            allowed = _allowed(DeviceOptions.from_config, key, {})
        else:
            default = NODE_DEFAULTS.get(key, "")
            allowed = _allowed(_check_node, key, kind) if key in NODE_KEYS else ""
        rows.append((key, default, allowed, NODE_HELP.get(key) or comments.get(key, "")))
    return rows


def _some_device_kind() -> str:
    from fl_client.devices.simulated import available_device_kinds

    kinds = available_device_kinds()
    return kinds[0] if kinds else "jetson-nano"


def undocumented() -> list[str]:
    """Keys of the schema with no meaning or no default (run settings, then fleet keys)."""
    missing = [f"run setting {k}" for k, _, _, help in run_settings_rows() if not help]
    missing += [
        f"fleet entry key {k}" for k, default, _, help in node_rows() if not help or not default
    ]
    return missing


# --------------------------------------------------------------------------- the page


def _table(rows: Sequence[tuple[str, str, str, str]]) -> str:
    lines = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for key, default, allowed, meaning in rows:
        cells = (f"`{key}`", default, allowed or "–", meaning.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


HEADER = f"""\
<!-- Generated by `{COMMAND}` from the settings schema (fl_client/settings.py).
     Do not edit by hand: change the schema or fl_client/settings_docs.py and regenerate. -->

# Configuration reference

Every run setting, and every key of a fleet entry, with its default, what it allows and what
it means. This page is generated from the settings schema; `tests/test_docs.py` fails when a
setting has no meaning here or when the page is out of date (regenerate it with
`{COMMAND}`).

## Where settings are set

Run settings are the keys of `[tool.flwr.app.config]` in `pyproject.toml` (kebab-case),
which hold their defaults. `powerfl simulate` runs the app in Flower's simulation engine,
one virtual SuperNode per fleet node, and `-c KEY=VALUE` overrides any of them (VALUE as
TOML, e.g. `-c lr-ref=0.003`); the same ServerApp and ClientApp run on real devices with
Flower's SuperLink and SuperNodes ([deployment.md](deployment.md)), where
`flwr run . <connection> --run-config "method='b1'"` sets them. An unknown key, a bad value
or a key given twice is refused before anything starts, naming the key
([bad-input.md](bad-input.md), which also gives the rule for relative paths).

```bash
.venv/bin/powerfl simulate -c local-epochs=2 -c cap-margin=0 -c balance=energy
```

A fleet file (`fl_client/configs/fleets/*.toml`) has one `[[node]]` table per node, e.g.
`fl_client/configs/fleets/default.toml`:

```toml
[[node]]
name = "nano-4.5w"
device = "jetson-nano"      # jetson-nano | jetson-tx2-nx | jetson-orin-nano | jetson-agx-orin
p-max-w = 4.5               # watts on the device's board rail; "none" = no cap
count = 2                   # two identical nodes, nano-4.5w-1 and nano-4.5w-2
```

On a real device the same keys are given to `flower-supernode --node-config`
([jetson-setup.md](jetson-setup.md)). Device descriptors live in `fl_client/configs/devices/*.toml`
(frequency tables, memory, power rail, B1's safe frequency per cap band, twin coefficients
with their calibration sources).

**Nothing is ignored without a word.** A setting that cannot take effect in a run (the
round plan's `straggler-work`, `round-deadline-s`, `critical-r-weight` or `deadline-margin`
with `balance = "off"`; `balance` when no method of the run plans a round; a partitioner's
or the fixed method's own keys for a run without them) is refused before start, naming
it, when it is typed for this run (`-c`, `--methods`). Where a shared config carries it (the
app's `pyproject.toml`, a `--run-config` used for several runs, a comparison of methods of
which only some read it, an experiment file's keys for scenarios it leaves out) it is named
in one warning line at start and the run goes on. A fleet file cannot set Flower's
`partition-id` or `num-partitions` (node *i* is partition *i*). Every name that becomes
part of a path (a node's `name`, its `device` kind, the backend and model a node reports,
a study's `name`) is 1 to 64 letters, digits, `.`, `_` or `-`, starting with a letter or
digit, without `..`: checked where a fleet, node config or experiment file is read, and
again when a node's QUERY reply reaches the server, which leaves such a node out as it does
a failing one.

## Run settings

"""

NODE_INTRO = """

## Fleet entries and node config

The keys of a `[[node]]` table in a fleet file, or of a SuperNode's `--node-config`: the
node's own settings, Flower's keys, and the backends' options (the backend named in the
meaning reads the key; the others ignore it). A relative path in a fleet file (a CSV
`p-max-schedule`, `replay-table`, `sysfs-root`, `state-dir`) is relative to the fleet file's
folder, from any current directory.

"""


FINE_TUNING = """

## Fine-tuning from pre-trained weights

A run starts from the model's seeded random weights unless `initial-weights` names a
checkpoint: a safetensors file (what `powerfl pretrain` writes) or a PyTorch state dict
saved with `torch.save(model.state_dict(), path)`. The server reads it, sends it to every
node as the round-0 global model (the nodes get the weights in their first message, never
the path: in a deployment the file lives on the server only) and starts r estimation from
it for every batch size, as the paper does. `proxy-dataset` takes r from a second dataset
(the paper's proxy) while the nodes fine-tune on `dataset`.

```bash
# pre-train the default CNN on the data kit's MNIST subset (server side; GPU if any)
.venv/bin/powerfl pretrain --model cnn --dataset mnist-subset --epochs 2 \\
    --out checkpoints/cnn-mnist-subset.safetensors
# the default run, fine-tuning those weights on the digits
.venv/bin/powerfl simulate -c initial-weights=checkpoints/cnn-mnist-subset.safetensors
# r from another dataset than the nodes' (the paper's proxy): -c proxy-dataset=NAME
```

From these weights the default run reaches its target in 5 rounds with ours (16 from random
weights) and 9 with B1 (15); the figures, and why MNIST and not CIFAR-10, are in
[experiments.md](experiments.md#fine-tuning-from-pre-trained-weights). The default
run itself stays a from-scratch run: it needs nothing outside the repository, and the
checkpoint is pre-trained on the data kit (`../shared/data`).

`powerfl pretrain` writes `FILE.json` beside the checkpoint (model, dataset, test accuracy,
seed, epochs, the command, the file's sha256); an interrupted pre-training goes on from its
last epoch when the same command is run again (`FILE.resume.pt`).

Checked before any engine starts (exit 2, nothing started): a missing or unreadable file, a
truncated one, a pickle that would need to run code to load (refused, never executed), and
a checkpoint whose tensor names or shapes are not the model's (the first mismatched key is
named with both shapes). One difference is allowed: a classifier head (the model's last
linear layer: `head` of `cnn`, `fc` of `resnet18`, `classifier.1` of `mobilenetv2`) for
another number of classes is replaced by the model's own seeded initialisation, and its keys
are recorded as new layers. The checkpoint's sha256 and new layers are in the run's
`settings.json` (`initial_weights_sha256`, `initial_weights_new_layers`) and `summary.json`
(`initial-weights-sha256`, `initial-weights-new-layers`), and the sha256 is part of the r
cache key: r from other weights, or from a checkpoint changed since, is never reused. That
holds for the server's proxy r and for the oracle's r on each node, which gets the sha256
in its TRAIN config (`initial-weights-sha256`; the nodes never see the file). The
study comparing fine-tuning with training from scratch is in
[experiments.md](experiments.md).
"""


def render() -> str:
    """The whole of docs/configuration.md, from the schema as it is now."""
    return (
        HEADER + _table(run_settings_rows()) + NODE_INTRO + _table(node_rows()) + "\n" + FINE_TUNING
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fl_client.settings_docs",
        description="Write docs/configuration.md from the settings schema.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the page is out of date"
    )
    parser.add_argument("--out", type=Path, default=DOC_PATH, help="default: docs/configuration.md")
    args = parser.parse_args(argv)
    missing = undocumented()
    if missing:
        print(
            "settings_docs: no meaning for " + ", ".join(missing) + ": add it to RUN_HELP or "
            "NODE_HELP in fl_client/settings_docs.py, or a #: comment above its field",
            file=sys.stderr,
        )
        return 1
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
