"""NVML, the library: CUDA's numbering mapped to NVML's (``CUDA_VISIBLE_DEVICES``), and
counting GPUs, on a fake ``pynvml``."""

from __future__ import annotations

import types

import pytest

from fl_client.devices import DeviceUnavailableError
from fl_client.devices.nvml_lib import cuda_to_nvml_index, gpu_count


def test_gpu_count_of_the_fake(fake_pynvml: types.ModuleType):
    assert gpu_count() == 1
    assert gpu_count(fake_pynvml) == 1


def test_gpu_count_without_pynvml_is_unavailable(no_pynvml: None):
    with pytest.raises(DeviceUnavailableError, match="pip install nvidia-ml-py"):
        gpu_count()


UUIDS = [
    "GPU-aaaa1111-0000-0000-0000-000000000000",
    "GPU-bbbb2222-0000-0000-0000-000000000000",
    "GPU-bbbb3333-0000-0000-0000-000000000000",
]


@pytest.mark.parametrize(
    ("index", "visible", "expected"),
    [
        (0, None, 0),
        (2, None, 2),
        (0, "2,0", 2),
        (1, "2,0", 0),
        (0, " 1 ", 1),
        (0, "GPU-bbbb3333-0000-0000-0000-000000000000", 2),
        (0, "GPU-bbbb2", 1),  # an abbreviated UUID, as CUDA allows
        (1, "gpu-aaaa,2", 2),
        (0, "1,-1,0", 1),  # CUDA stops at the first invalid entry
    ],
)
def test_cuda_index_maps_to_nvml_index(index: int, visible: str | None, expected: int):
    assert cuda_to_nvml_index(index, visible, UUIDS) == expected


@pytest.mark.parametrize(
    ("index", "visible", "message"),
    [
        (3, None, "GPU 3 does not exist; this machine has 3"),
        (0, "", r"CUDA_VISIBLE_DEVICES='' makes 0 GPU\(s\) visible, so there is no cuda:0"),
        (1, "1,-1,0", "makes 1 GPU"),
        (0, "7", r"entry '7': this machine has 3 GPU\(s\)"),
        (0, "GPU-bbbb", "matches 2 GPUs"),
        (0, "GPU-ffff", "matches no GPU; GPUs here: GPU-aaaa1111"),
        (0, "MIG-0c7b4a35-8f1e-5bd9-a8c6-0e5d3a0f2b11", "MIG instance"),
        (-1, None, "must be ≥ 0"),
    ],
)
def test_bad_cuda_visible_devices_name_the_setting(index: int, visible: str | None, message: str):
    with pytest.raises(DeviceUnavailableError, match=message):
        cuda_to_nvml_index(index, visible, UUIDS)
