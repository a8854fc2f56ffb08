"""User-facing errors: what, where, the value, the next step. Exit code 2, no traceback."""

from __future__ import annotations

import click


class UserError(click.ClickException):
    exit_code = 2

    def format_message(self) -> str:
        return self.message

    def show(self, file=None) -> None:  # one clean line on stderr, no "Error:" prefix noise
        click.echo(f"lossguard: {self.format_message()}", err=True)
