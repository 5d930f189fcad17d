"""The one rule for names that become parts of paths (``fl_client.names``)."""

from __future__ import annotations

import pytest

from fl_client.names import UnsafeNameError, check_safe_name, is_safe_name


@pytest.mark.parametrize(
    "name",
    ["nano-1", "jetson-orin-nano", "n", "A.b_c-9", "x" * 64, "resnet18", "cifar10-subset"],
)
def test_safe_names_pass_unchanged(name: str) -> None:
    assert is_safe_name(name)
    assert check_safe_name(name, "name") == name


@pytest.mark.parametrize(
    "name",
    [
        "../../escaped",
        "..",
        "a..b",
        "a/b",
        "/abs",
        "a\\b",
        "",
        " ",
        "nano 1",
        ".hidden",
        "-flag",
        "x" * 65,
        "nano\n",
        "naïve",
        None,
        3,
    ],
)
def test_unsafe_names_are_refused_naming_key_value_and_rule(name: object) -> None:
    assert not is_safe_name(name)
    with pytest.raises(UnsafeNameError) as err:
        check_safe_name(name, "device-kind")
    text = str(err.value)
    assert text.startswith(f"device-kind: {name!r} cannot be used as a name")
    assert "allowed: 1 to 64 letters, digits" in text and "without '..'" in text


def test_an_unsafe_name_is_a_value_error() -> None:
    # callers that treat a malformed message as a ValueError refuse an unsafe name alike
    with pytest.raises(ValueError, match="node-name"):
        check_safe_name("a/b", "node-name")
