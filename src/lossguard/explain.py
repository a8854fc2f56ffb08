"""Documentation the tool can print: signature ids, detector codes, lint rules, supported formats."""

from __future__ import annotations

import inspect

from lossguard.detectors import registered
from lossguard.diagnose.catalog import CAUSES
from lossguard.diagnose.signatures import SIGNATURES

FORMATS = """\
Formats `lossguard analyze` reads (auto-detected per file; per line inside text logs, mixed allowed):
  - HF Trainer stdout: {'loss': 0.0, 'grad_norm': nan, ...} (4.x numbers) and {'loss': '4.714', ...}
    (5.x quoted strings), inside tqdm progress lines, with multi-node host prefixes (duplicates dropped),
    eval dicts and the final train_runtime dict
  - trainer_state.json (log_history, NaN literals); output directories with checkpoint-*
  - DeepSpeed lines: OVERFLOW! ... Attempted loss scale, loss scale at minimum, step=N, skipped=M, lr=[...],
    the config dump (version, zero_config, bf16/fp16, communication_data_type, world size)
  - warnings: tokenization mismatch, lr before scheduler stepped, None of the inputs have requires_grad,
    Could not find response key, Number of trainable parameters, InternVL image-token mismatch
  - TensorBoard event files (the tensorboard package's loader)
  - LLaMA-Factory trainer_log.jsonl, ms-swift JSON lines, generic JSONL / CSV with a step column
  - Megatron `iteration N/ M | lm loss: ... | loss scale: ... | grad norm: ...` lines
  - mmengine `Epoch(train) [e][i/N] lr: ... loss: ... grad_norm: ...` lines
  - lossguard's own live events directory (events-rank*.jsonl)"""


def topics() -> list[tuple[str, str]]:
    rows = [(sig, meaning) for sig, (_, meaning) in SIGNATURES.items()]
    for factory in registered():
        detector = factory()
        rows.append((detector.code, f"{detector.name} -> {detector.signature or '-'}"))
    for rule in _lint_rules():
        rows.append((rule.code, rule.name))
    rows.append(("formats", "log formats analyze reads"))
    return rows


def explain(topic: str) -> str | None:
    key = topic.strip()
    if key in SIGNATURES:
        return _signature(key)
    if key.lower() == "formats":
        return FORMATS
    for factory in registered():
        detector = factory()
        if key.upper() == detector.code or key == detector.name:
            return _detector(detector)
    for rule in _lint_rules():
        if key.upper() == rule.code or key == rule.name:
            return _rule(rule)
    return None


def _signature(sig: str) -> str:
    verdict, meaning = SIGNATURES[sig]
    if verdict == "broken":  # see diagnose(): only an error or worse kills a run
        verdict += " (warning when only warning-level findings show it)"
    lines = [f"{sig}: {meaning}", f"verdict when it is the primary signature: {verdict}", ""]
    detectors = [f() for f in registered()]
    reporters = [f"{d.code} ({d.name})" for d in detectors if d.signature == sig]
    if reporters:
        lines.append("reported by: " + ", ".join(reporters))
    causes = sorted((c for c in CAUSES if sig in c["signatures"]), key=lambda c: -c["signatures"][sig])
    if causes:
        lines.append("causes considered (prior before the run's facts are applied):")
        for cause in causes:
            lines.append(f"  - {cause['id']} ({cause['signatures'][sig]:.2f}): {cause['title']}")
            lines.append(f"      fix: {cause['fix']}")
            if cause["evidence"]:
                lines.append(f"      evidence: {' '.join(cause['evidence'])}")
    return "\n".join(lines)


def _detector(detector) -> str:
    doc = inspect.getdoc(type(detector)) or ""
    return f"{detector.code} {detector.name} (signature: {detector.signature or '-'})\n\n{doc}"


def _lint_rules() -> list:
    try:
        from lossguard.lint.rules import all_rules
    except ImportError:
        return []
    return list(all_rules())


def _rule(rule) -> str:
    lines = [f"{rule.code} {rule.name} ({rule.severity})", "", getattr(rule, "doc", "") or rule.summary]
    for link in getattr(rule, "evidence", []) or []:
        lines.append(f"evidence: {link}")
    for title, example in (getattr(rule, "examples", None) or {}).items():
        lines += ["", f"{title}:", str(example)]
    return "\n".join(lines)
