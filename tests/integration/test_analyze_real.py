"""`lossguard analyze` on logs of real runs (tests/fixtures/real, made by scripts/make_fixtures.py:
tiny GPT-2 / VLM, real DeepSpeed 0.19 + transformers 5 Trainer, two ranks on CPU).

The expected signature and onset come from each scenario's definition (meta.json), not from lossguard.
Every file of a run is analyzed on its own: the stdout log, trainer_state.json and the TensorBoard events.
"""

import json

import pytest

from lossguard.api import analyze
from tests.conftest import FIXTURES

REAL = FIXTURES / "real"
# What a file cannot show: TensorBoard is written by rank 0 alone, so per-rank weights are not in it.
CANNOT_SHOW = {("rank-perturbed", "tb")}


def _cases():
    for run in sorted(p for p in REAL.iterdir() if (p / "meta.json").exists()):
        for name in ("stdout.log", "trainer_state.json", "tb"):
            if (run / name).exists() and (run.name, name) not in CANNOT_SHOW:
                yield pytest.param(run, name, id=f"{run.name}/{name}")


@pytest.mark.parametrize("run, name", list(_cases()))
def test_real_run_verdict_signature_onset(run, name):
    meta = json.loads((run / "meta.json").read_text())
    signature, onset = meta["expected_signature"], meta["expected_onset_step"]
    d = analyze([run / name])
    if signature is None:
        assert (d.verdict, d.signature) == ("healthy", None), [f.message for f in d.findings]
        return
    assert d.signature == signature, [f.message for f in d.findings]
    if signature == "memorization":
        assert d.verdict in ("healthy", "warning")  # never call a memorising run broken
        if run.name == "label-leakage":
            # Its eval loss stays at a quarter of where training began while the training loss vanishes:
            # held-out data is not predicted as well as training data, which is what a leak would do, so the
            # log alone shows no leak and leakage is never called likely from it (the probe proves the leak).
            assert all(c.id != "label-leakage" or c.likelihood != "likely" for c in d.causes)
    else:
        assert d.verdict == "broken"
        assert d.onset_step == onset


def test_whole_run_directory_counts_each_step_once():
    run = REAL / "bf16-nan"
    d = analyze([run])
    state = json.loads((run / "trainer_state.json").read_text())
    num_logs = sum(1 for row in state["log_history"] if "loss" in row)
    assert d.result.stats.num_train == num_logs
    assert (d.signature, d.onset_step) == ("nonfinite-hidden", 8)
    assert len(d.inputs) == 4  # stdout.log, trainer_state.json and both TensorBoard files were read


def test_no_healthy_run_is_called_broken_by_any_file():
    for run in REAL.iterdir():
        meta_path = run / "meta.json"
        if not meta_path.exists() or json.loads(meta_path.read_text())["expected_signature"] is not None:
            continue
        for name in ("stdout.log", "trainer_state.json", "tb"):
            if (run / name).exists():
                assert analyze([run / name]).verdict == "healthy", (run.name, name)
