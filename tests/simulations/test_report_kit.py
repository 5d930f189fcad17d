"""The report kit every study's report shares."""

from __future__ import annotations

import math

import pytest

from simulations.experiments.report_kit import (
    Doc,
    ReportError,
    cap_label,
    cap_span,
    cap_watts,
    fmt,
    load_output,
    mean_std,
    ratio,
    ratio_of,
    write_csv,
)


def test_mean_std_skips_missing_values_and_a_lone_value_has_no_spread():
    assert mean_std([]) == (None, None)
    assert mean_std([None, None]) == (None, None)
    assert mean_std([2.0]) == (2.0, 0.0)
    m, s = mean_std([1.0, None, 3.0])
    assert m == 2.0 and s == pytest.approx(math.sqrt(2.0))


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((None,), "—"),
        ((float("nan"),), "—"),
        ((0.0,), "0.00"),
        ((123.456,), "123"),
        ((1.23456, 0.1), "1.23 ± 0.10"),
        ((0.01234,), "0.0123"),
        ((2.0, 0.5, 1), "2.0 ± 0.5"),
    ],
)
def test_fmt_keeps_three_significant_digits_unless_told(args, text):
    assert fmt(*args) == text


def test_ratios():
    assert ratio(None) == "—" and ratio(1.234) == "1.23×"
    assert ratio_of(3.0, 2.0) == 1.5
    assert ratio_of(None, 2.0) is None and ratio_of(1.0, 0.0) is None


@pytest.mark.parametrize(
    ("cap", "label", "watts"),
    [
        (None, "none", None),
        ("none", "none", None),
        (math.inf, "none", None),
        (4.5, "4.5 W", 4.5),
        (7, "7 W", 7.0),
        ("4.5 W", "4.5 W", 4.5),
        ("4.5W", "4.5 W", 4.5),  # the label of records written before
    ],
)
def test_one_cap_label_for_every_form(cap, label, watts):
    assert cap_label(cap) == label
    assert cap_watts(cap) == watts


def test_cap_span_over_a_run():
    assert cap_span([]) == "?"
    assert cap_span(["4.5 W", "4.5 W"]) == "4.5 W"
    assert cap_span(["none"]) == "none"
    assert cap_span(["7 W", "4.5 W"]) == "4.5–7 W"
    assert cap_span(["none", "4.5 W"]) == "4.5–none"


def test_csv_and_markdown_tables(tmp_path):
    write_csv(tmp_path / "t.csv", ["a", "b"], [[1, None], [2, 3.5]])
    assert (tmp_path / "t.csv").read_text().splitlines() == ["a,b", "1,", "2,3.5"]
    doc = Doc()
    doc.table(["x", "y"], [["1", "2"]])
    doc.row("3", "4")
    assert doc.lines == ["| x | y |", "|---|---|", "| 1 | 2 |", "| 3 | 4 |"]
    path = doc.write(tmp_path / "r.md", final_newline=True)
    assert path.read_text().endswith("| 3 | 4 |\n")


def test_an_output_folder_needs_its_manifest(tmp_path):
    with pytest.raises(ReportError, match=r"no manifest\.json"):
        load_output(tmp_path)
    # the manifest itself (or any file) is named as a file, not as a folder lacking one
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(
        ReportError, match=r"manifest\.json is a file, not a folder; .*output folder"
    ):
        load_output(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text('{"study": "federated", "config": {"name": "x"}}')
    (tmp_path / "records" / "cells").mkdir(parents=True)
    (tmp_path / "records" / "cells" / "a.json").write_text('{"k": 1}')
    out = load_output(tmp_path)
    assert out.study == "federated" and out.config == {"name": "x"}
    assert out.records("cells") == [{"k": 1}] and out.records("lut") == []
