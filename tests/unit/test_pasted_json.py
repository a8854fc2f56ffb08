"""A trainer_state.json pasted into an issue the way GitHub users do it (quoted with `> `, folded in
`<details>`, fenced) reads as the same records as the file itself: a JSON document means something only
whole, so its paste markers must come off before it is decoded (a quoted file read line by line turned its
`"grad_norm": NaN` lines into a NaN loss at the wrong steps)."""

import json

import pytest

from lossguard.api import analyze
from lossguard.sources.paste import unwrap

HISTORY = [{"epoch": 0.1 * s, "grad_norm": float("nan") if s in (1, 2) else 3.0 / s,
            "learning_rate": 0.0 if s <= 2 else 1e-4, "loss": 4.0 - 0.1 * s, "step": s} for s in range(1, 31)]
STATE = json.dumps({"global_step": 30, "log_history": HISTORY}, indent=2)  # NaN as the bare literal, like HF


def _quote(text):
    return "\n".join("> " + line if line else ">" for line in text.splitlines()) + "\n"


def _fold(text):
    return "<details><summary>trainer_state.json</summary>\n\n```json\n" + text + "\n```\n\n</details>\n"


@pytest.mark.parametrize("wrap", [lambda t: t, _quote, _fold, lambda t: _quote(_fold(t))],
                         ids=["as-is", "quoted", "folded", "quoted-fold"])
def test_a_pasted_trainer_state_reads_as_the_file(tmp_path, wrap):
    plain, pasted = tmp_path / "trainer_state.json", tmp_path / "log.txt"
    plain.write_text(STATE)
    pasted.write_text(wrap(STATE))
    want, got = analyze([str(plain)]), analyze([str(pasted)])
    assert (got.verdict, got.signature) == (want.verdict, want.signature)
    assert got.to_dict()["onset_step"] == want.to_dict()["onset_step"]


def test_unwrap_leaves_a_log_without_paste_markers_alone():
    log = "{'loss': 2.3, 'learning_rate': 1e-05, 'epoch': 0.1}\n> not every line is quoted\n"
    assert unwrap(log) == log.strip()


def test_unwrap_takes_quote_markers_only_when_every_line_has_one():
    assert unwrap("> a\n>\n> b") == "a\n\nb"
    assert unwrap("> a\nb") == "> a\nb"
