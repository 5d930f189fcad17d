"""The experiment runner: config validation, a tiny single-device study end to end, resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulations.cli import main
from simulations.experiments.config import ExperimentConfigError, FileOptions
from simulations.experiments.records import load_all
from simulations.experiments.registry import load_config
from simulations.experiments.single_device_config import SingleDeviceConfig

REPO = Path(__file__).resolve().parents[2]

TINY = """
[experiment]
name = "tiny"
study = "single-device"
devices = ["jetson-nano"]
caps-w = [4.5]
batch-sizes = [8, 32]
lr-ref = 3e-3
target-accuracy = 0.5
proxy-target-accuracy = 0.5
eval-every-samples = 128
max-samples = 2048
target-train-size = 200
profile-steps = 2
seeds = 1
"""


def load_experiment(path: Path, **options: object) -> SingleDeviceConfig:
    cfg = load_config(path, FileOptions(**options))  # type: ignore[arg-type]
    assert isinstance(cfg, SingleDeviceConfig)
    return cfg


def _write(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- config


def test_shipped_experiment_file_parses_at_both_scales():
    path = REPO / "configs" / "experiments" / "single-device.toml"
    mini = load_experiment(path, scale="mini")
    paper = load_experiment(path, scale="paper", seeds=2)
    assert mini.devices == ("jetson-nano", "jetson-tx2-nx")
    assert mini.caps_w == (4.5, 7.0, None)
    assert mini.models == ("cnn",) and mini.seeds == 3
    assert paper.models == ("resnet18", "mobilenetv2") and paper.seeds == 2
    assert paper.lr_ref == 5e-4 and mini.lr_ref == 2e-3


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ("bogus-key = 1\n", "unknown key(s) bogus-key"),
        ('methods = ["b1", "magic"]\n', "methods: unknown value 'magic'"),
        ("caps-w = []\n", "caps-w: must be a non-empty list (empty sweep)"),
        ('devices = ["jetson-xavier-9000"]\n', "devices: unknown value"),
        ("caps-w = [-1]\n", "caps-w: -1 is not a cap"),
        ('target = "cifar10"\n', "target: unknown value 'cifar10'; allowed: digits"),
        ("target-accuracy = 1.5\n", "target-accuracy: must be > 0 and < 1"),
    ],
)
def test_bad_experiment_files_name_the_key(tmp_path, patch, needle):
    key = patch.split("=")[0].strip()
    lines = [ln for ln in TINY.splitlines() if not ln.startswith(key + " ")]
    text = "\n".join(lines) + "\n" + patch
    with pytest.raises(ExperimentConfigError) as err:
        load_experiment(_write(tmp_path, text))
    assert needle in str(err.value)


def test_unknown_scale_and_unknown_table_are_errors(tmp_path):
    path = _write(tmp_path, TINY + "\n[scale.huge]\nseeds = 2\n")
    with pytest.raises(ExperimentConfigError, match=r"\[scale.huge\] unknown scale"):
        load_experiment(path)
    with pytest.raises(ExperimentConfigError, match="--scale: unknown scale 'big'"):
        load_experiment(_write(tmp_path, TINY, "ok.toml"), scale="big")
    with pytest.raises(ExperimentConfigError, match="unknown key"):
        load_experiment(_write(tmp_path, TINY + "\n[scale.mini]\nnope = 1\n", "x.toml"))


def test_cli_rejects_bad_file_before_any_training(tmp_path, capsys):
    bad = _write(tmp_path, TINY.replace('"b1", ', "") + 'methods = ["ours"]\n')
    out = tmp_path / "out"
    assert main(["experiment", "run", str(bad), "--out", str(out)]) == 2
    assert "methods: unknown value 'ours'" in capsys.readouterr().err
    assert not out.exists()


def test_set_overrides_after_the_scale_and_unknown_set_keys_are_errors(tmp_path):
    from simulations.experiments.cli import parse_sets

    sets = parse_sets(['models=["resnet18"]', "torch-device=auto", "max-samples=512"])
    assert sets == {"models": ["resnet18"], "torch-device": "auto", "max-samples": 512}
    path = REPO / "configs" / "experiments" / "single-device.toml"
    cfg = load_experiment(path, scale="paper", sets=sets)
    assert cfg.models == ("resnet18",) and cfg.torch_device == "auto"
    assert cfg.max_samples == 512 and cfg.lr_ref == 5e-4  # the rest of the paper scale stays
    with pytest.raises(ExperimentConfigError, match="--set: unknown key"):
        load_experiment(path, sets={"modles": ["cnn"]})
    with pytest.raises(ExperimentConfigError, match="torch-device: unknown value 'tpu'"):
        load_experiment(path, sets={"torch-device": "tpu"})
    with pytest.raises(ExperimentConfigError, match="--set: expected KEY=VALUE"):
        parse_sets(["seeds"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (TINY + "modles = [1]\n", "[experiment] unknown key(s) modles (did you mean models?)"),
        (TINY + "\n[scale.mini]\nsedes = 2\n", "[scale.mini] unknown key(s) sedes (did you mean"),
        (TINY + "\n[scale.mni]\nseeds = 2\n", "[scale.mni] unknown scale mni (did you mean mini?)"),
        (TINY + "\n[scales.mini]\nseeds = 2\n", "table(s) scales (did you mean scale?)"),
        (TINY.replace("[experiment]", "[experiement]"), "experiement (did you mean experiment?)"),
        (TINY.replace("study =", "stduy ="), "[experiment] unknown key(s) stduy (did you mean"),
        (TINY + "zzzz = 1\n", "unknown key(s) zzzz; known: b-ref, batch-sizes, caps-w,"),
    ],
)
def test_a_misspelt_key_in_an_experiment_file_names_the_nearest_one(tmp_path, text, message):
    with pytest.raises(ExperimentConfigError) as err:
        load_experiment(_write(tmp_path, text))
    assert message in str(err.value)


def test_a_misspelt_set_key_names_the_nearest_one(tmp_path, capsys):
    exp = _write(tmp_path, TINY)
    rc = main(["experiment", "run", str(exp), "--out", str(tmp_path / "o"), "--set", "modles=[1]"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        "powerfl experiment: error: --set: unknown key(s) modles (did you mean models?)"
    )
    assert not (tmp_path / "o").exists()
    with pytest.raises(ExperimentConfigError, match=r"--set: unknown key\(s\) max-sample \(did"):
        load_experiment(exp, sets={"max-sample": 512})


def test_typed_paths_are_relative_to_the_current_directory_file_paths_to_the_file(
    tmp_path, monkeypatch
):
    from simulations.experiments.cli import output_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.toml").write_text((REPO / "configs" / "fleets" / "default.toml").read_text())
    federated = REPO / "configs" / "experiments" / "federated.toml"
    cfg = load_config(federated, FileOptions(sets={"fleet": "mine.toml"}))
    assert cfg.fleet == str(tmp_path / "mine.toml")  # --set: typed, from here
    shipped = REPO / "configs" / "fleets" / "default.toml"
    assert load_config(federated).fleet == str(shipped)  # the file's: a shipped fleet's name
    assert load_config("federated").fleet == str(shipped)  # a shipped experiment by name
    with pytest.raises(ExperimentConfigError, match="fleet file not found"):
        load_config(federated, FileOptions(sets={"fleet": "fleets/default.toml"}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.toml").write_text(shipped.read_text())
    mine = tmp_path / "sub" / "exp.toml"
    mine.write_text(federated.read_text().replace('fleet = "default"', 'fleet = "f.toml"'))
    assert load_config(mine).fleet == str(tmp_path / "sub" / "f.toml")  # beside the file
    exp = _write(tmp_path, TINY)
    assert output_folder(exp) == tmp_path / "runs" / "experiments" / "tiny-mini"  # a default


def test_cuda_without_a_gpu_is_refused_before_training(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    path = _write(tmp_path, TINY)
    rc = main(["experiment", "run", str(path), "--out", str(out), "--set", "torch-device=cuda"])
    assert rc == 2
    assert "torch-device: 'cuda' asked for, but torch sees no CUDA GPU" in capsys.readouterr().err
    assert not (out / "records").exists()


def test_only_training_writes_the_r_runs_and_a_later_run_reuses_them(tmp_path):
    path = _write(tmp_path, TINY)
    out = tmp_path / "out"
    args = ["experiment", "run", str(path), "--out", str(out), "--no-progress"]
    assert main([*args, "--only-training", "--set", "torch-device=auto"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "training" and manifest["complete"] is False
    assert manifest["counts"]["train-done"] == 4 and manifest["counts"]["cells-done"] == 0
    assert not (out / "records" / "cells").exists() and not (out / "report.md").exists()
    train = load_all(out / "records" / "train")
    assert {r["torch-device"] for r in train} == {"cpu"}  # no GPU here
    assert main(args) == 0  # the rest of the study, from the same training records
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and "stage" not in manifest
    assert manifest["counts"]["train-reused"] == 4 and manifest["counts"]["cells-done"] == 1


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exp")
    path = _write(tmp, TINY)
    out = tmp / "out"
    rc = main(["experiment", "run", str(path), "--out", str(out), "--no-progress"])
    assert rc == 0
    return path, out


def test_tiny_study_writes_records_report_and_plots(tiny_run):
    _, out = tiny_run
    train = load_all(out / "records" / "train")
    assert {(r["role"], r["batch-size"]) for r in train} == {
        ("proxy", 8),
        ("proxy", 32),
        ("target", 8),
        ("target", 32),
    }
    for r in train:  # real training runs: the curve reaches the target where it stops
        assert r["samples-to-target"] is not None
        assert r["curve"][-1] == [r["samples-to-target"], r["best-accuracy"]]
        assert r["curve"][-1][1] >= 0.5
    [cell] = load_all(out / "records" / "cells")
    methods = cell["methods"]
    assert set(methods) == {"b1", "b2", "power-aware", "oracle"}
    n_target = {int(b): n for b, n in cell["n-target"].items()}
    for m, e in methods.items():
        assert e["status"] == "ok", e
        # TT_acc = the real target run's samples × the twin's time, plus profiling.
        assert e["samples-to-target"] == n_target[e["batch-size"]]
        assert e["steps"] == math.ceil(e["samples-to-target"] / e["batch-size"])
        prof = e.get("profile-time-s", 0.0)
        assert e["tt-acc-s"] == pytest.approx(e["train-time-s"] + prof)
        assert (prof > 0) == (m in ("power-aware", "oracle"))
    # B1: the largest b at the Nano's 4.5 W safe frequency; B2: B1's frequency too.
    assert (methods["b1"]["batch-size"], methods["b1"]["gpu-freq-mhz"]) == (32, 307.2)
    assert methods["b2"]["gpu-freq-mhz"] == 307.2
    # Ours and the oracle stay under the cap on the profiled table and in training.
    for m in ("power-aware", "oracle"):
        assert methods[m]["predicted-peak-power-w"] < 4.5
        assert methods[m]["over-cap"] is False

    # The oracle minimises the predicted TT_acc on the target's own N_s_acc.
    def predicted(m: str) -> float:
        e = methods[m]
        return e["predicted-time-per-sample-s"] * n_target[e["batch-size"]]

    assert predicted("oracle") <= predicted("power-aware") + 1e-12

    summary = json.loads((out / "summary.json").read_text())
    ours = next(r for r in summary["rows"] if r["method"] == "power-aware")
    assert ours["tt-acc-s-mean"] == pytest.approx(methods["power-aware"]["tt-acc-s"])
    ratio = next(r for r in summary["ratios"] if r["ratio"] == "b1/power-aware")
    assert ratio["tt-acc-s"] == pytest.approx(
        methods["b1"]["tt-acc-s"] / methods["power-aware"]["tt-acc-s"]
    )
    report = (out / "report.md").read_text()
    assert "| Ours |" in report and "P_max 4.5 W" in report
    assert "powerfl experiment run" in report and "torch" in report
    assert "`lr-ref` | `0.003`" in report  # every setting comes from the file
    for stem in (
        "fig1-power-vs-freq-cnn-jetson-nano",
        "fig2-ts-vs-ttacc-cnn-jetson-nano",
        "fig-methods-cnn-jetson-nano",
    ):
        assert (out / f"{stem}.png").stat().st_size > 1000
        assert len((out / f"{stem}.csv").read_text().splitlines()) > 1


def test_rerun_resumes_and_report_rerenders(tiny_run):
    path, out = tiny_run
    cell_path = next((out / "records" / "cells").rglob("*.json"))
    train_paths = sorted((out / "records" / "train").rglob("*.json"))
    before = {p: p.read_text() for p in train_paths}
    cell_path.unlink()  # an interrupted run: one cell missing
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {
        "train-done": 0,
        "train-reused": 4,
        "cells-done": 1,
        "cells-reused": 0,
        "luts-done": 0,
        "luts-reused": 1,
    }
    assert {p: p.read_text() for p in train_paths} == before
    (out / "report.md").unlink()
    assert main(["experiment", "report", str(out)]) == 0
    assert "| Baseline 1 |" in (out / "report.md").read_text()


def test_report_compares_with_the_papers_claims(tiny_run):
    from simulations.experiments.single_device_report import compare_with_paper

    _, out = tiny_run
    assert "## Against the paper's claims" in (out / "report.md").read_text()
    summary = {
        "ratios": [
            {
                "ratio": "b1/power-aware",
                "cap": "4.5W",
                "tt-acc-s": 0.5,
                "train-time-s": 2.0,
                "energy-j": 0.8,
            },
            {
                "ratio": "b1/power-aware",
                "cap": "none",
                "tt-acc-s": 1.2,
                "train-time-s": 1.1,
                "energy-j": 1.5,
            },
            {"ratio": "power-aware/oracle", "cap": "4.5W", "tt-acc-s": 1.02},
        ],
        "rows": [
            {"method": "power-aware", "profile-share-of-training-mean": 0.4},
            {"method": "b1", "profile-share-of-training-mean": 0.0},
        ],
    }
    text = compare_with_paper(summary)
    assert "| TT_acc B1/ours | up to 2.4× | 0.50×–1.20× (training only, profiling " in text
    assert "excluded: 1.10×–2.00×; under a cap: 2.00×) |" in text
    assert "| TT_acc ours/oracle | within about 3% (≤ 1.03×) | 1.02× |" in text
    assert "| profiling / ours' training time | ≤ 1.9–6% | 40% |" in text
    assert "ours is slower than B1 in 1 of 2" in text
    assert "| TT_acc B2/ours | 1.4–1.7× | — |" in text


def test_report_on_a_folder_without_records_is_an_error(tmp_path, capsys):
    assert main(["experiment", "report", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_b1_without_a_safe_band_is_reported_unavailable():
    """TX2 NX's lowest B1 band is 5 W: at 4.5 W B1/B2 have no safe frequency; ours still runs."""
    from fl_client.settings import tomllib
    from simulations.experiments.single_device import CellSpec, Samples, run_cell
    from simulations.experiments.single_device_config import parse_single_device

    data = tomllib.loads(TINY.replace('"jetson-nano"', '"jetson-tx2-nx"'))
    cfg = parse_single_device(data, "test", FileOptions())
    # Samples to target are inputs here (the e2e test covers the real training runs).
    samples = Samples(proxy={8: 512, 32: 768}, target={8: 640, 32: 1024})
    rec = run_cell(cfg, CellSpec("cnn", "jetson-tx2-nx", 4.5, 0), samples)
    for m in ("b1", "b2"):
        assert rec["methods"][m]["status"] == "unavailable"
        assert "below the lowest B1 band" in rec["methods"][m]["reason"]
    ours = rec["methods"]["power-aware"]
    assert ours["status"] == "ok" and ours["predicted-peak-power-w"] < 4.5
    assert ours["samples-to-target"] == {8: 640, 32: 1024}[ours["batch-size"]]


