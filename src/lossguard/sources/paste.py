"""What pasting a file into a GitHub issue wraps around it, taken off again.

A user who pastes a trainer_state.json into an issue often quotes it (`> ` before every line) or folds it
(`<details><summary>log</summary>` ... `</details>`), with a markdown fence inside. A line-oriented log
reads the same through these (its readers look for metric lines anywhere), but a JSON document means
something only whole: its quote markers and fold tags must go before it is decoded.
"""

from __future__ import annotations

import re

_FOLD_TAG = re.compile(r"^\s*(?:</?details[^>]*>\s*|<summary>.*?</summary>\s*|</?summary>\s*)+$", re.IGNORECASE)
_QUOTE = re.compile(r"^\s*> ?")


def unwrap(text: str) -> str:
    """`text` without blockquote markers when every non-blank line carries one, without fold tags (a line
    holding only `<details>`, `<summary>...</summary>` and `</details>` tags), and without the markdown fence
    around it. Text with none of them comes back as it was."""
    lines = text.splitlines()
    filled = [line for line in lines if line.strip()]
    if filled and all(_QUOTE.match(line) for line in filled):
        lines = [_QUOTE.sub("", line, count=1) for line in lines]
    return unfence("\n".join(line for line in lines if not _FOLD_TAG.match(line)))


def unfence(text: str) -> str:
    """The text inside a markdown code fence (```json ... ```), or the text as it was."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    return stripped
