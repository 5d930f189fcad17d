"""The digital twins: descriptors, the paper's calibration points, the Device protocol, noise."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_client import model_zoo

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib
from fl_client.devices.base import Device, InvalidFrequencyError, Workload, locked
from fl_client.devices.descriptors import (
    CONFIG_DIR_ENV,
    DEVICE_KINDS,
    DeviceSpec,
    load_device_spec,
)
from fl_client.devices.simulated import (
    SimulatedDevice,
    SimulatedMeter,
    avg_power_w,
    energy_per_sample_j,
    highest_feasible_freq_mhz,
    lowest_power_w,
    power_w,
    step_time_s,
    time_per_sample_s,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "configs" / "devices"
MODELS = model_zoo.MODEL_NAMES  # cnn, resnet18, mobilenetv2
B_PAPER = (4, 8, 16, 32, 64, 128)
NANO_TOML = (SHIPPED / "jetson-nano.toml").read_text()


@pytest.fixture(autouse=True)
def _shipped_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``$POWERFL_CONFIG_DIR`` of the caller's shell must not leak into these tests."""
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)


@pytest.fixture(scope="module")
def flops() -> dict[str, float]:
    """Real fwd+bwd FLOPs per 3×32×32 sample of every model (torch's FLOP counter)."""
    return {m: model_zoo.train_flops_per_sample(m) for m in MODELS}


@pytest.fixture(scope="module")
def nano() -> DeviceSpec:
    return load_device_spec("jetson-nano", SHIPPED)


@pytest.fixture(scope="module")
def specs() -> dict[str, DeviceSpec]:
    return {kind: load_device_spec(kind, SHIPPED) for kind in DEVICE_KINDS}


def best_time_per_sample_s(spec: DeviceSpec, p_max_w: float, flops_per_sample: float) -> float:
    """Fastest noiseless time per sample over B at each b's highest feasible frequency."""
    times = [
        time_per_sample_s(spec, b, f, flops_per_sample)
        for b in B_PAPER
        if (f := highest_feasible_freq_mhz(spec, b, p_max_w, flops_per_sample)) is not None
    ]
    assert times, f"no feasible (b, f) on {spec.kind} under {p_max_w} W"
    return min(times)


# ---------------------------------------------------------------------------------------
# The paper's calibration points (Nano, ResNet18 at 3×32×32), noiseless
# ---------------------------------------------------------------------------------------


def test_fig1_feasibility_under_5w(nano: DeviceSpec, flops: dict[str, float]) -> None:
    r18 = flops["resnet18"]
    assert highest_feasible_freq_mhz(nano, 128, 5.0, r18) == 307.2
    assert power_w(nano, 128, 384.0, r18) > 5.0
    assert highest_feasible_freq_mhz(nano, 64, 5.0, r18) == 460.8
    assert power_w(nano, 64, 537.6, r18) > 5.0


def test_fig1_b64_at_460_is_31_9_percent_faster_per_sample(
    nano: DeviceSpec, flops: dict[str, float]
) -> None:
    r18 = flops["resnet18"]
    ratio = time_per_sample_s(nano, 64, 460.8, r18) / time_per_sample_s(nano, 128, 307.2, r18)
    assert ratio == pytest.approx(0.681, abs=0.02)


@pytest.mark.parametrize("p_max_w", [4.5, 5.0, 7.0])
def test_fig2_b8_reaches_a_higher_frequency_than_b32_yet_b32_is_faster_per_sample(
    nano: DeviceSpec, flops: dict[str, float], p_max_w: float
) -> None:
    r18 = flops["resnet18"]
    f8 = highest_feasible_freq_mhz(nano, 8, p_max_w, r18)
    f32 = highest_feasible_freq_mhz(nano, 32, p_max_w, r18)
    assert f8 is not None and f32 is not None
    assert f8 > f32
    # "using b_2 = 32 always leads to a lower T_s" (Fig. 2): the trade-off r must decide
    assert time_per_sample_s(nano, 32, f32, r18) < time_per_sample_s(nano, 8, f8, r18)


