"""The install command for an optional extra that works from where this lossguard was installed.

`pip install 'lossguard[train]'` only works where a package index serves lossguard. From a checkout
(an editable install, or `make setup`) the extra is installed from that checkout's path; from anywhere else,
the extra's own packages are named, which any index serves.
"""

from __future__ import annotations

from pathlib import Path

# The extras of pyproject.toml, package by package (pinned versions stay in pyproject.toml).
EXTRAS = {
    "train": ("torch", "deepspeed", "transformers", "accelerate", "peft", "tensorboard"),
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
}


def checkout_root() -> Path | None:
    """The source checkout this lossguard runs from (src/lossguard/ under a folder with pyproject.toml)."""
    package = Path(__file__).resolve().parent
    root = package.parent.parent
    return root if package.parent.name == "src" and (root / "pyproject.toml").is_file() else None


def install_command(extra: str) -> str:
    root = checkout_root()
    if root is not None:
        make = " (or `make setup` there, which also pins the CPU build of torch)" if (root / "Makefile").is_file() \
            else ""
        return f"pip install -e '{root}[{extra}]'{make}"
    return "pip install " + " ".join(EXTRAS[extra])
