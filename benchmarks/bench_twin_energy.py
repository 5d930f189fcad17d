"""The twins' energy per sample over the GPU frequency, beside published board figures.

Usage: python benchmarks/bench_twin_energy.py [--models cnn,resnet18] [--json PATH]

For every device twin (``configs/devices``) and model, per batch size b and GPU
frequency f, the twin's noiseless energy per sample (average power × time per sample,
``fl_client.devices.simulated.energy_per_sample_j``) and the part of it above the board's
idle power: a node that finishes early waits at idle power until the round ends, so what
its choice of f changes is the energy above idle (``balance = "energy"``). Prints where
each minimum lies, against the voltage knee of the twin's V(f), then the published
measurements the papers in ``../shared/papers`` give in numbers, each beside the twin's
figure for the same point, with its section. Writes JSON (default
``benchmarks/results/twin_energy.json``). No device, no training: the twin's model alone.
"""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path
from typing import Any

from results_file import write_results

from fl_client import model_zoo
from fl_client.argparse_once import OnceParser
from fl_client.devices.descriptors import DEVICE_KINDS, DeviceSpec, load_device_spec
from fl_client.devices.simulated import avg_power_w, energy_per_sample_j, power_w, time_per_sample_s

BATCH_SIZES = (4, 8, 16, 32, 64, 128)


def above_idle_j(spec: DeviceSpec, b: int, f_mhz: float, flops: float) -> float:
    """Energy per sample above the board's idle power (what a waiting node's f changes)."""
    t = time_per_sample_s(spec, b, f_mhz, flops)
    return (avg_power_w(spec, b, f_mhz, flops) - spec.idle_power_w) * t


def sweep(spec: DeviceSpec, flops: float) -> dict[str, Any]:
    """Per b: energy per sample (mJ) and above idle (mJ), peak W, over the f table, and the
    f of least energy (total and above idle)."""
    rows = {}
    for b in BATCH_SIZES:
        e_mj = [1e3 * energy_per_sample_j(spec, b, f, flops) for f in spec.gpu_freqs_mhz]
        a_mj = [1e3 * above_idle_j(spec, b, f, flops) for f in spec.gpu_freqs_mhz]
        peak = [power_w(spec, b, f, flops) for f in spec.gpu_freqs_mhz]
        i, j = e_mj.index(min(e_mj)), a_mj.index(min(a_mj))
        rows[str(b)] = {
            "energy-per-sample-mj": e_mj,
            "above-idle-per-sample-mj": a_mj,
            "peak-power-w": peak,
            "least-energy-freq-mhz": spec.gpu_freqs_mhz[i],
            "least-above-idle-freq-mhz": spec.gpu_freqs_mhz[j],
            "fmax-over-least": e_mj[-1] / e_mj[i],
            "fmin-over-least": e_mj[0] / e_mj[i],
            # a waiting node's round energy above idle at the f of least total energy,
            # over its least: what choosing by total energy leaves when idle is paid anyway
            "above-idle-at-least-over-least": a_mj[i] / a_mj[j],
        }
    return {
        "freqs-mhz": list(spec.gpu_freqs_mhz),
        "voltage-knee-mhz": spec.voltage_knee_mhz,
        "idle-power-w": spec.idle_power_w,
        "training-base-w": spec.base_power_w,
        "rows": rows,
    }


def print_sweep(kind: str, model: str, res: dict[str, Any]) -> None:
    freqs = res["freqs-mhz"]
    print(
        f"\n{kind}, {model}: energy per sample (mJ) over f (MHz); * least, ^ least above idle"
        f" (idle {res['idle-power-w']:g} W, training base {res['training-base-w']:g} W, "
        f"V(f) knee {res['voltage-knee-mhz']:g} MHz)"
    )
    print("    b " + "".join(f"{f:>9.0f}" for f in freqs))
    for b, row in res["rows"].items():
        cells = []
        for f, e in zip(freqs, row["energy-per-sample-mj"], strict=True):
            mark = "*" if f == row["least-energy-freq-mhz"] else " "
            mark = "^" if f == row["least-above-idle-freq-mhz"] and mark == " " else mark
            if f == row["least-energy-freq-mhz"] == row["least-above-idle-freq-mhz"]:
                mark = "*"
            cells.append(f"{e:>8.3g}{mark}")
        print(f"{b:>5} " + "".join(cells))


