"""Options and helpers shared by several commands."""

from __future__ import annotations

from pathlib import Path

import click

from lossguard.cli.errors import UserError
from lossguard.core.facts import RunFacts, facts_from_versions
from lossguard.core.findings import Finding, Severity

FAIL_ON_CHOICES = ["info", "warning", "error", "critical", "never"]

fail_on_option = click.option(
    "--fail-on", type=click.Choice(FAIL_ON_CHOICES), default="error", show_default=True,
    help="Exit 1 when a finding is at or above this severity.")


def should_fail(findings: list[Finding], fail_on: str) -> bool:
    if fail_on == "never":
        return False
    threshold = Severity.parse(fail_on)
    return any(f.severity >= threshold for f in findings)


def load_known_facts(ds_config: str | None, env_file: str | None) -> RunFacts:
    facts = RunFacts()
    if ds_config:
        facts.merge(config_facts(ds_config))
    if env_file:
        from lossguard.lint.env import EnvFileError, versions_from_file

        try:
            found = versions_from_file(env_file)
        except EnvFileError as exc:
            raise UserError(str(exc)) from None
        facts.merge(facts_from_versions(found, Path(env_file).name))
    return facts


def config_facts(path: str) -> RunFacts:
    """Facts of the config a run used, found the way `lint` finds it (an accelerate or LLaMA-Factory /
    axolotl YAML leads to its DeepSpeed config); the route taken goes to stderr, as lint says it."""
    from lossguard.lint.document import ConfigError
    from lossguard.lint.routes import open_route
    from lossguard.lint.run_config import route_facts

    try:
        route = open_route(path)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if route.how != "DeepSpeed config":
        click.echo(f"lossguard: reading {route.how}", err=True)
    return route_facts(route)


def warn_stale_build_locks(env: dict[str, str] | None = None) -> None:
    """Before a job starts: a warning line per torch extension build lock a killed build left behind (see
    `probe.preflight.stale_build_locks`); the job then waits on it forever."""
    from lossguard.probe.preflight import stale_build_locks

    for warning in stale_build_locks(env):
        click.echo(f"lossguard: warning: {warning}", err=True)
