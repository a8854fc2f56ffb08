"""`lossguard demo`"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from lossguard.cli.errors import UserError
from lossguard.cli.options import warn_stale_build_locks


@click.command("demo")
@click.option("--scenario", default=None, help="Which failure to show (default: bf16-nan). See --list.")
@click.option("--list", "list_only", is_flag=True, help="List the demo scenarios and exit.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where the runs, events, checkpoint and report go (default: a new temporary directory).")
def demo(scenario: str | None, list_only: bool, out_dir: str | None) -> None:
    """Run a real tiny DeepSpeed job that dies, catch it live, diagnose it, run the fix, and recover it.

    Two CPU ranks over gloo, a 2-layer GPT-2, DeepSpeed + transformers.Trainer; about a minute. The fourth
    act runs the dying job again with the Trainer callback's recover=True: the bad step is held on every
    rank, the run finishes, and the report says what was recovered.
    """
    try:
        from lossguard import demo as demos
    except ImportError as exc:
        from lossguard.install_hint import install_command

        raise UserError(f"the demo needs the training stack ({exc.name} is missing): "
                        f"{install_command('train')}") from None
    if list_only:
        for name, description in demos.list_demos():
            click.echo(f"{name:<16} {description}")
        return
    name = scenario or demos.DEFAULT
    if name not in demos.DEMOS:
        raise UserError(f"no demo scenario {name!r}; choose one of: {', '.join(demos.DEMOS)}")
    from lossguard.probe.launch import job_env
    from lossguard.probe.preflight import MissingPiece, check_job_stack

    env = job_env(None)
    try:
        check_job_stack("the demo", env=env)
    except MissingPiece as exc:
        raise UserError(str(exc)) from None
    warn_stale_build_locks(env)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="lossguard-demo-"))
    from lossguard.demo_flow import run_demo
    from lossguard.probe.job import stop_jobs_on_signals
    from lossguard.sources.base import SourceError

    try:
        with stop_jobs_on_signals():  # a killed demo stops its ranks too, not just itself
            code = run_demo(demos.DEMOS[name], out)
        sys.exit(code)
    except SourceError as exc:  # a demo job that crashed before logging: say what the log says
        raise UserError(f"the demo run left nothing to diagnose: {exc}; its output is under {out}") from None
