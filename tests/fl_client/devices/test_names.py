"""The device names and the unknown-key wording: one leaf that the backends and the
package's factory both read."""

from __future__ import annotations

import ast
import inspect

import fl_client.devices as devices
from fl_client.devices import names


def test_the_package_gives_the_leafs_own_objects() -> None:
    for name in ("BACKENDS", "AUTO_ORDER", "POWER_SOURCES", "key_hint", "unknown_key_message"):
        assert getattr(devices, name) is getattr(names, name), name
    assert set(names.AUTO_ORDER) == set(names.BACKENDS) - {"auto"}


def test_key_hint_names_the_nearest_key_else_lists_them_all() -> None:
    assert names.key_hint("cap-margn", ["p-max-w", "cap-margin"]) == " (did you mean cap-margin?)"
    assert names.key_hint("zzz", ["b", "a"]) == "; known keys: a, b"


def test_unknown_key_message_names_where_the_key_and_the_nearest() -> None:
    message = names.unknown_key_message("power-sorce", ["power-source", "backend"], "node x")
    assert message == "node x: unknown key 'power-sorce' (did you mean power-source?)"


def test_the_leaf_imports_nothing_of_the_project() -> None:
    tree = ast.parse(inspect.getsource(names))
    imported = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert imported and not [m for m in imported if m.startswith("fl_client")]