def summary_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for kind, models in results["twins"].items():
        for model, res in models.items():
            for b, row in res["rows"].items():
                out.append(
                    {
                        "kind": kind,
                        "model": model,
                        "b": int(b),
                        "knee-mhz": res["voltage-knee-mhz"],
                        "f-max-mhz": res["freqs-mhz"][-1],
                        "least-mhz": row["least-energy-freq-mhz"],
                        "least-above-idle-mhz": row["least-above-idle-freq-mhz"],
                        "fmax-over-least": row["fmax-over-least"],
                        "fmin-over-least": row["fmin-over-least"],
                        "above-idle-at-least-over-least": row["above-idle-at-least-over-least"],
                    }
                )
    return out


def imagenet_resnet18_flops() -> float:
    """Training FLOPs per sample of torchvision's ResNet18 at 3×224×224 (PowerTrain's
    workload; counted as ``tests/fl_client/devices/test_simulated.py`` counts it)."""
    import torch
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    model = torchvision.models.resnet18(weights=None)
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.randn(1, 3, 224, 224)).sum().backward()
    return float(counter.get_total_flops())


def published(flops_cifar_r18: float) -> list[dict[str, Any]]:
    """Published board figures with a number in the text, each beside the twin's.

    Energy per sample is power × time / samples. PowerTrain's ResNet18 epoch is ImageNet's
    validation subset, 50,000 images (§2.2, Table 3), minibatch 16.
    """
    orin = load_device_spec("jetson-agx-orin")
    r18_224 = imagenet_resnet18_flops()
    out = []
    points = (
        # (label, published min/epoch, W, twin f MHz, source)
        ("MAXN (GPU 1300.5 MHz)", 3.1, 51.1, 1300.5, "PowerTrain §1 and Table 3"),
        ("its lowest power mode", 112.0, 11.8, orin.gpu_freqs_mhz[0], "PowerTrain §1"),
    )
    for label, minutes, watts, f, source in points:
        pub_mj = 1e3 * minutes * 60 * watts / 50_000
        twin_mj = 1e3 * energy_per_sample_j(orin, 16, f, r18_224)
        twin_min = time_per_sample_s(orin, 16, f, r18_224) * 50_000 / 60
        out.append(
            {
                "board": "jetson-agx-orin",
                "workload": "ResNet18, ImageNet 224x224, b=16",
                "point": label,
                "source": source,
                "published-min-per-epoch": minutes,
                "published-power-w": watts,
                "published-energy-per-sample-mj": pub_mj,
                "twin-freq-mhz": f,
                "twin-min-per-epoch": twin_min,
                "twin-power-w": avg_power_w(orin, 16, f, r18_224),
                "twin-energy-per-sample-mj": twin_mj,
            }
        )
    # The paper (arXiv 2502.18323) gives the Nano's energy only as bars (Fig. 4); its text
    # says which way it goes (§5.3): ResNet18 trained under P_max^2 (7 W; B1's 614.4 MHz
    # band) used less energy than with no limit, though it took longer (Table 2). The
    # twin's fastest cell (least time per sample over every b and f; r left out, since the
    # paper's r is not given) under 7 W against with no cap, ResNet18 at 3x32x32:
    nano = load_device_spec("jetson-nano")

    def fastest(p_max_w: float) -> tuple[int, float]:
        cells = [
            (time_per_sample_s(nano, b, f, flops_cifar_r18), b, f)
            for b in BATCH_SIZES
            for f in nano.gpu_freqs_mhz
            if power_w(nano, b, f, flops_cifar_r18) < p_max_w
        ]
        _, b, f = min(cells)
        return b, f

    (b7, f7), (b_none, f_none) = fastest(7.0), fastest(math.inf)
    e7 = 1e3 * energy_per_sample_j(nano, b7, f7, flops_cifar_r18)
    e_none = 1e3 * energy_per_sample_j(nano, b_none, f_none, flops_cifar_r18)
    out.append(
        {
            "board": "jetson-nano",
            "workload": "ResNet18, 3x32x32",
            "point": f"fastest cell under 7 W (b={b7}, {f7:g} MHz) vs no cap "
            f"(b={b_none}, {f_none:g} MHz)",
            "source": "arXiv 2502.18323 §5.3 and Fig. 4 (bars, no numbers): 7 W used less "
            "energy than no limit",
            "published-energy-per-sample-mj": None,
            "twin-energy-per-sample-mj": e7,
            "twin-energy-no-cap-mj": e_none,
            "twin-agrees": e7 < e_none,
        }
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = OnceParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,resnet18", help="comma-separated model names")
    ap.add_argument(
        "--json",
        type=Path,
        default=Path(__file__).parent / "results" / "twin_energy.json",
        help="where to write the results",
    )
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    flops = {m: model_zoo.train_flops_per_sample(m) for m in models}
    results: dict[str, Any] = {
        "command": "python benchmarks/bench_twin_energy.py " + " ".join(argv or sys.argv[1:]),
        "python": platform.python_version(),
        "flops-per-sample": flops,
        "twins": {},
    }
    for kind in DEVICE_KINDS:
        spec = load_device_spec(kind)
        results["twins"][kind] = {}
        for m in models:
            res = sweep(spec, flops[m])
            results["twins"][kind][m] = res
            print_sweep(kind, m, res)
    rows = summary_table(results)
    results["summary"] = rows
    print(
        "\nWhere the twins' energy per sample is least, per kind, model and b (f in MHz; "
        "E: energy per sample; A: its part above idle power)"
    )
    print(
        f"{'kind':<17}{'model':<10}{'b':>4}{'knee':>8}{'f max':>8}{'least':>8}"
        f"{'above idle':>11}{'E(fmax)/least':>14}{'E(fmin)/least':>14}"
        f"{'A(least)/A least':>17}"
    )
    for r in rows:
        print(
            f"{r['kind']:<17}{r['model']:<10}{r['b']:>4}{r['knee-mhz']:>8.0f}"
            f"{r['f-max-mhz']:>8.0f}{r['least-mhz']:>8.0f}{r['least-above-idle-mhz']:>11.0f}"
            f"{r['fmax-over-least']:>14.3f}{r['fmin-over-least']:>14.3f}"
            f"{r['above-idle-at-least-over-least']:>17.3f}"
        )
    r18 = flops.get("resnet18") or model_zoo.train_flops_per_sample("resnet18")
    pubs = published(r18)
    results["published"] = pubs
    print("\nPublished board figures (numbers from the papers' text) beside the twins")
    for p in pubs:
        if p.get("published-energy-per-sample-mj") is not None:
            print(
                f"{p['board']}, {p['workload']}, {p['point']} [{p['source']}]: published "
                f"{p['published-min-per-epoch']:g} min/epoch at {p['published-power-w']:g} W = "
                f"{p['published-energy-per-sample-mj']:.0f} mJ/sample; twin at "
                f"{p['twin-freq-mhz']:g} MHz {p['twin-min-per-epoch']:.1f} min/epoch at "
                f"{p['twin-power-w']:.1f} W = {p['twin-energy-per-sample-mj']:.0f} mJ/sample"
            )
        else:
            print(
                f"{p['board']}, {p['workload']}, {p['point']} [{p['source']}]: twin "
                f"{p['twin-energy-per-sample-mj']:.1f} vs {p['twin-energy-no-cap-mj']:.1f} "
                f"mJ/sample: the twin {'agrees' if p['twin-agrees'] else 'disagrees'}"
            )
    orin = [p for p in pubs if p["board"] == "jetson-agx-orin"]
    if len(orin) == 2:
        pub_ratio = (
            orin[1]["published-energy-per-sample-mj"] / orin[0]["published-energy-per-sample-mj"]
        )
        twin_ratio = orin[1]["twin-energy-per-sample-mj"] / orin[0]["twin-energy-per-sample-mj"]
        results["orin-lowest-over-maxn"] = {"published": pub_ratio, "twin": twin_ratio}
        print(
            f"AGX Orin, lowest mode over MAXN, energy per sample: published {pub_ratio:.2f}x, "
            f"twin (GPU frequency alone) {twin_ratio:.2f}x"
        )
    write_results(args.json, results)
    return 0 if all(math.isfinite(r["fmax-over-least"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
