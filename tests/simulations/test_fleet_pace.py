"""The straggler fleets' ratio (slowest ÷ median best round time) comes from the twins and
caps: each shipped ``straggler-<R>x`` fleet is within 10% of the R in its name."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from fl_client import model_zoo
from fl_client.devices import simulated as sim
from fl_client.devices.descriptors import load_device_spec
from fl_client.feasibility import PEAK_SIGMA_K
from fl_client.power import PowerLimit
from fl_client.settings import load_fleet
from fl_client.shipped import shipped_names
from simulations.experiments.fleet_pace import (
    DEFAULT_BATCH_SIZES,
    PaceRule,
    fleet_pace,
    main,
    node_pace,
)

STRAGGLER = re.compile(r"^straggler-(\d+(?:\.\d+)?)x$")
STRAGGLER_FLEETS = [n for n in shipped_names("fleets") if STRAGGLER.match(n)]


def test_three_straggler_fleets_are_shipped():
    assert len(STRAGGLER_FLEETS) == 3


@pytest.mark.parametrize("name", STRAGGLER_FLEETS)
def test_a_straggler_fleets_ratio_is_the_one_in_its_name(name):
    target = float(STRAGGLER.match(name).group(1))  # type: ignore[union-attr]
    pace = fleet_pace(name)
    assert pace.ratio == pytest.approx(target, rel=0.10)
    # the same size as the default fleet, so the study's cost stays the same
    assert len(pace.nodes) == len(load_fleet("default"))


def test_the_ratio_is_the_slowest_over_the_median_round_time():
    pace = fleet_pace("straggler-2x")
    times = sorted(n.round_time_s for n in pace.nodes)
    assert pace.ratio == pytest.approx(times[-1] / ((times[3] + times[4]) / 2))
    assert pace.slowest.name == "nano-4.5w"


def test_the_default_fleets_stragglers_are_its_4_5_w_nanos():
    pace = fleet_pace("default")
    slowest = [n for n in pace.nodes if n.round_time_s == pace.slowest.round_time_s]
    assert {n.name for n in slowest} == {"nano-4.5w-1", "nano-4.5w-2"}
    assert pace.ratio > 1.0


def test_a_nodes_pace_is_its_fastest_cell_feasible_under_its_cap():
    """Every faster cell of the twin breaks the cap with its margin (robust peak =
    peak + k·σ, σ the twin's power noise); the chosen one does not."""
    flops = model_zoo.train_flops_per_sample("cnn")
    limit = PowerLimit(4.5, 0.05)
    p = node_pace("nano", "jetson-nano", limit, PaceRule(flops))
    spec = load_device_spec("jetson-nano")

    def robust(b: int, f: float) -> float:
        return sim.power_w(spec, b, f, flops) * (1 + PEAK_SIGMA_K * spec.power_noise)

    assert robust(p.batch_size, p.freq_mhz) < limit.limit_w
    for b in DEFAULT_BATCH_SIZES:
        for f in spec.gpu_freqs_mhz:
            if sim.time_per_sample_s(spec, b, f, flops) < p.time_per_sample_s:
                assert robust(b, f) >= limit.limit_w, (b, f)
    # no cap: the twin's fastest cell of all
    free = node_pace("nano", "jetson-nano", PowerLimit(math.inf), PaceRule(flops))
    fastest = min(
        sim.time_per_sample_s(spec, b, f, flops)
        for b in DEFAULT_BATCH_SIZES
        for f in spec.gpu_freqs_mhz
    )
    assert free.time_per_sample_s == pytest.approx(fastest)


def test_a_nodes_data_share_scales_its_round_time():
    equal = fleet_pace("straggler-5x")
    samples = {n.name: 1.0 for n in equal.nodes}
    samples["nano-4.5w"] = 2.0
    skewed = fleet_pace("straggler-5x", samples=samples)
    assert skewed.ratio == pytest.approx(2 * equal.ratio)


def test_a_cap_no_cell_meets_is_an_error_naming_the_node():
    flops = model_zoo.train_flops_per_sample("cnn")
    with pytest.raises(ValueError, match=r"agx: no .* feasible under 5 W"):
        node_pace("agx", "jetson-agx-orin", PowerLimit(5.0, 0.05), PaceRule(flops))


def test_the_command_prints_each_fleets_ratio(capsys):
    assert main(["straggler-1.2x", "default"]) == 0
    out = capsys.readouterr().out
    ratios = re.findall(r"^fleet (\S+): slowest ÷ median best round time = ([0-9.]+)×", out, re.M)
    assert [n for n, _ in ratios] == ["straggler-1.2x", "default"]
    assert float(ratios[0][1]) == pytest.approx(fleet_pace("straggler-1.2x").ratio, abs=0.005)
    assert np.isfinite(float(ratios[1][1]))
