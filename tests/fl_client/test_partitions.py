"""Flower Datasets partitioners over the pool, the per-node split report, and the datasets a
run can use besides the embedded digits (npz files, Hugging Face folders); bad input is an
error naming the key before anything starts. Nothing here downloads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_client import data_splits, image_data, model_zoo, partitions
from fl_client.contract import SettingsError
from fl_client.partitions import Partitioning
from tests.image_npz import REAL_DATA_ROOT, write_image_npz

LABELS = np.arange(1000) % 10
PATHOLOGICAL_1 = data_splits.PartitionSpec("pathological", seed=1)


@pytest.fixture
def hf_offline(tmp_path, monkeypatch):
    """Hugging Face offline, its cache in tmp_path: nothing is downloaded or written home."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-home" / "datasets"))
    import datasets
    import huggingface_hub

    # datasets and huggingface_hub read these when first imported (maybe earlier).
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-home" / "datasets")
    image_data.load_hf_cached.cache_clear()
    data_splits.load_splits.cache_clear()
    yield tmp_path
    image_data.load_hf_cached.cache_clear()
    data_splits.load_splits.cache_clear()


# --------------------------------------------------------------------------- partitioners


@pytest.mark.parametrize("partitioning", ["iid", "dirichlet", "pathological"])
def test_each_partitioner_is_seeded_disjoint_and_leaves_no_node_empty(partitioning):
    parts = partitions.partition(LABELS, 6, Partitioning(partitioning, alpha=0.5, seed=3))
    again = partitions.partition(LABELS, 6, Partitioning(partitioning, alpha=0.5, seed=3))
    assert all(np.array_equal(p, q) for p, q in zip(parts, again, strict=True))
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined)) and min(map(len, parts)) > 0
    if partitioning != "pathological":  # iid and dirichlet cover the pool exactly once
        np.testing.assert_array_equal(np.sort(joined), np.arange(len(LABELS)))


