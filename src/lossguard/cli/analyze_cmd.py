"""`lossguard analyze PATH...`"""

from __future__ import annotations

import gc
import sys

import click

from lossguard.cli.errors import UserError
from lossguard.cli.options import fail_on_option, load_known_facts, should_fail


@click.command("analyze")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True,
              help="json: one object with verdict, signature, onset_step, causes (id, confidence, evidence, "
                   "against, fix, decided_by), deciding_facts, findings, facts, stats, inputs, incomplete and "
                   "inputs_skipped (docs/analyze.md, 'The JSON report').")
@fail_on_option
@click.option("--config", "ds_config", type=click.Path(dir_okay=False),
              help="The run's DeepSpeed config (JSON/YAML), or the accelerate / LLaMA-Factory / axolotl YAML that "
                   "names it (read as `lint` reads it): joins its settings into the diagnosis.")
@click.option("--env", "env_file", type=click.Path(dir_okay=False),
              help="`pip freeze` or `lossguard env` output of the run's environment.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Also write an HTML report here.")
def analyze(paths: tuple[str, ...], fmt: str, fail_on: str, ds_config: str | None, env_file: str | None,
            html_path: str | None) -> None:
    """Diagnose training logs: verdict, failure signature, onset step, ranked causes and fixes.

    PATHS are stdout logs, trainer_state.json, TensorBoard event files, JSONL/CSV logs, output
    directories (checkpoint-* handled), a lossguard events directory, MLflow stores (mlruns/, mlflow.db;
    mlflow.db#RUN for one run) and W&B runs (wandb/, offline-run-*/), or - for stdin.
    """
    from lossguard.api import analyze as run_analysis
    from lossguard.sources.base import SourceError

    facts = load_known_facts(ds_config, env_file)
    # A big log makes hundreds of thousands of short-lived records; the cyclic collector would keep
    # re-scanning the modules and objects loaded so far. This process exits after one analysis.
    gc.freeze()
    try:
        diagnosis = run_analysis(paths, facts=facts)
    except SourceError as exc:
        raise UserError(str(exc)) from None
    for note in getattr(getattr(diagnosis, "gathering", None), "notes", []):  # which run of a store was read
        click.echo(f"lossguard: {note}", err=True)
    if fmt == "json":
        from lossguard.report.json_report import write_json

        write_json(_with_gathering(diagnosis), sys.stdout)
    else:
        from lossguard.report.terminal import render

        render(diagnosis)
        _echo_gathering(diagnosis)
    if html_path:
        from lossguard.report.html import write_html

        write_html(diagnosis, html_path)
        if fmt != "json":
            click.echo(f"HTML report: {html_path}")
    if should_fail(diagnosis.findings, fail_on):
        sys.exit(1)


def _with_gathering(diagnosis) -> dict:
    """The JSON contract plus what the gatherer did: `incomplete` (reasons; [] when everything was read)
    and `inputs_skipped` (path: why). The verdict values stay healthy / warning / broken."""
    out = diagnosis.to_dict()
    out["incomplete"] = list(diagnosis.incomplete)
    gathering = diagnosis.gathering
    out["inputs_skipped"] = list(gathering.skipped) if gathering is not None else []
    return out


def _echo_gathering(diagnosis) -> None:
    """Which files of a directory were read and which were left out, and why (one file: nothing to say)."""
    gathering = diagnosis.gathering
    if gathering is None or (len(gathering.used) <= 1 and not gathering.skipped and not gathering.unread):
        return
    click.echo("inputs")
    for line in gathering.used:
        click.echo(f"  read     {line}")
    for line in gathering.unread:
        click.echo(f"  not read {line}")
    for line in gathering.skipped:
        click.echo(f"  skipped  {line}")
