"""`lossguard lint`, `lossguard rules`, `lossguard env`: thin shells over `lossguard.lint`."""

from __future__ import annotations

import sys
from typing import Any

import click

from lossguard.cli.errors import UserError

_FAIL_ON = ("info", "warning", "error", "critical", "never")


def _split(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _gather_args(training_args: str | None, cmd: str | None, trust_pickle: bool,
                 world_size: int | None) -> dict[str, Any] | None:
    from lossguard.lint.args import ArgsError, load_args_file, parse_command

    args: dict[str, Any] | None = None
    try:
        if training_args:
            args = load_args_file(training_args, trust_pickle=trust_pickle)
        if cmd:
            from_cmd = parse_command(cmd, trust_pickle=trust_pickle)
            if args:  # the file names the framework; the command adds the launch facts
                from_cmd = {k: v for k, v in from_cmd.items() if k not in ("origin", "framework")}
            args = {**(args or {}), **from_cmd}
    except ArgsError as exc:
        raise UserError(str(exc)) from None
    if world_size is not None:
        args = {**(args or {"origin": "--world-size", "framework": "hf"}), "world_size": world_size}
    return args


def _versions(env_file: str | None) -> dict[str, str]:
    from lossguard.lint.env import EnvFileError, installed_versions, versions_from_file

    if env_file is None:
        return installed_versions()
    try:
        return versions_from_file(env_file)
    except EnvFileError as exc:
        raise UserError(str(exc)) from None


@click.command("lint")
@click.argument("config", required=False, type=click.Path(dir_okay=True))
@click.option("--training-args", "training_args", metavar="FILE",
              help="TrainingArguments as JSON/YAML (HF dump, LLaMA-Factory or axolotl YAML) or training_args.bin.")
@click.option("--cmd", metavar="'LAUNCH COMMAND'", help="The launch command: deepspeed / torchrun / accelerate launch ...")
@click.option("--env", "env_file", metavar="FILE", help="`pip freeze` or `lossguard env` output (default: installed packages).")
@click.option("--world-size", type=click.IntRange(min=1), help="Number of ranks, when the command does not tell.")
@click.option("--trust-pickle", is_flag=True, help="Allow reading training_args.bin (unpickling runs code).")
@click.option("--fix", "do_fix", is_flag=True, help="Apply safe fixes to the config file.")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply fixes that change memory use or numerics.")
@click.option("-o", "--output", metavar="FILE", help="Write the fixed config here instead of over CONFIG.")
@click.option("--format", "fmt", type=click.Choice(["human", "json", "sarif", "github"]), default="human",
              show_default=True)
@click.option("--select", multiple=True, metavar="CODES", help="Only these rules (code prefix or name; repeat or comma-separate).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Skip these rules (code prefix or name).")
@click.option("--fail-on", type=click.Choice(_FAIL_ON), default="warning", show_default=True,
              help="Exit 1 when a finding has at least this severity.")
@click.option("--deepspeed-schema", is_flag=True, help="Also validate with the installed DeepSpeed (imports torch: slow).")
@click.option("--show", "show", type=click.Choice(["info"]), default=None,
              help="List info findings in the human report (by default they are summarised in one line).")
def lint(config: str | None, training_args: str | None, cmd: str | None, env_file: str | None, world_size: int | None,
         trust_pickle: bool, do_fix: bool, unsafe_fixes: bool, output: str | None, fmt: str,
         select: tuple[str, ...], ignore: tuple[str, ...], fail_on: str, deepspeed_schema: bool,
         show: str | None) -> None:
    """Check a DeepSpeed config (JSON/YAML) with its training arguments and package versions.

    \b
    Exit codes: 0 no finding at or above --fail-on (default: warning), 1 findings, 2 bad input.
    Examples:
      lossguard lint ds_zero2.json --cmd "deepspeed --num_gpus 8 train.py --deepspeed ds_zero2.json --bf16 True"
      lossguard lint ds_zero2.json --env pip-freeze.txt --fix
    """
    import contextlib

    from lossguard.lint.api import lint_context, run_rules
    from lossguard.lint.quiet import stdout_to_stderr
    from lossguard.lint.report import render, summary

    route, args = _inputs(config, training_args, cmd, trust_pickle, world_size)
    doc, config = route.doc, route.doc.source
    fsdp = _fsdp_view(route, args)
    versions, origin = _versions(env_file), f"--env {env_file}" if env_file else "installed"
    sel, ign = _split(select), _split(ignore)
    options = {"deepspeed_schema": deepspeed_schema, "route_unread": route.unread, "other_versions": True,
               "version_origin": origin}
    if not env_file and not versions.get("deepspeed") and fsdp is None:
        click.echo("lossguard: DeepSpeed is not installed here, so version-window rules assume no release; run "
                   "`pip freeze > cluster-freeze.txt` where the job runs and pass --env cluster-freeze.txt", err=True)
    # Machine-readable stdout is only the report: whatever a dependency prints while rules run goes to stderr.
    guard = stdout_to_stderr() if fmt != "human" else contextlib.nullcontext()
    with guard:
        if (do_fix or unsafe_fixes) and route.synthesized:
            click.echo(f"lossguard: nothing to fix in a file: {route.how}; fix the keys by hand", err=True)
        elif do_fix or unsafe_fixes:
            doc = _apply_fixes(doc, config, output, args, versions, options, unsafe_fixes, sel, ign)
        ctx = lint_context(doc.data, args, versions, source=config, options=options)
        ctx.fsdp = fsdp  # already read (a bad value was exit 2 above)
        findings = run_rules(ctx, sel, ign)
    lines = {id(f): _line(doc, f.location) if not route.synthesized else None for f in findings}
    color = fmt == "human" and sys.stdout.isatty()
    text = render(findings, fmt, route.shown, lines, color=color, show_info=show == "info",
                  versions=(versions, origin))
    click.echo(text, nl=False)
    if fmt != "human" and findings:
        click.echo(f"lossguard: {summary(findings)}", err=True)
    _exit_for(findings, fail_on)


def _fsdp_view(route: Any, args: dict[str, Any] | None) -> Any:
    """The FSDP setup the route reaches (or the Trainer's --fsdp arguments); a value of the wrong type is exit 2."""
    from lossguard.lint.api import fsdp_view
    from lossguard.lint.document import ConfigError

    try:
        return fsdp_view(route.doc.data, args, route.shown)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def _exit_for(findings: list[Any], fail_on: str) -> None:
    if fail_on != "never":
        from lossguard.core.findings import Severity

        threshold = Severity.parse(fail_on)
        if any(f.severity >= threshold for f in findings):
            sys.exit(1)


def _inputs(config: str | None, training_args: str | None, cmd: str | None, trust_pickle: bool,
            world_size: int | None) -> tuple[Any, dict[str, Any] | None]:
    """The route to the DeepSpeed config and the training arguments (a training YAML CONFIG is both)."""
    args = _gather_args(training_args, cmd, trust_pickle, world_size)
    route = _route(config, args)
    for warning in route.doc.warnings:
        click.echo(f"lossguard: warning: {warning}", err=True)
    if route.args_file and not training_args:
        args = _merge(_gather_args(route.args_file, None, trust_pickle, None), args)
    return route, _merge(route.launch or None, args)


def _route(config: str | None, args: dict[str, Any] | None) -> Any:
    """The DeepSpeed config behind CONFIG (or named by --cmd), with how it was reached on stderr."""
    from lossguard.lint.document import ConfigError
    from lossguard.lint.routes import accelerate_launch, check_recognised, from_command, open_route

    try:
        if config:  # the same resolver as `analyze --config` and `probe`; lint alone checks past an unread file
            route = open_route(config, allow_unread=True, allow_fsdp=True)
        else:
            route = from_command(args, (args or {}).get("accelerate_config"))
            if route is None and _trainer_fsdp(args):
                route = _args_route(args)
            if route is None:
                raise UserError("lint: no config given; pass CONFIG, or --cmd with --deepspeed FILE or "
                                "`accelerate launch --config_file FILE`")
            check_recognised(route, route.doc.source)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if route.how != "DeepSpeed config":
        click.echo(f"lossguard: reading {route.how}", err=True)
    named = (args or {}).get("accelerate_config")
    if config and named and not route.launch:  # CONFIG given: the YAML the command names still sets the launch
        try:
            route.launch = accelerate_launch(named)
        except ConfigError as exc:
            click.echo(f"lossguard: warning: {exc}", err=True)
    return route


def _trainer_fsdp(args: dict[str, Any] | None) -> bool:
    from lossguard.lint.document import ConfigError
    from lossguard.lint.fsdp import from_args

    try:
        return from_args(args) is not None
    except ConfigError:  # a bad value is reported when the view is read (exit 2, naming the key)
        return True


def _args_route(args: dict[str, Any]) -> Any:
    """No config file: the Trainer's --fsdp / --fsdp_config arguments are the FSDP setup."""
    from lossguard.lint.document import Document
    from lossguard.lint.routes import Route

    origin = str(args.get("origin", "training arguments"))
    return Route(doc=Document(text="", fmt="json", data={}, source=origin), how=f"FSDP: the Trainer's --fsdp in {origin}",
                 fsdp="trainer")


def _line(doc: Any, location: str | None) -> int | None:
    if not location or location.startswith(("args.", "env.")):
        return None
    return doc.line_of(tuple(location.split(".")))


def _merge(low: dict[str, Any] | None, high: dict[str, Any] | None) -> dict[str, Any] | None:
    """`high` wins; launch facts alone keep the origin of whichever side has one."""
    if not low:
        return high
    if not high:
        return {"origin": "config route", "framework": "hf", **low}
    return {**low, **high}


def _apply_fixes(doc: Any, config: str, output: str | None, args: dict[str, Any] | None, versions: dict[str, str],
                 options: dict[str, Any], unsafe: bool, sel: list[str], ign: list[str]) -> Any:
    """Run the fix loop, write the fixed config, and return the fixed document to lint again."""
    from lossguard.lint.api import fix_document
    from lossguard.lint.document import parse_text

    result = fix_document(doc, {"training_args": args, "env": versions, "options": options},
                          unsafe=unsafe, select=sel, ignore=ign)
    for warning in result.warnings:
        click.echo(f"lossguard: warning: {warning}", err=True)
    target = output or config
    if result.applied or output:
        try:
            with open(target, "w", encoding="utf-8") as fh:
                fh.write(result.text)
        except OSError as exc:
            raise UserError(f"{target}: cannot write the fixed config ({exc.strerror})") from None
    codes = ", ".join(sorted({f.code for f in result.applied})) or "none"
    click.echo(f"lossguard: applied {len(result.applied)} fix(es) ({codes}); wrote {target}"
               if result.applied or output else "lossguard: nothing to fix", err=True)
    return parse_text(result.text, doc.source, doc.fmt)


@click.command("rules")
@click.option("--format", "fmt", type=click.Choice(["human", "json", "markdown"]), default="human", show_default=True)
def rules(fmt: str) -> None:
    """List every lint rule: code, name, severity, fix kind, summary."""
    import json

    from lossguard.lint.catalog import rule_table, rules_markdown

    rows = rule_table()
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    elif fmt == "markdown":
        click.echo(rules_markdown(rows), nl=False)
    else:
        width = max(len(r["name"]) for r in rows)
        fix_width = max(len(r["fix"]) for r in rows)
        for r in rows:
            click.echo(f"{r['code']}  {r['name']:<{width}}  {r['severity']:<8} {r['fix']:<{fix_width}}  {r['summary']}")


@click.command("env")
@click.option("--no-cuda", is_flag=True, help="Do not import torch to read CUDA/GPU details.")
def env(no_cuda: bool) -> None:
    """Print package versions (and CUDA/GPU when torch is installed) to paste into an issue."""
    from lossguard.lint.env import env_report

    click.echo(env_report(with_cuda=not no_cuda), nl=False)
