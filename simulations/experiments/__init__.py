"""Research experiments: studies from TOML files, resumable records, tables, plots, reports.

``powerfl experiment run NAME`` (a shipped ``configs/experiments/NAME.toml``, or
any experiment file) and ``powerfl experiment report DIR``
(``cli``) dispatch through one registry (``registry``) of ``Study`` plugins (``study``):

* single-device: ``single_device_config``, ``single_device``, ``single_device_report``;
* federated: ``federated_config``, ``federated``, ``federated_metrics``, ``federated_plots``,
  ``federated_report``;
* proxy-sensitivity: ``sensitivity_config``, ``proxy_sensitivity``, ``sensitivity_report``.

They share experiment files (``config``), records (``records``), units of work
(``units``, ``progress``, ``datasets``, ``text``) and the report kit (``report_kit``).
"""
