"""Which processes belong to a job lossguard started: one definition for `probe`/`demo` jobs and `watch`.

A job's processes are its process group plus every process carrying the job's token in its environment
(`LOSSGUARD_JOB`, inherited by everything the job forks). The group alone is not enough: torchrun starts
each rank in a session of its own, so a group signalled without the launcher's help leaves ranks running.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

JOB_ENV = "LOSSGUARD_JOB"  # the token every process of a job inherits


def new_token() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:16]}"


def job_members(pgid: int, token: str | None = None) -> list[int]:
    """Live (not zombie) processes in process group `pgid` or with `LOSSGUARD_JOB=token` in their
    environment (token None: the group alone)."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():  # no procfs (macOS): signal 0 tells whether the group has a member left
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    marker = f"{JOB_ENV}={token}".encode() if token else None
    return [int(entry.name) for entry in proc_dir.iterdir()
            if entry.name.isdigit() and _is_member(entry, pgid, marker)]


def _is_member(entry: Path, pgid: int, marker: bytes | None) -> bool:
    try:
        stat = (entry / "stat").read_text()
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]  # after "(comm)", which may hold spaces
        if state in ("Z", "X"):
            return False
        if int(pgrp) == pgid:
            return True
        return marker is not None and marker in (entry / "environ").read_bytes().split(b"\0")
    except (OSError, ValueError):  # exited while we looked, or another user's process
        return False
