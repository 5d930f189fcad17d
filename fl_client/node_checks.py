"""What a node's entry (a fleet file's ``[[node]]`` table, a ``--node-config``) must hold
beyond each key's own check (``fl_client.settings_table``): names that become paths are safe
names, a fleet file leaves Flower's partition keys alone, every backend option's value is
one the backend takes, and a simulated node's device kind has its descriptor.

``fl_client.settings`` calls these where it reads a fleet or a node config; every error is
a SettingsError naming where, the key and what is allowed. Free of Flower and PyTorch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client.contract import SettingsError
from fl_client.devices import check_knob_backend
from fl_client.setting_checks import SafeName
from fl_client.settings_table import NODE, device_options

#: Keys Flower's simulation sets in each node's node_config: a fleet file cannot set them.
PARTITION_KEYS = ("partition-id", "num-partitions")


def node_name(entry: Mapping[str, Any], where: str, default_name: str) -> str:
    """A node's ``name`` (``default_name`` when it has none) after its ``device`` is read:
    both become parts of paths (the node's cache folder, LUT files, the server's LUT
    library), so each must be a safe name (``fl_client.names``)."""
    try:
        SafeName().parse("device", entry["device"])
        return str(NODE["name"].parse(entry.get("name", default_name)))
    except SettingsError as err:
        raise SettingsError(f"{where}: {err}") from None


def check_no_partition_keys(entry: Mapping[str, Any], where: str) -> None:
    """A fleet file's ``[[node]]`` table with ``partition-id`` or ``num-partitions``: a
    SettingsError naming the key, since nothing would read it (node *i* of the fleet is
    Flower's partition *i*, of as many partitions as the fleet has nodes)."""
    for key in PARTITION_KEYS:
        if key in entry:
            raise SettingsError(
                f"{where}: {key}: a fleet file cannot set it ({entry[key]!r}): node i of the "
                "fleet is Flower's partition-id i, and num-partitions is the fleet's number "
                f"of nodes; leave {key} out"
            )


def check_node_options(options: Mapping[str, Any], backend: str, where: str) -> None:
    """Every backend option's value (inf, NaN, a negative step) and a power-limit ``knob``
    on a backend that sets none: a SettingsError naming ``where``, before any engine
    starts (``settings_table.device_options``, ``check_knob_backend``)."""
    try:
        check_knob_backend(backend, device_options(options).knob)
    except ValueError as err:
        raise SettingsError(f"{where}: {err}") from None


@dataclass(frozen=True)
class DescriptorFolder:
    """The active folder of ``<kind>.toml`` device descriptors and the kinds it holds."""

    path: Path
    kinds: tuple[str, ...]
    #: How to give another folder (the user's ``POWERFL_CONFIG_DIR``, if set).
    hint: str

    @classmethod
    def active(cls) -> DescriptorFolder:
        """The folder the twins read; a ``POWERFL_CONFIG_DIR`` that is not a folder is a
        SettingsError naming it."""
        from fl_client.devices.descriptors import (
            CONFIG_DIR_ENV,
            available_device_kinds,
            device_config_dir,
        )

        folder, given = device_config_dir(), os.environ.get(CONFIG_DIR_ENV, "").strip()
        if given and not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "does not exist"
            raise SettingsError(
                f"{CONFIG_DIR_ENV}: {folder} {what}; give the folder of <kind>.toml device "
                f"descriptors, or unset {CONFIG_DIR_ENV} for the shipped ones"
            )
        hint = f" in {CONFIG_DIR_ENV}, or unset it" if given else ""
        return cls(folder, tuple(available_device_kinds()), hint)

    def check_twin(self, node: str, device: str) -> None:
        """A simulated node (a digital twin) whose kind has no ``<kind>.toml`` here: a
        SettingsError naming the node, the file and the folder."""
        if device not in self.kinds:
            held = ", ".join(self.kinds) or "no <kind>.toml at all"
            raise SettingsError(
                f"device: node {node} ({device}): no descriptor {device}.toml in {self.path} "
                f"({held}); give the folder of <kind>.toml device descriptors{self.hint}"
            )
