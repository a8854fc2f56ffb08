"""`lossguard explain [ID]`"""

from __future__ import annotations

import click

from lossguard.cli.errors import UserError


@click.command("explain")
@click.argument("topic", required=False)
def explain(topic: str | None) -> None:
    """Explain a signature id (nonfinite-hidden, ...), a detector code (LOSS002), a lint rule, or `formats`.

    Without TOPIC, list everything that can be explained.
    """
    from lossguard import explain as docs

    if topic is None:
        for key, meaning in docs.topics():
            click.echo(f"{key:<22} {meaning}")
        return
    text = docs.explain(topic)
    if text is None:
        raise UserError(f"nothing called {topic!r}; run `lossguard explain` for the list")
    click.echo(text)
