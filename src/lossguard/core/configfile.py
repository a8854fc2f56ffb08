"""Read a DeepSpeed config (JSON, JSON with comments / trailing commas, or YAML) into a dict."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


class ConfigFileError(ValueError):
    pass


_COMMENT = re.compile(r'("(?:\\.|[^"\\])*")|//[^\n]*|/\*.*?\*/', re.S)
_TRAILING_COMMA = re.compile(r'("(?:\\.|[^"\\])*")|,(\s*[}\]])')


def load_config(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """(config, warnings). Raises ConfigFileError naming the file, the line and what to do."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ConfigFileError(f"{path}: is a directory; pass the DeepSpeed config file (e.g. ds_config.json)") from None
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot read as text ({exc})") from None
    warnings: list[str] = []
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigFileError(f"{path}:{where} invalid YAML ({getattr(exc, 'problem', exc)})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as first:
            relaxed = _TRAILING_COMMA.sub(lambda m: m.group(1) or m.group(2),
                                          _COMMENT.sub(lambda m: m.group(1) or "", text))
            try:
                data = json.loads(relaxed)
            except json.JSONDecodeError:
                raise ConfigFileError(f"{path}: line {first.lineno}, column {first.colno}: invalid JSON "
                                      f"({first.msg}); fix the file and run again") from None
            warnings.append(f"{path}: JSON with comments or trailing commas; DeepSpeed's json.load rejects it")
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a JSON/YAML object at the top level, got {type(data).__name__}")
    return data, warnings