# --------------------------------------------------------------------------- npz subsets

TINY_NPZ = TINY + 'target = "cifar10-subset"\nproxy = "mnist-subset"\n'


def test_npz_target_and_proxy_parse_and_the_proxy_must_be_other_data(tmp_path):
    cfg = load_experiment(_write(tmp_path, TINY_NPZ + 'data-root = "kit"\n'))
    assert (cfg.target, cfg.proxy, cfg.data_root) == ("cifar10-subset", "mnist-subset", "kit")
    same = TINY + 'target = "mnist-subset"\nproxy = "mnist-subset"\n'
    with pytest.raises(ExperimentConfigError, match="proxy: 'mnist-subset' is also the target"):
        load_experiment(_write(tmp_path, same, "same.toml"))


def test_digits_records_keep_their_keys():
    """The npz keys join a training record's data key only when an npz set is used, so
    records of the digits study made before stay valid."""
    from simulations.experiments.datasets import DataSettings

    d = DataSettings("digits", "digits-rotated", 0.2).to_dict()
    assert "data-root" not in d and "image-subset-size" not in d and "files" not in d
    npz = DataSettings("cifar10-subset", "digits", 0.2, data_root="/kit").to_dict()
    assert npz["files"] == {"cifar10-subset": "/kit/cifar10-subset.npz"}


