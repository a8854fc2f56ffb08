"""Shadowing one attribute of one object for a while: the class and every other instance untouched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def shadow(obj: Any, name: str, replacement: Any) -> Callable[[], None]:
    """Set `obj.<name>` on the instance; the function that puts back what the instance had (or removes the
    shadow, so the class's own attribute shows again)."""
    had, previous = name in vars(obj), vars(obj).get(name)
    setattr(obj, name, replacement)

    def undo() -> None:
        if had:
            setattr(obj, name, previous)
        else:
            delattr(obj, name)

    return undo


def noop_step(owner: Any) -> Callable[[], None]:
    """`owner.step` a no-op (an optimizer or LR scheduler whose step is held); the function that undoes it."""
    return shadow(owner, "step", lambda *args, **kwargs: None)
