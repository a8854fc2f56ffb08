"""`lossguard probe CONFIG [--arms auto|FILE] [--cmd "... {config}"] [--report DIR]`"""

from __future__ import annotations

import json
import sys

import click

from lossguard.cli.errors import UserError
from lossguard.cli.options import warn_stale_build_locks


@click.command("probe")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--arms", default="auto", show_default=True,
              help="`auto` (your config + lint fixes + known prevention defaults) or a JSON/YAML file: a list of "
                   "{name, changes: {dotted.key: value}} (null deletes a key).")
@click.option("--cmd", default=None,
              help="Your launch command with {config} where the arm's DeepSpeed config goes (and optionally "
                   "{steps}), e.g. \"torchrun --nproc_per_node 2 train.py --deepspeed_config {config}\". "
                   "Default: the built-in tiny model.")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Steps per arm (built-in model: default 20; --cmd: fills {steps}).")
@click.option("--nproc", type=click.IntRange(min=1), default=2, show_default=True,
              help="Ranks for the built-in model (--cmd: your launcher decides).")
@click.option("--workload", default="healthy-raw", show_default=True,
              help="Zoo scenario used as the built-in job (e.g. bf16-nan-raw injects an inf loss at step 8).")
@click.option("--parallel", is_flag=True, help="Run the arms at the same time (when the machine has room).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds per arm before its process group is killed.")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Runs of every dying arm and of the fix candidate (default 2): a fate that differs between "
                   "runs is reported as unstable, never as proof.")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Loss agreement tolerance (absolute).")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Loss agreement tolerance (relative).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Write per-arm logs and events, report.json, report.html and recommended_config.json here.")
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
def probe(config: str, arms: str, cmd: str | None, steps: int | None, nproc: int, workload: str, parallel: bool,
          timeout_s: float, repeats: int | None, atol: float | None, rtol: float | None, report_dir: str | None,
          fmt: str) -> None:
    """Run the same job under several config arms and show which one survives.

    \b
    Exit status: 0 a fix was proven or the baseline survives, 1 the baseline dies and no fix is
    proven, 2 bad input (missing config, bad arms file, --cmd without {config}, an "auto" value
    probe cannot fill) or every arm crashed before its first step (the crash's error line is shown).

    \b
    Examples:
      lossguard probe ds_zero2.json
      lossguard probe ds.json --cmd "torchrun --nproc_per_node 2 train.py --deepspeed_config {config}" --report out/
    """
    from lossguard.probe.api import REPEATS, ProbeInputError
    from lossguard.probe.api import probe as run_probe
    from lossguard.probe.compare import ATOL, RTOL
    from lossguard.probe.job import stop_jobs_on_signals

    warn_stale_build_locks()
    try:
        with stop_jobs_on_signals():  # a killed `lossguard probe` stops its arms' ranks too
            result = run_probe(config, arms=arms, cmd=cmd, steps=steps, nproc=nproc, workload=workload,
                               report_dir=report_dir, parallel=parallel, timeout_s=timeout_s,
                               repeats=REPEATS if repeats is None else repeats,
                               atol=ATOL if atol is None else atol, rtol=RTOL if rtol is None else rtol)
    except ProbeInputError as exc:
        raise UserError(f"probe: {exc}") from None
    except FileNotFoundError as exc:
        raise UserError(f"probe: cannot start the job: {exc.filename}: not found") from None
    if fmt == "json":
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        from rich.console import Console

        from lossguard.probe.report import render_terminal

        render_terminal(result, Console(highlight=False))
    sys.exit(result.exit_code)