def test_study_data_reads_the_npz_target_and_proxy(tmp_path):
    from simulations.experiments.datasets import study_data
    from tests.image_npz import write_kit

    kit = write_kit(tmp_path / "kit", n_train=200, n_test=60)
    cfg = load_experiment(
        _write(tmp_path, TINY_NPZ + f'data-root = "{kit}"\nproxy-eval-size = 30\n')
    )
    data = study_data(cfg.data_settings(), 0)
    assert data.sizes() == {
        "target-train": 160,
        "target-test": 40,
        "proxy-train": 200,
        "proxy-eval": 30,
    }
    x = data.proxy_train.tensors[0]
    assert x.shape[1:] == (3, 32, 32) and abs(float(x.mean())) < 0.1
    again = study_data(cfg.data_settings(), 1)
    assert not (
        data.target_test.tensors[0].shape == again.target_test.tensors[0].shape
        and bool((data.target_test.tensors[0] == again.target_test.tensors[0]).all())
    )


def test_a_bad_npz_is_refused_before_any_training(tmp_path, capsys):
    from tests.image_npz import write_image_npz, write_kit

    kit = write_kit(tmp_path / "kit")
    bad = write_image_npz(kit / "mnist-subset.npz", drop=("x_train",))
    out = tmp_path / "out"
    path = _write(tmp_path, TINY_NPZ + f'data-root = "{kit}"\n')
    assert main(["experiment", "run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "data-root:" in err and str(bad) in err and "lacks x_train" in err
    assert not (out / "records").exists()


def test_tiny_npz_study_runs_end_to_end(tmp_path):
    from tests.image_npz import write_kit

    kit = write_kit(tmp_path / "kit", n_train=200, n_test=60)
    path = _write(tmp_path, TINY_NPZ + f'data-root = "{kit}"\n')
    out = tmp_path / "out"
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    train = load_all(out / "records" / "train")
    assert len(train) == 4 and {r["role"] for r in train} == {"proxy", "target"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and "cifar10-subset" in manifest["data-note"]
    assert manifest["data-sizes"]["target-train"] == 160


@pytest.mark.skipif(
    not (REPO.parent / "shared" / "data" / "cifar10-subset.npz").is_file(),
    reason="no data kit beside the repository",
)
def test_the_shipped_cifar_study_reads_the_data_kit():
    from simulations.experiments.datasets import study_data

    cfg = load_experiment(REPO / "configs" / "experiments" / "single-device-cifar.toml")
    assert (cfg.target, cfg.proxy) == ("cifar10-subset", "mnist-subset")
    sizes = study_data(cfg.data_settings(), 0).sizes()
    assert sizes["target-train"] + sizes["target-test"] == cfg.image_subset_size


def test_an_out_folder_that_cannot_be_written_is_refused_before_anything_runs(
    tmp_path, capsys, monkeypatch
):
    import os

    exp = _write(tmp_path, TINY)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(["experiment", "run", str(exp), "--out", str(a_file)]) == 2
    assert f"--out: {a_file} is a file, not a folder" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # root may write anywhere: the check's answer comes from os.access, faked for `locked`
    monkeypatch.setattr(
        "fl_client.preflight.os.access",
        lambda path, mode: False if Path(path) == locked else real_access(path, mode),
    )
    assert main(["experiment", "run", str(exp), "--out", str(locked / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--out: cannot write into {locked / 'out'}" in err and "not writable" in err
    assert not (locked / "out").exists()