def test_b1_bands_of_the_paper_on_the_nano(nano: DeviceSpec) -> None:
    assert nano.b1_max_knob_value(4.5) == 307.2
    assert nano.b1_max_knob_value(5.0) == 307.2
    assert nano.b1_max_knob_value(7.0) == 614.4
    assert nano.b1_max_knob_value(20.0) == 614.4
    assert nano.b1_max_knob_value(math.inf) == 921.6
    assert nano.b1_max_knob_value(None) == 921.6
    with pytest.raises(ValueError, match=r"p-max-w: 4 W is below the lowest B1 band"):
        nano.b1_max_knob_value(4.0)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="p-max-w"):
            nano.b1_max_knob_value(bad)


@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_b1_bands_are_safe_for_every_model_and_batch_size(
    specs: dict[str, DeviceSpec], flops: dict[str, float], kind: str
) -> None:
    """Power at each band's frequency stays under the band's cap for b in 4…128, any model."""
    spec = specs[kind]
    for band in spec.b1_freq_caps:
        if math.isinf(band.min_p_max_w):
            continue
        worst_w = max(
            power_w(spec, b, band.freq_mhz, flops[m]) for m in MODELS for b in range(4, 129)
        )
        assert worst_w < band.min_p_max_w, (kind, band)


def test_power_and_time_are_monotone(specs: dict[str, DeviceSpec], flops: dict[str, float]) -> None:
    for spec in specs.values():
        f_list = spec.gpu_freqs_mhz
        for m in MODELS:
            grid = np.array([[power_w(spec, b, f, flops[m]) for f in f_list] for b in B_PAPER])
            tps = np.array(
                [[time_per_sample_s(spec, b, f, flops[m]) for f in f_list] for b in B_PAPER]
            )
            assert (np.diff(grid, axis=0) > 0).all(), (spec.kind, m, "power in b")
            assert (np.diff(grid, axis=1) > 0).all(), (spec.kind, m, "power in f")
            assert (np.diff(tps, axis=1) < 0).all(), (spec.kind, m, "time per sample in f")
            avg = np.array([[avg_power_w(spec, b, f, flops[m]) for f in f_list] for b in B_PAPER])
            assert (avg < grid).all() and (avg > spec.idle_power_w).all()


def test_mobilenetv2_draws_less_peak_power_than_resnet18(
    nano: DeviceSpec, flops: dict[str, float]
) -> None:
    """Paper §5.2: MobileNetV2 has lower peak power (so it reaches higher f under a cap)."""
    for b in B_PAPER:
        assert power_w(nano, b, 921.6, flops["mobilenetv2"]) < power_w(
            nano, b, 921.6, flops["resnet18"]
        )
    assert highest_feasible_freq_mhz(nano, 128, 5.0, flops["mobilenetv2"]) == 384.0


@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_caps_bind_for_the_small_default_cnn(
    specs: dict[str, DeviceSpec], flops: dict[str, float], kind: str
) -> None:
    """At the tightest suggested cap the cnn at b=128 cannot run at f_max; small b can."""
    spec, cnn = specs[kind], flops["cnn"]
    tight_w = spec.suggested_caps_w[0]
    assert power_w(spec, 128, spec.max_freq_mhz, cnn) > tight_w
    assert power_w(spec, 4, spec.max_freq_mhz, cnn) < tight_w
    assert lowest_power_w(spec, B_PAPER, cnn) < tight_w
    assert lowest_power_w(spec, B_PAPER, cnn) == power_w(spec, 4, spec.min_freq_mhz, cnn)


def test_cnn_on_the_nano_draws_well_above_4_5w_at_b128_and_max_f(
    nano: DeviceSpec, flops: dict[str, float]
) -> None:
    cnn = flops["cnn"]
    assert power_w(nano, 128, 921.6, cnn) > 5.5
    assert power_w(nano, 4, 921.6, cnn) < 3.5
    f128 = highest_feasible_freq_mhz(nano, 128, 4.5, cnn)
    assert f128 is not None and f128 < 921.6


def test_agx_orin_matches_powertrain_at_maxn() -> None:
    """PowerTrain: ResNet18, ImageNet 224×224, b=16, MAXN: 3.1 min/epoch (50k), 51.1 W."""
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    model = torchvision.models.resnet18(weights=None)  # the ImageNet ResNet18, not task's
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.randn(1, 3, 224, 224)).sum().backward()
    imagenet_flops = float(counter.get_total_flops())
    spec = load_device_spec("jetson-agx-orin")
    epoch_min = time_per_sample_s(spec, 16, 1300.5, imagenet_flops) * 50_000 / 60
    assert epoch_min == pytest.approx(3.1, rel=0.15)
    assert power_w(spec, 16, 1300.5, imagenet_flops) == pytest.approx(51.1, rel=0.15)


