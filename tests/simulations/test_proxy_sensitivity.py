"""Proxy-sensitivity study: config validation, a tiny image and a tiny text study end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fl_client import model_zoo, task
from simulations.cli import main
from simulations.experiments.config import ExperimentConfigError, FileOptions
from simulations.experiments.records import load_all
from simulations.experiments.registry import load_config
from simulations.experiments.sensitivity_config import SensitivityConfig

REPO = Path(__file__).resolve().parents[2]

TINY_IMAGE = """
[experiment]
name = "tiny-sens"
study = "proxy-sensitivity"
datasets = ["digits", "digits-parity"]
accuracy = { digits = 0.4, digits-parity = 0.7 }
reference-proxy = "digits"
model = "cnn"
devices = ["jetson-nano"]
caps-w = [4.5, "none"]
batch-sizes = [16, 64]
lr-ref = 3e-3
eval-every-samples = 128
max-samples = 2048
profile-steps = 1
seeds = 1
"""


def load_sensitivity(path: Path, scale: str = "mini") -> SensitivityConfig:
    cfg = load_config(path, FileOptions(scale=scale))
    assert isinstance(cfg, SensitivityConfig)
    return cfg


def _write(tmp_path: Path, text: str, name: str = "sens.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_shipped_files_parse_at_both_scales():
    img = load_sensitivity(REPO / "configs/experiments/proxy-sensitivity-image.toml", scale="mini")
    txt = load_sensitivity(REPO / "configs/experiments/proxy-sensitivity-text.toml", scale="paper")
    assert isinstance(img, SensitivityConfig) and img.task == "image"
    assert len(img.datasets) == 4 and img.model == "cnn"
    assert txt.task == "text" and txt.model == "char-transformer"
    assert txt.accuracy_of("austen") == 0.62 and txt.accuracy_of("dickens") == 0.61  # paper
    assert txt.batch_sizes == (4, 8, 16, 32, 64, 128) and txt.lr_ref == 1e-3


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ('datasets = ["digits", "austen"]\n', "mixes image and text datasets"),
        ('datasets = ["digits"]\n', "datasets: must be ≥ 2 values"),
        ('datasets = ["digits", "imagenet"]\n', "datasets: unknown value 'imagenet'"),
        ("accuracy = { digits = 0.4 }\n", "accuracy: no accuracy target for digits-parity"),
        (
            "accuracy = { digits = 0.4, digits-parity = 0.7, svhn = 0.9 }\n",
            "accuracy: svhn not in datasets",
        ),
        ("accuracy = { digits = 1.4, digits-parity = 0.7 }\n", "accuracy.digits: must be > 0"),
        ('model = "char-transformer"\n', "model: unknown value 'char-transformer'; allowed: cnn"),
        ('reference-proxy = "austen"\n', "reference-proxy: unknown value 'austen'"),
        ("caps-w = []\n", "caps-w: must be a non-empty list (empty sweep)"),
        ("bogus = 1\n", "unknown key(s) bogus"),
    ],
)
def test_bad_files_name_the_key(tmp_path, patch, needle):
    key = patch.split("=")[0].strip()
    lines = [ln for ln in TINY_IMAGE.splitlines() if not ln.startswith(key + " ")]
    with pytest.raises(ExperimentConfigError) as err:
        load_sensitivity(_write(tmp_path, "\n".join(lines) + "\n" + patch))
    assert needle in str(err.value)


def _brute_force_choice(lut: dict, n_by_b: dict[int, int], cap_w: float | None):
    """Eq. 4 written out: min over feasible (b, f) of r_b * t(b, f)."""
    bs = [int(b) for b in lut["batch-sizes"]]
    t = np.asarray(lut["time-per-sample-s"])
    p = np.asarray(lut["peak-power-w"])
    n_max = max(n_by_b.values())
    best = None
    for i, b in enumerate(bs):
        for j, f in enumerate(lut["freqs-mhz"]):
            if cap_w is not None and p[i, j] > cap_w:
                continue
            cost = n_by_b[b] / n_max * t[i, j]
            if best is None or cost < best[0]:
                best = (cost, b, f, t[i, j])
    return best


@pytest.fixture(scope="module")
def tiny_image(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sens")
    out = tmp / "out"
    path = _write(tmp, TINY_IMAGE)
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    return path, out


def test_tiny_image_study_matrix_matches_eq4_written_out(tiny_image):
    _, out = tiny_image
    train = load_all(out / "records" / "train")
    assert {(r["dataset"], r["batch-size"]) for r in train} == {
        ("digits", 16),
        ("digits", 64),
        ("digits-parity", 16),
        ("digits-parity", 64),
    }
    n = {(r["dataset"], r["batch-size"]): r["samples-to-target"] for r in train}
    assert all(v is not None for v in n.values())  # real runs that reached the targets
    [lut_rec] = load_all(out / "records" / "lut")
    lut = lut_rec["lut"]
    summary = json.loads((out / "summary.json").read_text())
    caps = summary["devices"]["jetson-nano"]["caps"]
    for cap_label, cap_w in (("4.5 W", 4.5), ("none", None)):
        for p in ("digits", "digits-parity"):
            for t in ("digits", "digits-parity"):
                cell = caps[cap_label]["matrix"][p][t]
                n_p = {b: n[(p, b)] for b in (16, 64)}
                n_t = {b: n[(t, b)] for b in (16, 64)}
                _, b_p, f_p, t_p = _brute_force_choice(lut, n_p, cap_w)
                _, b_o, f_o, t_o = _brute_force_choice(lut, n_t, cap_w)
                expected = 100.0 * (n_t[b_p] * t_p / (n_t[b_o] * t_o) - 1.0)
                assert cell["increase-pct"] == [pytest.approx(expected, abs=1e-9)]
                assert cell["same-choice"] == int((b_p, f_p) == (b_o, f_o))
                if p == t:
                    assert cell["increase-pct"] == [0.0]
    report = (out / "report.md").read_text()
    assert "| proxy \\ target | digits | digits-parity |" in report
    assert "methods with proxy `digits`" in report and "| Baseline 1 s |" in report
    assert (out / "fig-proxy-sensitivity-jetson-nano.png").stat().st_size > 1000
    rows = (out / "fig-proxy-sensitivity-jetson-nano.csv").read_text().splitlines()
    assert rows[0] == "cap,proxy,target,increase-pct-mean" and len(rows) == 1 + 2 * 4


def test_rerun_reuses_records_and_report_rerenders(tiny_image):
    path, out = tiny_image
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {
        "train-done": 0,
        "train-reused": 4,
        "luts-done": 0,
        "luts-reused": 1,
    }
    (out / "report.md").unlink()
    assert main(["experiment", "report", str(out)]) == 0
    assert "Proxy sensitivity: tiny-sens" in (out / "report.md").read_text()


def _kit(root: Path) -> None:
    (root / "text" / "austen").mkdir(parents=True)
    (root / "text" / "dickens").mkdir(parents=True)
    (root / "text" / "tinyshakespeare.txt").write_text("abc abd abe " * 800)
    (root / "text" / "austen" / "a.txt").write_text("the cat sat. " * 800)
    (root / "text" / "dickens" / "d.txt").write_text("pip said no. " * 800)


TINY_TEXT = """
[experiment]
name = "tiny-text"
study = "proxy-sensitivity"
datasets = ["tinyshakespeare", "austen", "dickens"]
accuracy = { tinyshakespeare = 0.3, austen = 0.3, dickens = 0.3 }
reference-proxy = "tinyshakespeare"
model = "char-transformer-mini"
devices = ["jetson-nano"]
caps-w = [4.5]
batch-sizes = [8, 32]
lr-ref = 1e-2
b-ref = 32
eval-every-samples = 64
max-samples = 1024
eval-windows = 16
profile-steps = 1
seeds = 1
"""


def test_tiny_text_study_runs_on_a_data_root(tmp_path):
    _kit(tmp_path / "kit")
    out = tmp_path / "out"
    path = _write(tmp_path, TINY_TEXT + f'data-root = "{tmp_path / "kit"}"\n')
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    train = load_all(out / "records" / "train")
    assert len(train) == 6
    assert all(r["samples-to-target"] is not None for r in train)  # repetitive text: learnt
    assert sorted({round(r["lr"], 12) for r in train}) == [pytest.approx(5e-3), 1e-2]
    report = (out / "report.md").read_text()
    assert "| tinyshakespeare | austen | dickens |" in report


def test_missing_corpus_is_an_error_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    path = _write(tmp_path, TINY_TEXT + f'data-root = "{tmp_path / "nowhere"}"\n')
    assert main(["experiment", "run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "data-root:" in err and "text/tinyshakespeare.txt" in err
    assert not out.exists()


@pytest.mark.parametrize("name", model_zoo.TEXT_MODEL_NAMES)
def test_text_models_profile_like_image_models(name):
    shape = model_zoo.input_shape_for(name)
    assert shape == (64,)
    model = model_zoo.build_model(name)
    assert model(torch.zeros(2, *shape, dtype=torch.int64)).shape == (2, 96, 64)
    task.make_train_step(name, shape, 2, seed=0, device="cpu")()  # one step, random chars
    assert model_zoo.train_flops_per_sample(name, shape) > 0
    small = model_zoo.estimate_train_memory_bytes(model, shape, 4)
    assert model_zoo.estimate_train_memory_bytes(model, shape, 64) > small > 0


def _fake_fashion_mnist(root: Path, n_train: int = 300) -> None:
    """FashionMNIST's raw idx files (the format torchvision reads): class k is a bright
    k-th row band on a dark 28×28 image, plus noise, so a CNN can learn it."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", 50)):
        y = np.arange(n, dtype=np.uint8) % 10
        x = rng.integers(0, 60, size=(n, 28, 28), dtype=np.uint8)
        for i, k in enumerate(y):
            x[i, 2 + 2 * k : 4 + 2 * k, :] = 250
        header = np.array([2051, n, 28, 28], dtype=">i4").tobytes()
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + x.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            np.array([2049, n], dtype=">i4").tobytes() + y.tobytes()
        )


