"""The benchmarks' results file: one JSON object, standard JSON (NaN and ±inf as null)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite(x: Any) -> Any:
    """``x`` with NaN and infinities as None (standard JSON), tuples as lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Write ``results`` to ``path`` (its folder made if missing) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite(results), indent=2, allow_nan=False) + "\n")
    print(f"wrote {path}")