def test_tx2_nx_is_1_6_to_2x_faster_and_orin_nano_several_times_faster_than_the_nano(
    specs: dict[str, DeviceSpec], flops: dict[str, float]
) -> None:
    r18 = flops["resnet18"]
    nano = specs["jetson-nano"]
    for p_max_w in (4.5, 5.0, 7.0, math.inf):
        speedup = best_time_per_sample_s(nano, p_max_w, r18) / best_time_per_sample_s(
            specs["jetson-tx2-nx"], p_max_w, r18
        )
        assert 1.6 <= speedup <= 2.0, (p_max_w, speedup)
    for p_max_w in (7.0, 10.0, math.inf):
        speedup = best_time_per_sample_s(nano, p_max_w, r18) / best_time_per_sample_s(
            specs["jetson-orin-nano"], p_max_w, r18
        )
        assert speedup >= 3.0, (p_max_w, speedup)


def test_default_fleets_caps_have_a_b1_band(specs: dict[str, DeviceSpec]) -> None:
    """Every simulated node of the shipped fleets can run B1 under its own cap."""
    fleets = sorted((REPO / "configs" / "fleets").glob("*.toml"))
    assert fleets
    for path in fleets:
        for node in tomllib.loads(path.read_text()).get("node", []):
            if node.get("backend", "simulated") != "simulated":
                continue
            raw = node.get("p-max-w", "none")
            p_max_w = math.inf if str(raw).lower() == "none" else float(raw)
            spec = specs[node["device"]]
            assert spec.b1_max_knob_value(p_max_w) in spec.gpu_freqs_mhz, (path.name, node)


def test_energy_per_sample_is_avg_power_times_time(
    nano: DeviceSpec, flops: dict[str, float]
) -> None:
    r18 = flops["resnet18"]
    e = energy_per_sample_j(nano, 64, 460.8, r18)
    assert e == pytest.approx(
        avg_power_w(nano, 64, 460.8, r18) * time_per_sample_s(nano, 64, 460.8, r18)
    )
    with pytest.raises(ValueError, match="batch-size"):
        step_time_s(nano, 0, 460.8, r18)
    with pytest.raises(ValueError, match="flops-per-sample"):
        power_w(nano, 8, 460.8, 0.0)


# ---------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------

WORKLOAD = Workload("resnet18", model_zoo.IMAGE_SHAPE, 3.33e9)


def test_frequency_control_and_restore(nano: DeviceSpec) -> None:
    dev = SimulatedDevice(nano, seed=1)
    assert isinstance(dev, Device)
    assert dev.info.kind == "jetson-nano" and dev.info.backend == "simulated"
    assert dev.knob_values == nano.gpu_freqs_mhz
    assert dev.current_knob_value() == 921.6 and dev.now_s() == 0.0
    dev.set_knob_value(307.205)  # within 0.01 MHz of a table member
    assert dev.current_knob_value() == 307.2
    with pytest.raises(InvalidFrequencyError, match=r"310 MHz .* allowed: 76\.8, 153\.6"):
        dev.set_knob_value(310.0)
    assert dev.current_knob_value() == 307.2
    dev.restore()
    dev.restore()
    assert dev.current_knob_value() == 921.6
    with locked(dev, 460.8):
        assert dev.current_knob_value() == 460.8
    assert dev.current_knob_value() == 921.6
    dev.set_knob_value(76.8)
    dev.close()
    assert dev.current_knob_value() == 921.6
    assert dev.now_s() == 0.0  # only accounted work moves the clock


def run_steps(dev: SimulatedDevice, b: int, n: int) -> tuple[list[int], SimulatedMeter]:
    calls: list[int] = []
    with dev.measure(WORKLOAD) as meter:
        for _ in range(n):
            meter.step(b, lambda: calls.append(1))
    return calls, meter