def test_torchvision_dataset_from_a_local_root(tmp_path):
    from simulations.experiments.proxy_sensitivity import image_sets

    _fake_fashion_mnist(tmp_path / "data")
    text = TINY_IMAGE.replace('"digits-parity"]', '"fashion-mnist"]').replace(
        "digits-parity = 0.7", "fashion-mnist = 0.5"
    )
    cfg = load_sensitivity(
        _write(tmp_path, text + f'data-root = "{tmp_path / "data"}"\nimage-subset-size = 200\n')
    )
    train, test = image_sets(cfg, "fashion-mnist", 0)
    assert len(train) + len(test) == 200 and len(test) == 40  # subset, then 80/20
    x, y = train.tensors
    assert x.shape[1:] == (3, 32, 32) and set(y.tolist()) == set(range(10))
    assert abs(float(x.mean())) < 0.05  # standardised
    out = tmp_path / "out"
    path = _write(tmp_path, text + f'data-root = "{tmp_path / "data"}"\nimage-subset-size = 200\n')
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    recs = [r for r in load_all(out / "records" / "train") if r["dataset"] == "fashion-mnist"]
    assert len(recs) == 2 and all(r["sizes"] == {"train": 160, "test": 40} for r in recs)


def test_missing_torchvision_dataset_names_path_and_layout(tmp_path, capsys):
    text = TINY_IMAGE.replace('"digits-parity"]', '"cifar10"]').replace(
        "digits-parity = 0.7", "cifar10 = 0.5"
    )
    out = tmp_path / "out"
    path = _write(tmp_path, text + f'data-root = "{tmp_path / "none"}"\n')
    assert main(["experiment", "run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "data-root: cifar10: not found under" in err and "cifar-10-batches-py" in err
    assert not out.exists()


# --------------------------------------------------------------------------- npz subsets

TINY_NPZ = TINY_IMAGE.replace('["digits", "digits-parity"]', '["cifar10-subset", "mnist-subset"]')
TINY_NPZ = TINY_NPZ.replace(
    "{ digits = 0.4, digits-parity = 0.7 }", "{ cifar10-subset = 0.4, mnist-subset = 0.4 }"
).replace('reference-proxy = "digits"', 'reference-proxy = "mnist-subset"')


def test_npz_subsets_are_image_datasets_of_the_study(tmp_path):
    from simulations.experiments.proxy_sensitivity import TrainSpec, image_sets, train_key
    from tests.image_npz import write_kit

    kit = write_kit(tmp_path / "kit", n_train=200)
    cfg = load_sensitivity(_write(tmp_path, TINY_NPZ + f'data-root = "{kit}"\n'))
    assert cfg.task == "image" and cfg.datasets == ("cifar10-subset", "mnist-subset")
    train, test = image_sets(cfg, "mnist-subset", 0)
    assert len(train) == 160 and len(test) == 40  # 200 images (≤ image-subset-size), 80/20
    x = train.tensors[0]
    assert x.shape[1:] == (3, 32, 32) and abs(float(x.mean())) < 0.1  # standardised
    assert torch.equal(x[:, 0], x[:, 1])  # grey repeated over RGB
    # The records' key names the file they were read from.
    other = load_sensitivity(
        _write(tmp_path, TINY_NPZ + f'data-root = "{tmp_path / "elsewhere"}"\n', "b.toml")
    )
    t = TrainSpec("cifar10-subset", 0, 16)
    assert train_key(cfg, t) != train_key(other, t)


def test_tiny_npz_study_runs_proxy_cifar_to_target_mnist_and_back(tmp_path):
    from tests.image_npz import write_kit

    kit = write_kit(tmp_path / "kit", n_train=200)
    path = _write(tmp_path, TINY_NPZ + f'data-root = "{kit}"\n')
    out = tmp_path / "out"
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    recs = load_all(out / "records" / "train")
    assert {r["dataset"] for r in recs} == {"cifar10-subset", "mnist-subset"}
    assert all(r["sizes"] == {"train": 160, "test": 40} for r in recs)
    manifest = json.loads((out / "manifest.json").read_text())
    assert "cifar10-subset" in manifest["data-note"] or "CIFAR-10" in manifest["data-note"]
    report = (out / "report.md").read_text()
    assert "cifar10-subset" in report and "mnist-subset" in report


@pytest.mark.parametrize(
    ("kwargs", "lacks"),
    [({"drop": ("y_test",)}, "lacks y_test"), ({"x_train": np.zeros((4, 9), np.uint8)}, "(4, 9)")],
)
def test_a_bad_npz_in_the_data_root_is_refused_before_training(tmp_path, capsys, kwargs, lacks):
    from tests.image_npz import write_image_npz, write_kit

    kit = write_kit(tmp_path / "kit")
    bad = write_image_npz(kit / "cifar10-subset.npz", **kwargs)
    out = tmp_path / "out"
    path = _write(tmp_path, TINY_NPZ + f'data-root = "{kit}"\n')
    assert main(["experiment", "run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "data-root: cifar10-subset:" in err and str(bad) in err and lacks in err
    assert not (out / "records").exists()


def test_a_missing_npz_names_the_file_it_looked_for(tmp_path, capsys):
    out = tmp_path / "out"
    path = _write(tmp_path, TINY_NPZ + f'data-root = "{tmp_path / "none"}"\n')
    assert main(["experiment", "run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "none" / "cifar10-subset.npz") in err and "no such file" in err


@pytest.mark.skipif(
    not (REPO.parent / "shared" / "data" / "cifar10-subset.npz").is_file(),
    reason="no data kit beside the repository",
)
def test_the_shipped_real_image_study_reads_the_data_kit():
    from simulations.experiments.proxy_sensitivity import check_data

    cfg = load_sensitivity(REPO / "configs/experiments/proxy-sensitivity-real.toml")
    assert cfg.datasets == ("cifar10-subset", "mnist-subset") and cfg.data_root == ""
    sizes = check_data(cfg)  # the default data root: ../shared/data beside the repository
    assert sizes["cifar10-subset"] == {"train": 4000, "test": 1000}


def test_the_studies_select_with_the_nodes_rule_sigma_included():
    """A full-grid record carries σ of the per-step peaks, and the study's choice judges a
    cell by peak + peak-sigma-k·σ as the node does: a cell just under the cap by its peak
    alone is infeasible once its σ is counted."""
    from simulations.experiments.sensitivity_report import Grid, choose

    lut: dict[str, Any] = {
        "batch-sizes": [8, 16],
        "freqs-mhz": [500.0, 900.0],
        "time-per-sample-s": [[2e-3, 1e-3], [1.5e-3, 0.8e-3]],
        "peak-power-w": [[3.0, 4.4], [3.5, 4.9]],
        "peak-sigma-w": [[0.01, 0.2], [None, 0.1]],
    }
    rec: dict[str, Any] = {
        "lut": lut,
        "avg-power-w": [[2.5, 3.5], [3.0, 4.0]],
        "b1-freq-mhz": {},
    }
    grid = Grid.from_record(rec)
    sigma = np.asarray(grid.rows([8, 16]).peak_sigma_w, dtype=float)
    assert np.isnan(sigma[1, 0]) and sigma[0, 1] == 0.2
    samples = {8: 1000, 16: 1000}
    # 5 W: b=16 at 900 MHz is 4.9 + 2·0.1 W, over the cap; b=8 at 900 MHz 4.4 + 2·0.2 W is not
    assert choose("power-aware", grid, 5.0, samples) == (8, 900.0)
    no_sigma = Grid.from_record(
        {**rec, "lut": {k: v for k, v in lut.items() if k != "peak-sigma-w"}}
    )
    assert choose("power-aware", no_sigma, 5.0, samples) == (16, 900.0)
