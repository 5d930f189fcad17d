"""``python -m simulations`` is the ``powerfl`` command."""

from simulations.cli import main

raise SystemExit(main())
