"""fl_client.balance: the ``balance`` modes as data. A new mode is one entry, and the node,
the settings and the docs take it from there."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fl_client.balance import BALANCE_MODES, Mode, Slack, energy_saved_j
from fl_client.node import train_node
from fl_client.selection import Selection
from fl_client.settings import RunSettings, SettingsError
from tests.fl_client.test_node import NODE, R_FOR_B64, initial_state, run_config, train_config

METHOD_MD = Path(__file__).resolve().parents[2] / "docs" / "method.md"


def test_a_new_mode_is_one_entry_and_the_node_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mode that runs half its local work and reports its budget: one dict entry, and a
    slack node's round does both."""
    half = Mode(
        doc="`half`: half its local work",
        label="balance = half",
        work_share=lambda slack, chosen: 0.5,
        report=lambda slack, chosen: {"predicted_energy_saved_j": slack.budget_s},
    )
    with pytest.raises(SettingsError, match="balance: unknown value 'half'"):
        RunSettings.from_config({"balance": "half"})
    monkeypatch.setitem(BALANCE_MODES, "half", half)
    node, state = {**NODE, "p-max-w": 7.0}, initial_state()
    settings = run_config(tmp_path, balance="half", **{"deadline-margin": 0.1})
    first = train_node(settings, node, train_config(1, r=R_FOR_B64), state)[1]
    assert first.fastest_time_s is not None and first.predicted_energy_saved_j is None
    deadline = 10 * first.fastest_time_s
    slack = train_node(settings, node, train_config(2, r=R_FOR_B64, deadline_s=deadline), state)[1]
    # its own Eq. 4 cell (no reselect), half the minibatches of its first round
    assert (slack.batch_size, slack.gpu_freq_mhz) == (first.batch_size, first.gpu_freq_mhz)
    steps, all_steps = slack.local_steps, first.local_steps
    assert steps is not None and all_steps is not None
    assert steps == pytest.approx(all_steps / 2, abs=1) and steps < all_steps
    assert slack.predicted_energy_saved_j == pytest.approx(deadline * 0.9)
    assert slack.deadline_miss == 0.0


def test_the_settings_allow_exactly_the_modes() -> None:
    for name in BALANCE_MODES:
        assert RunSettings.from_config({"balance": name}).balance == name
    with pytest.raises(SettingsError, match="allowed: " + ", ".join(BALANCE_MODES)):
        RunSettings.from_config({"balance": "sometimes"})


def test_method_md_gives_each_modes_doc_line() -> None:
    text = " ".join(METHOD_MD.read_text().split())
    for name, mode in BALANCE_MODES.items():
        assert mode.doc.startswith(f"`{name}`: ")
        assert mode.doc in text, f"docs/method.md lacks the doc line of balance mode {name!r}"


def _cell(time_ms: float, energy_mj: float, b: int = 32) -> Selection:
    return Selection(
        method="power-aware",
        batch_size=b,
        knob_value=460.8,
        time_per_sample_s=time_ms / 1e3,
        peak_power_w=4.0,
        score=math.nan,
        p_max_w=None,
        candidates=(),
        energy_per_sample_j=energy_mj / 1e3,
    )


def test_the_built_in_modes_spend_slack_as_their_docs_say() -> None:
    own, fastest = _cell(2.0, 6.0, b=64), _cell(1.0, 5.0)
    slack = Slack(own, fastest, budget_s=8.0, work=1000, idle_power_w=math.nan)
    assert not BALANCE_MODES["off"].plans
    samples = BALANCE_MODES["samples"].reselect
    assert samples is not None and samples(slack).changes == {"time_weight": 0.0}
    energy = BALANCE_MODES["energy"].reselect
    assert energy is not None
    # its own b*, energy above idle (unknown idle: 0)
    ask = energy(slack)
    assert ask.batch_size == 64
    assert ask.changes == {"energy_weight": 1.0, "idle_power_w": 0.0}
    # steps: whole extra work within the budget (8 s / 2 s), never less than all of it
    assert BALANCE_MODES["steps"].work_share(slack, own) == pytest.approx(4.0)
    tight = Slack(own, fastest, budget_s=1.0, work=1000, idle_power_w=math.nan)
    assert BALANCE_MODES["steps"].work_share(tight, own) == 1.0
    assert BALANCE_MODES["energy"].report(slack, own) == {
        "predicted_energy_saved_j": pytest.approx(-1.0)
    }
    assert BALANCE_MODES["samples"].report(slack, own) == {}


def test_energy_saved_counts_the_idle_wait_the_fastest_cell_would_have_had() -> None:
    fastest, slow = _cell(1.0, 5.0), _cell(2.0, 6.0)
    # 1000 samples: 5 J in 1 s then 1 s idle at 2 W, against 6 J in 2 s: 1 J saved
    assert energy_saved_j(fastest, slow, 1000, 2.0) == pytest.approx(1.0)
    # an unknown idle power counts 0: the slower cell then costs 1 J more
    assert energy_saved_j(fastest, slow, 1000, math.nan) == pytest.approx(-1.0)


def test_steps_runs_at_most_max_work_share_and_says_when_it_bounds() -> None:
    own, fastest = _cell(2.0, 6.0, b=64), _cell(1.0, 5.0)
    steps = BALANCE_MODES["steps"]
    # the deadline leaves room for 4 times the work; a bound of 3 takes 3 and says so
    bounded = Slack(own, fastest, budget_s=8.0, work=1000, idle_power_w=math.nan, max_work_share=3)
    assert steps.work_share(bounded, own) == pytest.approx(3.0)
    assert steps.report(bounded, own) == {"work_share": 3.0, "work_share_capped": 1.0}
    roomy = Slack(own, fastest, budget_s=8.0, work=1000, idle_power_w=math.nan, max_work_share=8)
    assert steps.work_share(roomy, own) == pytest.approx(4.0)
    assert steps.report(roomy, own) == {"work_share": pytest.approx(4.0), "work_share_capped": 0.0}
    assert RunSettings.from_config({}).max_work_share == 16.0
    with pytest.raises(SettingsError, match="max-work-share"):
        RunSettings.from_config({"max-work-share": 0.5})