def test_meter_accounts_time_energy_and_peak_with_noise(nano: DeviceSpec) -> None:
    dev = SimulatedDevice(nano, seed=7)
    dev.set_knob_value(460.8)
    calls, meter = run_steps(dev, 64, 50)
    m = meter.measurement
    records = meter.records
    assert len(calls) == 50 and m.steps == 50 and m.samples == 50 * 64
    expected_s = 50 * step_time_s(nano, 64, 460.8, WORKLOAD.flops_per_sample)
    assert dev.now_s() == pytest.approx(m.time_s)
    # 2 % timing noise per step averages to ~0.3 % over 50 steps
    assert m.time_s == pytest.approx(expected_s, rel=0.015)
    assert m.time_s != pytest.approx(expected_s, rel=1e-9)  # noise is really there
    assert m.energy_j == pytest.approx(sum(r.avg_power_w * r.time_s for r in records))
    model_avg_w = avg_power_w(nano, 64, 460.8, WORKLOAD.flops_per_sample)
    assert m.avg_power_w == pytest.approx(model_avg_w, rel=0.015)
    assert m.peak_power_w == max(m.power_samples_w) == max(r.peak_power_w for r in records)
    model_peak_w = power_w(nano, 64, 460.8, WORKLOAD.flops_per_sample)
    assert model_peak_w < m.peak_power_w < model_peak_w * (1 + 3 * nano.power_noise)
    assert all(r.freq_mhz == 460.8 and r.avg_power_w <= r.peak_power_w for r in records)
    dev.close()
    assert dev.current_knob_value() == 921.6


def test_noise_is_seeded_and_can_be_switched_off(nano: DeviceSpec) -> None:
    def trace(seed: int, noise: bool = True) -> list[tuple[float, float, float]]:
        dev = SimulatedDevice(nano, seed=seed, noise=noise)
        _, meter = run_steps(dev, 32, 10)
        return [(r.time_s, r.peak_power_w, r.avg_power_w) for r in meter.records]

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)
    exact = trace(3, noise=False)
    flops = WORKLOAD.flops_per_sample
    assert (
        exact
        == [
            (
                step_time_s(nano, 32, 921.6, flops),
                power_w(nano, 32, 921.6, flops),
                avg_power_w(nano, 32, 921.6, flops),
            )
        ]
        * 10
    )


def test_meter_follows_frequency_changes_and_rejects_bad_steps(nano: DeviceSpec) -> None:
    dev = SimulatedDevice(nano, noise=False)
    flops = WORKLOAD.flops_per_sample
    with dev.measure(WORKLOAD) as meter:
        meter.step(8, lambda: None)
        dev.set_knob_value(153.6)
        meter.step(8, lambda: None)
        before = (dev.now_s(), meter.measurement.steps)
        with pytest.raises(RuntimeError, match="boom"):
            meter.step(8, lambda: (_ for _ in ()).throw(RuntimeError("boom")))
        ran: list[int] = []
        with pytest.raises(ValueError, match="batch-size"):
            meter.step(0, lambda: ran.append(1))
        assert ran == [] and (dev.now_s(), meter.measurement.steps) == before
    assert [r.freq_mhz for r in meter.records] == [921.6, 153.6]
    assert meter.measurement.time_s == pytest.approx(
        step_time_s(nano, 8, 921.6, flops) + step_time_s(nano, 8, 153.6, flops)
    )
    with (
        pytest.raises(ValueError, match="flops-per-sample"),
        dev.measure(Workload("cnn", model_zoo.IMAGE_SHAPE, 0.0)),
    ):
        pass


def test_the_model_really_trains_through_the_meter(nano: DeviceSpec) -> None:
    torch.manual_seed(0)
    model = model_zoo.build_model("cnn")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, *model_zoo.IMAGE_SHAPE), torch.randint(0, 10, (16,))
    losses: list[float] = []

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    dev = SimulatedDevice(nano, seed=0)
    workload = Workload("cnn", model_zoo.IMAGE_SHAPE, model_zoo.train_flops_per_sample("cnn"))
    with dev.measure(workload) as meter:
        for _ in range(30):
            meter.step(16, step)
    assert len(losses) == 30 and losses[-1] < 0.8 * losses[0]  # it learns the batch
    assert meter.measurement.time_s == pytest.approx(dev.now_s())


