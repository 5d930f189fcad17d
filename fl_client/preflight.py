"""What is checked before work starts, with no engine, PyTorch or Flower: the folders and
files a command writes or reads, and a simulation's settings against its fleet
(``check_before_start``). Every error is a SettingsError naming the key."""

from __future__ import annotations

import os
from pathlib import Path

from fl_client.contract import SettingsError
from fl_client.node_checks import DescriptorFolder
from fl_client.settings import (
    NodeSettings,
    RunSettings,
    app_defaults,
    fleet_buffer_size,
    resolve_path,
)
from fl_client.settings_table import MIN_ROUND_TIMEOUT_S


def check_writable_dir(path: str | Path, key: str) -> Path:
    """``path`` as a folder a run can write into (created later if missing); else a
    SettingsError naming ``key``: the path is a file, lies under a file, or is read-only."""
    p = resolve_path(str(path))
    if p.exists() and not p.is_dir():
        raise SettingsError(f"{key}: {p} is a file, not a folder; give a folder")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise SettingsError(f"{key}: cannot create {p}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "folder" if probe == p else f"folder {probe}, where it would be created,"
        raise SettingsError(f"{key}: cannot write into {p}: the {what} is not writable")
    return p


def check_writable_file(path: str | Path, key: str) -> Path:
    """``path`` as a file this process can write (created, or replaced): not a folder, and
    its folder one it can write into or create (``check_writable_dir``); else a
    SettingsError naming ``key``, before any work whose result it would hold is done."""
    p = resolve_path(str(path))
    if p.is_dir():
        raise SettingsError(f"{key}: {p} is a folder; give the file to write")
    check_writable_dir(p.parent, key)
    return p


def check_input_file(path: str | Path, key: str, allowed: str) -> Path:
    """``path`` as a file that exists (not a folder); else a SettingsError naming ``key``
    and what is ``allowed``."""
    p = resolve_path(str(path))
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "no such file"
        raise SettingsError(f"{key}: {p}: {what}; give {allowed}")
    return p


def device_table_mhz(node: NodeSettings) -> tuple[float, ...] | None:
    """The GPU frequency table of a twin node, from its descriptor; None for hardware and
    replay nodes, whose table is known only once the device is opened."""
    if node.backend != "simulated":
        return None
    from fl_client.devices.descriptors import available_device_kinds, load_device_spec

    if node.device not in available_device_kinds():
        return None
    return load_device_spec(node.device).gpu_freqs_mhz


def check_fixed(settings: RunSettings, fleet: list[NodeSettings]) -> None:
    """``fixed``: the batch size is one of B and the frequency is in every twin's table."""
    from fl_client.devices.base import FREQ_TOLERANCE_MHZ

    b, f = settings.fixed_batch_size, settings.fixed_freq_mhz
    if b is not None and b not in settings.batch_sizes:
        raise SettingsError(
            f"fixed-batch-size: {b} is not one of batch-sizes "
            f"{','.join(map(str, settings.batch_sizes))}"
        )
    if f is None:
        return
    for node in fleet:
        table = device_table_mhz(node)
        if table is not None and not any(abs(f - t) <= FREQ_TOLERANCE_MHZ for t in table):
            raise SettingsError(
                f"fixed-freq-mhz: {f:g} MHz is not in the frequency table of node {node.name} "
                f"({node.device}); its frequencies: {', '.join(f'{t:g}' for t in table)}"
            )


def check_device_files(fleet: list[NodeSettings]) -> None:
    """Every node's device descriptor (``<kind>.toml`` in the active device folder) and
    replay table reads, before any engine starts: a SettingsError naming the node, the
    file and the key, instead of one error per node once the run is going."""
    from fl_client.devices.base import DeviceError
    from fl_client.devices.descriptors import load_device_spec
    from fl_client.devices.replay import load_replay_tables

    descriptors = DescriptorFolder.active()
    seen: set[str] = set()
    for node in fleet:
        if node.backend == "simulated":  # a twin needs its file
            descriptors.check_twin(node.name, node.device)
        if node.device in descriptors.kinds and node.device not in seen:
            seen.add(node.device)
            try:
                load_device_spec(node.device)
            except (ValueError, OSError) as err:
                raise SettingsError(f"device: node {node.name} ({node.device}): {err}") from None
        table = node.options.get("replay-table")
        if node.backend == "replay" and isinstance(table, str) and table.strip():
            try:
                load_replay_tables(table)
            except (DeviceError, ValueError, OSError) as err:
                raise SettingsError(f"replay-table: node {node.name}: {err}") from None
        check_node_folders(node)


def check_node_folders(node: NodeSettings) -> None:
    """A node's ``sysfs-root`` is a folder that exists (its board's sysfs tree, read), and
    its ``state-dir`` a folder it can write (where a GPU's settings are kept until they
    are restored): a SettingsError naming the node and the key, before any engine starts,
    instead of a node left out at its first QUERY."""
    root = node.options.get("sysfs-root")
    if isinstance(root, str) and root.strip():
        path = resolve_path(root.strip())
        if not path.is_dir():
            what = "is a file, not a folder" if path.exists() else "does not exist"
            raise SettingsError(
                f"sysfs-root: node {node.name}: {path} {what}; give the folder that holds the "
                "board's sys/ tree (default: /)"
            )
    state = node.options.get("state-dir")
    if isinstance(state, str) and state.strip():
        check_writable_dir(state.strip(), f"state-dir: node {node.name}")


#: Methods whose fixed GPU frequency comes from the kind's B1 bands (``b1-freq-caps``).
BAND_METHODS = ("b1", "b2")


def check_method_serves_nodes(settings: RunSettings, fleet: list[NodeSettings]) -> None:
    """B1 and B2 run every node at its band's fixed frequency; a cap below a kind's lowest
    band has none, so the node could never train. Refused before start, naming the node
    and the choices, unless ``allow-untrained-nodes`` accepts such a node."""
    if settings.method not in BAND_METHODS or settings.allow_untrained_nodes:
        return
    from fl_client.devices.descriptors import available_device_kinds, descriptor_b1_bands

    kinds = available_device_kinds()
    unserved: list[str] = []
    for node in fleet:
        bands = descriptor_b1_bands(node.device) if node.device in kinds else ()
        if not bands:
            continue  # no bands: B1 runs at the highest frequency (the device says so)
        low = bands[0].min_p_max_w
        below = [c for c in node.scheduled_caps if c.capped and c.watts < low]
        if below:
            caps = ", ".join(c.label for c in below)
            unserved.append(f"{node.name} ({node.device}, cap {caps} < its lowest band {low:g} W)")
    if unserved:
        m = settings.method
        raise SettingsError(
            f"method: {m} cannot serve {len(unserved)} node(s): {'; '.join(unserved)}: {m} "
            f"runs a node at its kind's B1 band frequency, and no band holds below its "
            f"lowest. Choose one: drop {m} (--methods without it), raise the node's cap to "
            f"at least its lowest band (p-max-w in {Path(settings.fleet).name}), or accept "
            "the node untrained (-c allow-untrained-nodes=true)"
        )


def check_before_start(settings: RunSettings, fleet: list[NodeSettings]) -> None:
    """Every check of a simulation's settings that needs no engine, PyTorch or Flower, for
    any method: a SettingsError naming the key, raised before anything starts.

    * ``min-train-nodes`` against the fleet's size (a round would wait forever);
    * ``buffer-size`` (``aggregation = "fedbuff"``) at most the fleet's size;
    * ``round-timeout-s`` at least ``MIN_ROUND_TIMEOUT_S``;
    * ``output-dir`` and ``cache-dir`` are folders this process can write;
    * every node's device descriptor and replay table reads (``check_device_files``);
    * B1 and B2 can serve every node's caps (``check_method_serves_nodes``);
    * with ``fixed``: ``fixed-batch-size`` in B, ``fixed-freq-mhz`` in every twin's table.
    """
    if settings.min_train_nodes > len(fleet):
        nodes = f"{len(fleet)} node" + ("" if len(fleet) == 1 else "s")
        raise SettingsError(
            f"min-train-nodes: {settings.min_train_nodes}, but the fleet "
            f"({Path(settings.fleet).name}) has {nodes}: every round would wait for nodes "
            f"that never come; set min-train-nodes to at most {len(fleet)} "
            f"(-c min-train-nodes={len(fleet)}) or add nodes to the fleet"
        )
    if settings.aggregation == "fedbuff" and fleet_buffer_size(
        settings.buffer_size, len(fleet)
    ) > len(fleet):
        raise SettingsError(
            f"buffer-size: {settings.buffer_size}, but the fleet ({Path(settings.fleet).name}) "
            f"has {len(fleet)} nodes: one version would wait for more updates than the fleet has "
            f"nodes, so the fast nodes' repeated work would outweigh the slow ones; set "
            f"buffer-size to at most "
            f"{len(fleet)} (-c buffer-size={len(fleet)})"
        )
    if settings.round_timeout_s < MIN_ROUND_TIMEOUT_S:
        default = app_defaults().get("round-timeout-s", 600)
        raise SettingsError(
            f"round-timeout-s: {settings.round_timeout_s:g} s is too short to be meant: a "
            "node's first reply needs a worker to start and import PyTorch, and every round "
            f"trains local-epochs on top, so every node would be dropped; give at least "
            f"{MIN_ROUND_TIMEOUT_S:g} s (the default is {float(default):g} s)"
        )
    check_writable_dir(settings.output_dir, "output-dir")
    check_writable_dir(settings.cache_dir, "cache-dir")
    if settings.run_dir:
        check_writable_dir(settings.run_dir, "run-dir")
    check_device_files(fleet)
    check_method_serves_nodes(settings, fleet)
    if settings.method == "fixed":
        check_fixed(settings, fleet)
