"""`Guard` in a plain single-process PyTorch loop, the webhook against a local HTTP server, options."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

torch = pytest.importorskip("torch")

from lossguard.monitor.guard import Guard, LossguardHalt  # noqa: E402
from lossguard.monitor.options import GuardOptions, OptionError  # noqa: E402


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, ids, labels):
        logits = self.head(self.emb(ids))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 16), labels[:, 1:].reshape(-1))


def _loop(guard, model, opt, poison_at=None, steps=6):
    torch.manual_seed(0)
    for step in range(1, steps + 1):
        ids = torch.randint(0, 16, (4, 8))
        loss = model(ids, ids)
        if step == poison_at:
            loss = loss * float("nan")
        loss.backward()
        opt.step()
        guard.step(loss=loss, batch={"labels": ids})
        opt.zero_grad()


def test_guard_halts_plain_loop_at_the_nan_step(tmp_path):
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(model, opt, events_dir=tmp_path, halt_on="error", console=False)
    with pytest.raises(LossguardHalt) as info:
        _loop(guard, model, opt, poison_at=3)
    assert info.value.step == 3
    guard.close()
    lines = [json.loads(x) for x in (tmp_path / "events-rank0.jsonl").read_text().splitlines()]
    assert lines[0]["format"] == "lossguard-events"
    assert any(x["type"] == "finding" and x["signature"] == "nonfinite" and x["step"] == 3 for x in lines)


def test_guard_healthy_loop_is_quiet(tmp_path):
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Guard(model, opt, events_dir=tmp_path, halt_on="warning", console=False, fingerprint_every=1) as guard:
        _loop(guard, model, opt)
        assert [f for f in guard.monitor._emitted if f.severity > 10] == []


def test_webhook_posts_slack_json_off_thread():
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        model = _Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        guard = Guard(model, opt, halt_on="critical", console=False,
                      webhook_url=f"http://127.0.0.1:{server.server_port}/hook")
        with pytest.raises(LossguardHalt):
            _loop(guard, model, opt, poison_at=2)
        guard.close()
    finally:
        server.shutdown()
    texts = [r["text"] for r in received]
    assert any("nonfinite" in t for t in texts) and any("halting at step 2" in t for t in texts)


def test_options_validated_once_with_the_bad_value():
    with pytest.raises(OptionError, match="halt_on='sometimes'"):
        GuardOptions(halt_on="sometimes")
    with pytest.raises(OptionError, match="fingerprint_every"):
        GuardOptions(fingerprint_every=-1)
    assert GuardOptions(halt_on=["broken", "rank-desync", "LOSS001"]).halt_on


def test_a_loss_given_as_a_python_number_is_measured(tmp_path):
    """`guard.step(loss=loss.item())` is common in hand-written loops: the number is the raw loss, and a
    NaN given that way still halts the run."""
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(model, opt, events_dir=tmp_path, halt_on="error", console=False)
    with pytest.raises(LossguardHalt) as halted:
        for step in range(1, 7):
            ids = torch.randint(0, 16, (4, 8))
            loss = model(ids, ids)
            loss.backward()
            opt.step()
            guard.step(loss=float("nan") if step == 4 else loss.item(), batch={"labels": ids})
            opt.zero_grad()
    assert halted.value.step == 4
    guard.close()
    lines = [json.loads(x) for x in (tmp_path / "events-rank0.jsonl").read_text().splitlines()]
    assert not [x for x in lines if x.get("event") == "internal-error"]
    losses = [x["signals"]["raw_loss"] for x in lines if x.get("kind") == "train" and "raw_loss" in x.get("signals", {})]
    assert len(losses) >= 3


def test_analysis_switched_off_makes_the_verdict_incomplete(tmp_path):
    """A loss the guard cannot read (here a string) switches its analysis off on every rank; training goes
    on. Read back, the run is never a clean 'healthy': the verdict is at least a warning and says why."""
    from lossguard.api import analyze

    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Guard(model, opt, events_dir=tmp_path, halt_on="error", console=False) as guard:
        for step in range(1, 7):
            ids = torch.randint(0, 16, (4, 8))
            loss = model(ids, ids)
            loss.backward()
            opt.step()
            guard.step(loss="not a loss" if step == 3 else loss, batch={"labels": ids})
            opt.zero_grad()
    assert guard.monitor.disabled
    diagnosis = analyze([tmp_path])
    assert diagnosis.verdict == "warning"
    assert any("live guard stopped analysing at step 3" in why for why in diagnosis.incomplete)
    assert "SRC001" in [f.code for f in diagnosis.findings]