def test_profiler_on_the_twin_reproduces_the_model(nano: DeviceSpec) -> None:
    """The on-device profiler, run on a noiseless twin, reads back the model's tables."""
    from fl_client.profiler import ProfileOptions, profile

    dev = SimulatedDevice(nano, noise=False)
    b_list = [64, 128]
    lut = profile(dev, WORKLOAD, b_list, lambda b: lambda: None, ProfileOptions(progress=False))
    flops = WORKLOAD.flops_per_sample
    for i, b in enumerate(b_list):
        for j, f in enumerate(nano.gpu_freqs_mhz):
            assert lut.time_per_sample_s[i, j] == pytest.approx(
                time_per_sample_s(nano, b, f, flops)
            )
            assert lut.peak_power_w[i, j] == pytest.approx(power_w(nano, b, f, flops))
    assert dev.current_knob_value() == 921.6
    assert lut.profile_time_s == pytest.approx(dev.now_s())


def test_describe_and_a_copied_descriptor_folder(tmp_path: Path, nano: DeviceSpec) -> None:
    for kind in DEVICE_KINDS:
        shutil.copy(SHIPPED / f"{kind}.toml", tmp_path)
    assert load_device_spec("jetson-nano", tmp_path) == nano  # ``source`` is not compared
    info = SimulatedDevice(nano, seed=5).describe()
    assert info["kind"] == "jetson-nano" and info["seed"] == 5 and info["clock-s"] == 0.0


def test_the_twin_reports_the_window_its_real_board_would_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nano: DeviceSpec, flops: dict[str, float]
) -> None:
    """The twin needs no window (one exact reading per step) and profiles as before; per
    cell it reports the window the board's INA3221 would have needed, never charged."""
    from fl_client.profiler import ProfileOptions, profile

    dev = SimulatedDevice(nano, noise=False)
    assert dev.info.sensor.name == "twin" and dev.info.sensor.min_window_s == 0.0
    board = dev.info.board_sensor
    assert board is not None and board.name == "ina3221-sysfs"
    assert (board.min_window_s, board.min_power_samples) == (0.5, 10)
    assert board.update_period_s == pytest.approx(0.0066)
    assert "0.5 s" in str(dev.describe()["board-sensor"])
    cnn = Workload("cnn", model_zoo.IMAGE_SHAPE, flops["cnn"])
    lut = profile(dev, cnn, [4, 128], lambda b: lambda: None, ProfileOptions(progress=False))
    assert (lut.power_samples == 3).all() and (lut.settled == 1).all()  # noiseless: 3 steps
    step_s = lut.window_s / 3
    # whole steps covering the board's 0.5 s, at least the 3 measured
    expected = np.maximum(np.ceil(0.5 / step_s - 1e-9), 3) * step_s
    np.testing.assert_allclose(lut.needed_window_s, expected)
    assert (lut.needed_window_s >= 0.5 - 1e-9).all() and (lut.needed_window_s >= lut.window_s).all()
    # a report only: the twin's profiling time is its own clock's
    assert lut.profile_time_s == pytest.approx(dev.now_s())
    board_s = lut.board_profile_time_s
    assert board_s is not None and board_s > 3 * lut.profile_time_s
    assert board_s == pytest.approx(
        lut.profile_time_s - lut.window_s.sum() + lut.needed_window_s.sum()
    )
    # a descriptor may give its board's sensor other numbers
    text = NANO_TOML.replace("min-window-s = 0.5", "min-window-s = 2.0")
    text = text.replace("update-period-s = 0.0066", "update-period-s = 0.5")
    (tmp_path / "jetson-nano.toml").write_text(text)
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
    slow = load_device_spec("jetson-nano")
    assert slow.board_sensor().min_window_s == 5.0  # 10 readings 0.5 s apart
    assert slow.board_sensor(sample_rate_hz=1000.0).update_period_s == 0.5
    text = NANO_TOML.replace("update-period-s = 0.0066 ", "# ").replace("min-window-s", "# ")
    (tmp_path / "jetson-nano.toml").write_text(text.replace("min-power-samples", "# "))
    plain = load_device_spec("jetson-nano")  # the keys are optional: the INA3221 defaults
    assert plain.board_sensor() == nano.board_sensor()
