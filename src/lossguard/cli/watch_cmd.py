"""`lossguard watch [OPTIONS] -- COMMAND ...`"""

from __future__ import annotations

import sys

import click

from lossguard.cli.errors import UserError
from lossguard.cli.options import warn_stale_build_locks


@click.command("watch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--halt-on", type=click.Choice(["broken", "warning"]), default=None,
              help="Stop the command when the live verdict reaches this level. Default: only report.")
@click.option("--grace", "grace_s", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds between SIGINT and SIGTERM, and between SIGTERM and SIGKILL, when stopping.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Write report.json (the `analyze --format json` contract), report.html and watch.log here.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="Write the command's stdout and stderr lines here (default: DIR/watch.log with --report).")
@click.option("--buffered", is_flag=True,
              help="Leave the command's Python output buffering alone (default: PYTHONUNBUFFERED=1 so lines "
                   "arrive as they are printed).")
@click.option("--attach", is_flag=True,
              help="Attach the live guard inside the command without code changes: deepspeed.initialize and "
                   "transformers.Trainer are hooked at import (per-rank events in DIR/events with --report).")
@click.option("--recover", is_flag=True,
              help="With --attach: the attached guard recovers in place (recover=True): a step whose loss is "
                   "non-finite on any rank, whose labels are all masked, or whose loss jumps far above the "
                   "run's spread is held on every rank (replayed where it can be) instead of applied; each "
                   "recovery is in DIR/events and `analyze`.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing of our own unless something is found.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def watch(halt_on: str | None, grace_s: float, report_dir: str | None, log_path: str | None, buffered: bool,
          attach: bool, recover: bool, quiet: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND, pass its output through unchanged, diagnose it live, and stop it if it dies.

    The command runs in its own process group; stdout and stderr pass through byte for byte (colours,
    tqdm bars) while every line goes through the same parsers and detectors as `analyze`. A finding
    prints a banner on stderr between the command's lines. With --halt-on the command's process group
    gets SIGINT, then SIGTERM after --grace seconds, then SIGKILL. Ctrl-C is forwarded the same way
    (again to escalate).

    \b
    Exit status:
      the command's own    it ran to the end (or was stopped by you): its exit code,
                           128+N when a signal N killed it, as a shell reports it
      3                    lossguard stopped it (--halt-on reached)
      2                    bad usage of lossguard watch (no command, a bad option,
                           a report directory that cannot be written)
      126 / 127            the command cannot be executed / was not found

    \b
    Example:
      lossguard watch --halt-on broken --report out/ -- torchrun --nproc_per_node 2 train.py
    """
    from lossguard.watch import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND
    from lossguard.watch import watch as run_watch

    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UserError("watch: no command given; usage: lossguard watch [OPTIONS] -- COMMAND ...")
    if recover and not attach:
        raise UserError("watch: --recover needs --attach (recovery runs inside the job, in the attached guard); "
                        "usage: lossguard watch --attach --recover [--report DIR] -- COMMAND ...")
    env = None
    if attach:
        import os

        from lossguard.monitor.autoattach import child_env

        env = child_env(events_dir=os.path.join(report_dir, "events") if report_dir else None, recover=recover)
        _check_attachable(argv, env)
    warn_stale_build_locks(env)
    try:
        result = run_watch(argv, halt_on=halt_on, grace_s=grace_s, report_dir=report_dir, log_path=log_path,
                           unbuffered=not buffered, env=env)
    except FileNotFoundError as exc:
        if exc.filename not in (None, argv[0]):
            raise UserError(f"watch: cannot write {exc.filename} ({exc.strerror})") from None
        click.echo(f"lossguard: watch: {argv[0]}: command not found", err=True)
        sys.exit(EXIT_NOT_FOUND)
    except PermissionError as exc:
        if exc.filename not in (None, argv[0]):
            raise UserError(f"watch: cannot write {exc.filename} ({exc.strerror})") from None
        click.echo(f"lossguard: watch: {argv[0]}: permission denied (not executable)", err=True)
        sys.exit(EXIT_NOT_EXECUTABLE)
    _summary(result, quiet, attach)
    sys.exit(result.exit_code)


def _check_attachable(argv: list[str], env: dict[str, str]) -> None:
    """--attach: the command's python must import torch and lossguard, or the guard never attaches and the
    run looks watched when it is not. Said before the job starts; a command whose python cannot be told
    (a shell script) is not checked."""
    from lossguard.probe.preflight import MissingPiece, check_job_stack, interpreter_of

    python = interpreter_of(argv, env)
    if python is None:
        return
    try:
        check_job_stack("watch --attach", python=python, env=env, modules=("torch",))
    except MissingPiece as exc:
        raise UserError(str(exc)) from None


def _saw_training(diagnosis) -> bool:
    stats = diagnosis.result.stats
    return bool(stats.num_train or stats.num_eval or any(stats.events.get(name) for name in
                                                         ("overflow", "scale-at-minimum", "nonfinite-detected")))


def _summary(result, quiet: bool, attach: bool = False) -> None:
    from rich.console import Console

    diagnosis, outcome = result.diagnosis, result.outcome
    console = Console(stderr=True, highlight=False)
    quiet_healthy = quiet and diagnosis.verdict == "healthy" and not diagnosis.findings
    if outcome.ended_mid_line and not quiet_healthy:
        console.file.write("\n")  # the command's last line (a tqdm bar) had no newline: ours start below it
    if diagnosis.verdict == "healthy" and not diagnosis.findings and outcome.analysis_error is None:
        if not _saw_training(diagnosis):  # nothing was checked: never "healthy"
            hint = "" if attach else ", or use --attach"
            console.print("[yellow]lossguard watch: no training metrics seen in the command's output; nothing "
                          f"was checked (print the Trainer's logs to stdout{hint})[/yellow]")
        elif not quiet:
            where = f"; report: {result.report_paths[0].parent}" if result.report_paths else ""
            console.print(f"[dim]lossguard watch: healthy, {diagnosis.result.stats.num_train} training logs, "
                          f"no failure signature{where}[/dim]")
        return
    from lossguard.report.terminal import render

    console.rule("lossguard watch report", style="dim")
    render(diagnosis, console)
    if outcome.halted:
        signals = ", ".join(f"{s.signal} at {s.after_s:g}s" for s in outcome.signals)
        console.print(f"[bold]stopped by lossguard[/bold] at output line {outcome.halt_line} "
                      f"(step {outcome.halt_step}): {signals}; exit status 3")
    if outcome.leftovers:
        console.print(f"[red]processes still alive in the command's group after SIGKILL: {outcome.leftovers}")
    for path in result.report_paths:
        console.print(f"[dim]report: {path}[/dim]")
