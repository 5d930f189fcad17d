"""The files powerfl ships: device twins (``devices/``), example fleets (``fleets/``),
experiment files (``experiments/``) and replay tables (``replay/``); a wheel also carries
the app's run defaults (``app/pyproject.toml``, copied there by ``setup.py``).

A resource package and nothing else: it imports nothing, and its files are found with
``importlib.resources`` (``fl_client.shipped``), so an installed wheel works from any folder.
"""
