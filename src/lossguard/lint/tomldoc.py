"""TOML (torchtitan train configs): values only, no key positions; messages name the key."""

from __future__ import annotations

from typing import Any


class TomlError(ValueError):
    pass


def load_toml(text: str) -> Any:
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlError(f"invalid TOML: {exc}") from None
