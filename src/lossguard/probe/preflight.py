"""Before a job starts: can the interpreter that will run its ranks import what the job needs?

A missing piece found here is one line and exit 2; found later it is a traceback from a rank, or worse an
auto-attached guard that silently never attaches. The check asks the job's own interpreter, with the job's
own environment, so a `--cmd` that runs another virtualenv's `torchrun` is checked where it runs. It only
looks the modules up (`importlib.util.find_spec`), it imports nothing: a fraction of a second.

It also looks for torch extension build locks a killed build left behind (`stale_build_locks`): DeepSpeed
JIT-builds its ops through torch, and a build that waits on such a lock waits forever, with the log stuck
after "Using ... as PyTorch extensions root". That is said as a warning: a lock can also be a build that is
still running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lossguard.install_hint import install_command

# What the built-in jobs (zoo scenarios, the demo, probe's tiny model) import in every rank.
TRAINING_STACK = ("torch", "deepspeed", "transformers", "accelerate")
# What a user's own `probe --cmd` job needs at least for the auto-attached guard to work.
USER_JOB_STACK = ("torch", "deepspeed")
INSTALL_HINT = install_command("train")
_FIND = ("import importlib.util, sys; "
         "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")


class MissingPiece(Exception):
    """What is missing, for which interpreter, and what to install; the CLI shows it as one line, exit 2."""


def missing_modules(python: str, modules: tuple[str, ...], env: dict[str, str] | None = None) -> list[str]:
    """The `modules` that `python` (run with `env`) cannot find."""
    try:
        proc = subprocess.run([python, "-c", _FIND, *modules], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingPiece(f"cannot run the job's python {python}: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise MissingPiece(f"the job's python {python} failed to start ({last})")
    return proc.stdout.split()


def check_job_stack(what: str, python: str = sys.executable, env: dict[str, str] | None = None,
                    modules: tuple[str, ...] = TRAINING_STACK) -> None:
    """Raise `MissingPiece` naming what `python` lacks to run `what` (lossguard itself included)."""
    missing = missing_modules(python, (*modules, "lossguard"), env)
    if not missing:
        return
    stack = [m for m in missing if m != "lossguard"]
    parts = []
    if stack:
        parts.append(f"{', '.join(stack)} (install the training extra: {INSTALL_HINT})")
    if "lossguard" in missing:
        parts.append("lossguard itself (install lossguard into that environment)")
    where = f"this python ({python})" if python == sys.executable else f"the job's python {python}"
    raise MissingPiece(f"{what} needs {' and '.join(parts)}, which {where} cannot import")


def interpreter_of(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    """The Python that `argv` runs: argv[0] itself when it is a python, else the one its script's `#!` line
    names (torchrun, deepspeed, accelerate are such scripts); None when it cannot be told."""
    if not argv:
        return None
    path = (env or os.environ).get("PATH")
    exe = shutil.which(argv[0], path=path)
    if exe is None:
        return None
    if Path(exe).name.startswith("python"):
        return exe
    try:
        with open(exe, "rb") as handle:
            first = handle.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    words = first[2:].split()
    if Path(words[0]).name == "env" and len(words) > 1:  # "#!/usr/bin/env python3"
        return shutil.which(words[-1], path=path)
    return words[0] if os.access(words[0], os.X_OK) else None


# A build lock older than this was most likely left by a killed build: a JIT build of a DeepSpeed op takes
# seconds on CPU and a few minutes for the largest CUDA ops.
STALE_LOCK_MINUTES = 15


def extensions_root(env: dict[str, str] | None = None) -> Path | None:
    """Where torch builds JIT extensions for a job run with `env` (None where this platform's default is
    not known): TORCH_EXTENSIONS_DIR, else torch's per-user cache folder."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    home = env.get("HOME") or os.path.expanduser("~")
    if sys.platform == "darwin":
        return Path(home) / "Library" / "Caches" / "torch_extensions"
    if sys.platform.startswith("linux"):
        return Path(env.get("XDG_CACHE_HOME") or Path(home) / ".cache") / "torch_extensions"
    return None


def stale_build_locks(env: dict[str, str] | None = None, now: float | None = None) -> list[str]:
    """One warning per torch extension build lock under the job's extensions root that no build has touched
    for STALE_LOCK_MINUTES: the op, the file and how to clear it. Ops sit under the root
    (TORCH_EXTENSIONS_DIR) or under a `py311_cu121`-style folder in it (torch's default)."""
    root = extensions_root(env)
    if root is None or not root.is_dir():
        return []
    now = time.time() if now is None else now
    warnings = []
    for lock in sorted([*root.glob("*/lock"), *root.glob("*/*/lock")]):
        try:
            idle = now - lock.stat().st_mtime
        except OSError:
            continue
        if idle >= STALE_LOCK_MINUTES * 60:
            warnings.append(
                f"{lock} is a build lock no build has touched for {idle / 60:.0f} min; if no build of "
                f"{lock.parent.name} is running, a killed one left it, and every job that JIT-builds that op "
                f"waits on it forever (stuck after \"Using ... as PyTorch extensions root\"): remove it "
                f"(rm {lock})")
    return warnings


def release_build_locks(env: dict[str, str] | None, since: float) -> list[Path]:
    """Remove the torch extension build locks under a stopped job's extensions root made since `since`
    (wall clock, the job's start) that no live process holds; the paths removed. torch takes an op's
    `lock` on every JIT load of it (a no-op ninja run once it is built) and keeps the file open until it
    removes it; a job stopped inside that window leaves the file behind, and every later job that loads
    the op waits on it forever. A lock some process still has open is a running build's (never touched);
    one nobody has open was left by a process that is gone. Linux only (reads /proc); elsewhere nothing."""
    root = extensions_root(env)
    proc = Path("/proc")
    if root is None or not root.is_dir() or not proc.is_dir():
        return []
    removed = []
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:
        try:
            if lock.stat().st_mtime >= since - 1 and not _held_open(lock, proc):
                lock.unlink()
                removed.append(lock)
        except OSError:
            continue
    return removed


def _held_open(path: Path, proc: Path) -> bool:
    """Whether a live process has `path` open (its /proc/PID/fd links; those we may not read count as not)."""
    target = str(path.resolve())
    for fd_dir in proc.glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == target:
                        return True
        except OSError:
            continue
    return False
