"""JSON report: the `analyze --format json` contract (docs/analyze.md, 'The JSON report'), also written by `watch`
as report.json."""

from __future__ import annotations

import json
import math
from typing import Any, TextIO


def json_safe(value: Any) -> Any:
    """NaN/Inf are not JSON: write them as the strings "nan" / "inf" / "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(report: dict[str, Any], stream: TextIO) -> None:
    json.dump(json_safe(report), stream, indent=2)
    stream.write("\n")
