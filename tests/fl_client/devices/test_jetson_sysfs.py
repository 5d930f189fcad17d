"""Jetson sysfs: the permission message (the sysfs tree and devfreq node are exercised through
the device in test_jetson.py)."""

from __future__ import annotations

from pathlib import Path

from fl_client.devices import jetson_sysfs


def test_permission_message_names_jtop_cannot_set_frequency():
    msg = jetson_sysfs.permission_message(Path("/sys/x/min_freq"))
    assert "cannot set the GPU frequency" in msg