def label_skew(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean total-variation distance between each part's label histogram and the whole's."""
    k = int(labels.max()) + 1
    whole = np.bincount(labels, minlength=k) / len(labels)
    return float(
        np.mean(
            [
                0.5 * np.abs(np.bincount(labels[p], minlength=k) / len(p) - whole).sum()
                for p in parts
            ]
        )
    )


def test_iid_parts_are_near_equal_and_cover_the_pool_once():
    parts = partitions.partition(np.zeros(101, dtype=np.int64), 4, Partitioning("iid", seed=1))
    assert sorted(len(p) for p in parts) == [25, 25, 25, 26]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(101))


def test_dirichlet_keeps_its_min_size_and_skews_the_labels_more_than_iid():
    labels = data_splits.as_tensors(data_splits.load_digits_splits(seed=7).pool)[1].numpy()
    parts = partitions.partition(
        labels, 8, Partitioning("dirichlet", alpha=0.5, seed=7, min_size=20)
    )
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    assert min(len(p) for p in parts) >= 20
    other = partitions.partition(
        labels, 8, Partitioning("dirichlet", alpha=0.5, seed=8, min_size=20)
    )
    assert not all(np.array_equal(p, q) for p, q in zip(parts, other, strict=True))
    iid = partitions.partition(labels, 8, Partitioning("iid", seed=7))
    assert label_skew(parts, labels) > 2 * label_skew(iid, labels)


def test_pathological_gives_each_node_its_number_of_classes():
    parts = partitions.partition(
        LABELS, 5, Partitioning("pathological", classes_per_node=3, seed=0)
    )
    assert [len(np.unique(LABELS[p])) for p in parts] == [3] * 5


def test_iid_is_flower_datasets_iid_partitioner_over_the_seeded_shuffle():
    from datasets import Dataset
    from flwr_datasets.partitioner import IidPartitioner

    ours = partitions.partition(np.zeros(50, dtype=int), 4, Partitioning("iid", seed=9))
    ds = Dataset.from_dict({"label": [0] * 50, "index": list(range(50))}).shuffle(seed=9)
    theirs = IidPartitioner(num_partitions=4)
    theirs.dataset = ds
    for i in range(4):
        assert ours[i].tolist() == sorted(theirs.load_partition(i)["index"])


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"partitioning": "shards"}, "partitioning: unknown value 'shards'"),
        ({"num_partitions": 0}, "num-partitions"),
        ({"num_partitions": 1001, "partitioning": "iid"}, "num-partitions"),
        ({"alpha": 0.0}, "dirichlet-alpha: must be > 0"),
        ({"alpha": float("nan")}, "dirichlet-alpha"),
        ({"num_partitions": 101}, "min_size"),  # 101 nodes × 10 samples > 1,000
        ({"partitioning": "pathological", "classes_per_node": 11}, "classes-per-node"),
        ({"partitioning": "pathological", "classes_per_node": 0}, "classes-per-node"),
    ],
)
def test_bad_partition_settings_name_the_key(kwargs, key):
    args = {"num_partitions": 4, "partitioning": "dirichlet", **kwargs}
    num_partitions = args.pop("num_partitions")
    with pytest.raises(SettingsError, match=key):
        partitions.partition(LABELS, num_partitions, Partitioning(**args))


def test_a_split_that_would_leave_a_node_empty_is_refused_naming_the_key():
    # Label 0 has 2 samples but 3 nodes need it (first class assigned deterministically).
    labels = np.array([0, 0] + [1] * 50 + [2] * 50)
    with pytest.raises(SettingsError, match="classes-per-node"):
        partitions.partition(labels, 7, Partitioning("pathological", classes_per_node=1, seed=0))
    # A Dirichlet split that cannot give every node min_size samples.
    with pytest.raises(SettingsError, match="dirichlet-alpha: no Dirichlet"):
        partitions.partition(
            LABELS, 20, Partitioning("dirichlet", alpha=0.001, seed=0, min_size=45)
        )


def test_client_data_uses_the_partitioner_and_rejects_empty_nodes():
    total = sum(sum(map(len, data_splits.client_data(p, 5, spec=PATHOLOGICAL_1))) for p in range(5))
    assert 0 < total <= len(data_splits.load_digits_splits(1).pool)
    train, _ = data_splits.client_data(0, 5, spec=PATHOLOGICAL_1)
    assert len(train.tensors[1].unique()) <= data_splits.CLASSES_PER_NODE
    pool = len(data_splits.load_digits_splits(1).pool)
    with pytest.raises(SettingsError, match="num-partitions"):
        data_splits.client_data(0, pool + 1, spec=data_splits.PartitionSpec("iid", seed=1))


def test_flower_datasets_is_not_imported_with_task():
    """Node processes import task; Flower Datasets (≈2 s) comes only with a split."""
    code = "import sys, fl_client.task; print('flwr_datasets' in sys.modules)"
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"},
    )
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- split report


def test_split_report_has_a_line_per_node_and_saves_plot_and_json(tmp_path):
    names = [f"node-{i}" for i in range(4)]
    spec = data_splits.PartitionSpec("dirichlet", alpha=0.5, seed=7)
    report = data_splits.split_report(4, spec=spec, names=names)
    lines = report.lines()
    assert len(lines) == 5 and "digits over 4 nodes: dirichlet" in lines[0]
    assert "dirichlet-alpha 0.5" in lines[0]
    for name, line, size in zip(names, lines[1:], report.sizes(), strict=True):
        assert line.split()[0] == name and f"{size} samples" in line
        assert line.count("[") == 1  # the label histogram
    # The report's counts are exactly what client_data hands each node.
    for i in range(4):
        train, val = data_splits.client_data(i, 4, spec=spec)
        labels = torch.cat([train.tensors[1], val.tensors[1]]).numpy()
        assert list(report.counts[i]) == np.bincount(labels, minlength=10).tolist()
    written = report.save(tmp_path / "run")
    assert [p.name for p in written] == ["split.json", "split.png"]
    assert (tmp_path / "run" / "split.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((tmp_path / "run" / "split.json").read_text())
    assert [n["node"] for n in data["nodes"]] == names
    assert sum(n["samples"] for n in data["nodes"]) == len(data_splits.load_digits_splits(7).pool)


def test_split_report_names_must_match_the_nodes():
    with pytest.raises(ValueError, match="names"):
        data_splits.split_report(3, spec=data_splits.PartitionSpec("iid"), names=["a", "b"])


# --------------------------------------------------------------------------- npz datasets


def test_a_good_npz_reads_and_becomes_a_run_dataset(tmp_path):
    path = write_image_npz(tmp_path / "kit.npz", n_train=700, n_test=80)
    arrays = image_data.read_npz(path)
    assert arrays.x_train.shape == (700, 32, 32, 3) and arrays.classes[0] == "class0"
    splits = data_splits.load_splits(str(path), 0)
    assert splits.sizes() == {"proxy-train": 300, "proxy-eval": 150, "test": 80, "pool": 250}
    x, y = data_splits.as_tensors(splits.pool)
    assert x.shape[1:] == model_zoo.IMAGE_SHAPE and x.dtype == torch.float32
    assert set(y.tolist()) == set(range(10))
    ids = np.concatenate([splits.indices[k] for k in ("proxy-train", "proxy-eval", "pool")])
    assert len(np.unique(ids)) == 700  # the proxy slices and the pool are disjoint
    data_splits.check_dataset(str(path))
    train, val = data_splits.client_data(
        1, 3, spec=data_splits.PartitionSpec("iid", dataset=str(path))
    )
    assert len(train) + len(val) in (83, 84)


@pytest.mark.parametrize(
    ("kwargs", "lacks"),
    [
        ({"drop": ("x_test",)}, "lacks x_test"),
        ({"drop": ("y_train", "y_test")}, "lacks y_train, y_test"),
        ({"x_train": np.zeros((5, 32, 32), dtype=np.float32)}, "x_train is float32, lacks uint8"),
        ({"x_train": np.zeros((5, 32, 32, 2), dtype=np.uint8)}, "x_train has shape (5, 32, 32, 2)"),
        ({"y_train": np.zeros(3, dtype=np.int64)}, "y_train has shape (3,), lacks one label"),
        ({"y_test": np.full(60, 12)}, "y_test holds labels 12..12, lacks labels in [0, 10)"),
        ({"classes": np.array(["a", "b"])}, "classes has shape (2,), lacks 10 class names"),
    ],
)
def test_a_bad_npz_is_refused_naming_the_file_and_what_it_lacks(tmp_path, kwargs, lacks):
    path = write_image_npz(tmp_path / "bad.npz", **kwargs)
    with pytest.raises(image_data.ImageDataError) as err:
        image_data.read_npz(path)
    assert str(path) in str(err.value) and lacks in str(err.value)
    with pytest.raises(SettingsError, match="dataset: ") as err2:
        data_splits.check_dataset(str(path))
    assert str(path) in str(err2.value)


def test_a_file_that_is_not_an_npz_is_refused(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_text("not a zip")
    with pytest.raises(image_data.ImageDataError, match="not a readable npz"):
        image_data.read_npz(path)


def test_a_missing_kit_subset_names_the_data_root(tmp_path):
    with pytest.raises(image_data.ImageDataError) as err:
        image_data.load_npz("cifar10-subset", tmp_path)
    assert str(tmp_path / "cifar10-subset.npz") in str(err.value) and "data root" in str(err.value)


def test_a_too_small_dataset_is_refused_naming_the_key(tmp_path):
    path = write_image_npz(tmp_path / "small.npz", n_train=100)
    with pytest.raises(SettingsError, match=r"dataset: .* has 100 training images"):
        data_splits.check_dataset(str(path))


@pytest.mark.skipif(
    not (REAL_DATA_ROOT / "cifar10-subset.npz").is_file(), reason="no data kit beside the repo"
)
def test_the_data_kit_subsets_read_as_documented():
    for name in image_data.SHARED_SUBSETS:
        arrays = image_data.load_npz(name)
        assert arrays.sizes() == {"train": 10_000, "test": 2_000}
        assert np.bincount(arrays.y_train).tolist() == [1000] * 10
    assert image_data.load_npz("cifar10-subset").classes[0] == "airplane"


# --------------------------------------------------------------------------- Hugging Face


def _hf_dataset_dict(n_train: int = 520, n_test: int = 40, label: str = "label") -> object:
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    def split(n: int, seed: int) -> Dataset:
        x, y = (np.asarray(a) for a in _small_images(n, seed))
        features = Features({"img": Image(), label: ClassLabel(names=[f"c{k}" for k in range(10)])})
        return Dataset.from_dict({"img": list(x), label: y.tolist()}, features=features)

    return DatasetDict({"train": split(n_train, 0), "test": split(n_test, 1)})


def _small_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 10
    x = (rng.integers(0, 40, (n, 8, 8, 3)) + 20 * y[:, None, None, None]).astype(np.uint8)
    return x, y


def test_a_local_hugging_face_dataset_is_a_run_dataset(hf_offline):
    folder = hf_offline / "saved"
    _hf_dataset_dict().save_to_disk(str(folder))  # type: ignore[attr-defined]
    data_splits.check_dataset(str(folder))
    splits = data_splits.load_splits(str(folder), 0)
    assert splits.sizes()["test"] == 40 and splits.sizes()["pool"] == 520 - 450
    assert splits.class_names[:2] == ("c0", "c1")
    assert data_splits.as_tensors(splits.test)[0].shape[1:] == model_zoo.IMAGE_SHAPE  # 8×8 → 32×32
    report = data_splits.split_report(2, spec=data_splits.PartitionSpec("iid", dataset=str(folder)))
    assert sum(report.sizes()) == 70 and report.class_names[0] == "c0"


def test_a_folder_of_parquet_files_loads_with_load_dataset(hf_offline):
    folder = hf_offline / "parquet"
    (folder / "data").mkdir(parents=True)
    dd = _hf_dataset_dict()
    for split in ("train", "test"):
        dd[split].to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))  # type: ignore[index]
    arrays = image_data.load_hf(str(folder))
    assert arrays.x_train.shape == (520, 8, 8, 3) and arrays.x_test is not None


def test_an_unknown_dataset_name_is_an_error_naming_the_key_and_nothing_is_downloaded(
    hf_offline,
):
    with pytest.raises(SettingsError) as err:
        data_splits.check_dataset("no-such-org/no-such-dataset")
    msg = str(err.value)
    assert msg.startswith("dataset: 'no-such-org/no-such-dataset'") and "Hugging Face" in msg
    with pytest.raises(SettingsError, match="dataset: must be a dataset name"):
        data_splits.check_dataset("  ")


def test_a_dataset_without_the_expected_columns_names_them(hf_offline):
    folder = hf_offline / "nolabel"
    _hf_dataset_dict(label="target").save_to_disk(str(folder))  # type: ignore[attr-defined]
    with pytest.raises(SettingsError) as err:
        data_splits.check_dataset(str(folder))
    msg = str(err.value)
    assert msg.startswith("dataset: ") and "has columns img, target" in msg
    assert "lacks a label column (label or labels or fine_label)" in msg
