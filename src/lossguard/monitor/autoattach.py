"""Auto-attach: guard a job that never imports lossguard.

`lossguard probe` and `lossguard watch --attach` put `lossguard/data/autoattach` (a directory holding only a
`sitecustomize.py`) on the job's `PYTHONPATH`. Python runs it at start-up in every process the job starts
(the launcher and each rank), and it calls `install()`, which adds a meta-path finder. The finder does not
load anything itself: when the job imports `deepspeed` or `transformers.trainer`, it lets the normal finders
find the module and wraps their loader so that, right after the module has executed, lossguard patches it:

- `deepspeed.initialize(...)` -> the original, then `lossguard.attach(engine, events_dir=$LOSSGUARD_EVENTS_DIR)`;
- `transformers.Trainer.__init__` -> the original, then `add_callback(LossguardCallback(events_dir=...))`,
  unless the user already added one. A process with a guarded Trainer does not also attach to the engine
  that the Trainer creates (the callback already watches it).

Environment: `LOSSGUARD_EVENTS_DIR` (per-rank JSONL, optional), `LOSSGUARD_HALT_ON` (optional, the
`halt_on` option), `LOSSGUARD_RECOVER=1` (`recover=True`: `watch --attach --recover`),
`LOSSGUARD_AUTOATTACH=0` (off). Never breaks the job: a failure to patch or to attach is
one line on stderr and the job runs unguarded.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import os
import sys
from pathlib import Path
from typing import Any

ENV_EVENTS_DIR = "LOSSGUARD_EVENTS_DIR"
ENV_HALT_ON = "LOSSGUARD_HALT_ON"
ENV_RECOVER = "LOSSGUARD_RECOVER"
ENV_SWITCH = "LOSSGUARD_AUTOATTACH"

SITE_DIR = Path(__file__).resolve().parent.parent / "data" / "autoattach"


class _State:
    trainer_guarded = False  # a Trainer in this process carries our callback: leave its engine alone
    attachments: list[Any] = []


def _warn(what: str, exc: BaseException) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"lossguard auto-attach: {what}: {type(exc).__name__}: {exc} (the job goes on unguarded)\n")


def guard_options() -> dict[str, Any]:
    options: dict[str, Any] = {}
    events_dir = os.environ.get(ENV_EVENTS_DIR)
    if events_dir:
        options["events_dir"] = events_dir
    halt_on = os.environ.get(ENV_HALT_ON)
    if halt_on:
        options["halt_on"] = [h.strip() for h in halt_on.split(",") if h.strip()]
    if os.environ.get(ENV_RECOVER) == "1":
        options["recover"] = True
    return options


# -- the patches ---------------------------------------------------------------------------------------------
def patch_deepspeed(module: Any) -> None:
    original = module.initialize
    if getattr(original, "_lossguard_wrapped", False):
        return

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not _State.trainer_guarded:
            try:
                from lossguard.monitor.adapters.deepspeed import attach

                engine = result[0] if isinstance(result, tuple) else result
                _State.attachments.append(attach(engine, **guard_options()))
            except Exception as exc:
                _warn("cannot attach to the DeepSpeed engine", exc)
        return result

    initialize._lossguard_wrapped = True  # type: ignore[attr-defined]
    module.initialize = initialize


def patch_trainer(module: Any) -> None:
    cls = module.Trainer
    original = cls.__init__
    if getattr(original, "_lossguard_wrapped", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            from lossguard.monitor.adapters.hf import LossguardCallback

            callbacks = getattr(getattr(self, "callback_handler", None), "callbacks", [])
            if not any(isinstance(c, LossguardCallback) for c in callbacks):
                self.add_callback(LossguardCallback(**guard_options()))
            _State.trainer_guarded = True
        except Exception as exc:
            _warn("cannot add LossguardCallback to the Trainer", exc)

    __init__._lossguard_wrapped = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


PATCHES = {"deepspeed": patch_deepspeed, "transformers.trainer": patch_trainer}


# -- the import hook -----------------------------------------------------------------------------------------
class _PatchingLoader:
    """The real loader, plus one patch after the module has executed. Everything else is delegated, so
    `importlib.resources` and friends see the real loader's methods."""

    def __init__(self, loader: Any, patch: Any) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:
            _warn(f"cannot patch {module.__name__}", exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader, patch)
            return spec
        except Exception as exc:
            _warn(f"import hook for {fullname}", exc)
            return None


def install() -> None:
    """Add the import hook (idempotent). Modules already imported are patched at once."""
    if os.environ.get(ENV_SWITCH, "1") == "0" or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            try:
                patch(module)
            except Exception as exc:
                _warn(f"cannot patch {name}", exc)
    sys.meta_path.insert(0, _Finder())
    atexit.register(_close_all)


def _close_all() -> None:
    for attachment in _State.attachments:
        with contextlib.suppress(Exception):
            attachment.monitor.close()


def child_env(env: dict[str, str] | None = None, *, events_dir: str | os.PathLike | None = None,
              recover: bool = False) -> dict[str, str]:
    """`env` (default: this process's) with the auto-attach directory and lossguard itself on PYTHONPATH;
    `recover`: the attached guard holds faulty steps (`recover=True`)."""
    out = dict(os.environ if env is None else env)
    src_dir = str(Path(__file__).resolve().parents[2])
    # A source checkout must be importable in the job; an installed lossguard already is.
    own = [str(SITE_DIR)] + ([] if "-packages" in Path(src_dir).name else [src_dir])
    parts = own + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    seen: list[str] = []
    for part in parts:
        if part not in seen:
            seen.append(part)
    out["PYTHONPATH"] = os.pathsep.join(seen)
    out.pop(ENV_SWITCH, None)
    if events_dir is not None:
        out[ENV_EVENTS_DIR] = str(events_dir)
    out.pop(ENV_RECOVER, None)
    if recover:
        out[ENV_RECOVER] = "1"
    return out
