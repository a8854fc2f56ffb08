"""`lossguard` command line: a thin shell over the public API.

Every sub-command lives in its own module and is imported only when it runs, so `lossguard lint`
never pays for torch or rich imports it does not need. Exit codes everywhere: 0 clean, 1 findings at
or above --fail-on, 2 bad usage or unreadable input.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from lossguard import __version__

# command name -> (module, attribute, one-line help). Add a command here and in its own module.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "analyze": ("lossguard.cli.analyze_cmd", "analyze", "Diagnose training logs: verdict, signature, onset, causes."),
    "watch": ("lossguard.cli.watch_cmd", "watch", "Run a training command, diagnose it live, stop it when it dies."),
    "probe": ("lossguard.cli.probe_cmd", "probe", "Run a job under several config arms and prove which fix survives."),
    "explain": ("lossguard.cli.explain_cmd", "explain", "Explain a signature id, detector code or lint rule."),
    "lint": ("lossguard.cli.lint_cmd", "lint", "Check a DeepSpeed config, training arguments and versions before a run."),
    "rules": ("lossguard.cli.lint_cmd", "rules", "List the lint rules: code, name, severity, fix, summary."),
    "env": ("lossguard.cli.lint_cmd", "env", "Print package versions and GPU facts to paste into an issue."),
    "demo": ("lossguard.cli.demo_cmd", "demo", "Run a real tiny DeepSpeed job that dies, catch it, diagnose it, run the fix, recover it."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        module_name, attr, _ = entry
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lossguard")
def cli() -> None:
    """lossguard: catch DeepSpeed / Hugging Face fine-tuning runs that die silently.

    \b
    Exit codes: 0 clean, 1 findings at or above --fail-on (probe: every arm dies), 2 bad usage or
    unreadable input. `watch` exits with its command's own code, or 3 when lossguard stopped it.
    Set LOSSGUARD_DEBUG=1 to see tracebacks.

    Start with `lossguard demo`; `lossguard explain` lists every signature, detector and rule.
    """


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="lossguard", standalone_mode=True)
    except click.exceptions.Exit as exc:  # pragma: no cover - click handles this in standalone mode
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("LOSSGUARD_DEBUG"):
            raise
        click.echo(f"lossguard: internal error: {type(exc).__name__}: {exc} (LOSSGUARD_DEBUG=1 for the traceback)", err=True)
        sys.exit(2)
