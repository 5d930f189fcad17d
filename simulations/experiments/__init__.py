"""Research experiments: studies from TOML files, resumable records, tables, plots, reports.

``powerfl experiment run configs/experiments/NAME.toml`` and ``powerfl experiment report DIR``
(``simulations.experiments.cli``).
"""
