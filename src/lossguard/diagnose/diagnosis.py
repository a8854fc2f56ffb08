"""From an engine result to the verdict the user reads first: verdict, signature, onset, causes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lossguard.core.engine import EngineResult
from lossguard.core.findings import Finding, Severity
from lossguard.diagnose.madeup import made_up_finding
from lossguard.diagnose.ranking import Cause, rank_causes
from lossguard.diagnose.signatures import PRECEDENCE, RELATED, SIGNATURES, finding_verdict
from lossguard.knowledge.conditions import RunEvidence

if TYPE_CHECKING:
    from lossguard.sources.gather import Gathering


@dataclass
class Diagnosis:
    verdict: str
    signature: str | None
    onset_step: int | None
    causes: list[Cause]
    findings: list[Finding]
    result: EngineResult
    inputs: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # why part of the input was not analysed; [] if all was
    gathering: Gathering | None = None  # the files used and skipped, when the input was gathered from paths
    # No training in what was read and nothing found in it: "healthy" would be a silently wrong answer, so
    # `analyze` refuses it (the verdict before any incompleteness made it a warning).
    nothing_to_judge: bool = False
    # Steps the live guard recovered in place (its events files' `recovery` lines), in step order.
    recoveries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if self.signature is None:
            return "no failure signature found"
        return SIGNATURES[self.signature][1]

    def to_dict(self) -> dict[str, Any]:
        stats = self.result.stats
        return {
            "verdict": self.verdict,
            "signature": self.signature,
            "onset_step": self.onset_step,
            "summary": self.summary,
            "causes": [c.to_dict() for c in self.causes],
            "deciding_facts": deciding_facts(self.causes),
            "recoveries": list(self.recoveries),
            "findings": [f.to_dict() for f in self.findings],
            "facts": self.result.facts.known(),
            "stats": {
                "train_logs": stats.num_train, "eval_logs": stats.num_eval, "first_step": stats.first_step,
                "last_step": stats.last_step, "steps_are_ordinal": stats.steps_are_ordinal,
                "events": dict(stats.events), "ranks": sorted(stats.ranks),
                "suppressed_findings": self.result.num_suppressed,
            },
            "inputs": self.inputs,
        }


# Causes that make an otherwise healthy-looking signature suspicious (verdict "warning").
SUSPICIOUS_CAUSES = {"label-leakage"}


def diagnose(result: EngineResult, inputs: list[str] | None = None, *, incomplete: list[str] | None = None,
             gathering: Gathering | None = None, recoveries: list[dict[str, Any]] | None = None) -> Diagnosis:
    """The verdict, decided once here. `incomplete` holds why part of the input was not analysed: then a
    warning-level finding says so and a healthy verdict becomes a warning (never a silent healthy).
    `recoveries`: the steps the live guard recovered, when no gathering carries them (`watch`)."""
    diagnosis = _judge(result, inputs or [])
    diagnosis.gathering = gathering
    stats = result.stats
    trained = stats.num_train or stats.num_eval or any(stats.events.get(name) for name in TRAINING_EVENTS)
    diagnosis.nothing_to_judge = not trained and diagnosis.verdict == "healthy"
    diagnosis.incomplete = list(incomplete or [])
    if diagnosis.incomplete:
        diagnosis.findings.append(Finding(
            "SRC001", "analysis-incomplete", Severity.WARNING,
            "analysis incomplete: " + "; ".join(diagnosis.incomplete) + "; the verdict covers what was read",
            data={"reasons": list(diagnosis.incomplete)}))
        if diagnosis.verdict == "healthy":
            diagnosis.verdict = "warning"
    known = gathering.recoveries if gathering is not None else recoveries or []
    diagnosis.recoveries = sorted(known, key=lambda r: r["step"])
    if diagnosis.recoveries:
        diagnosis.findings.append(recovered_finding(diagnosis.recoveries))
        if diagnosis.verdict == "healthy":  # a recovered run never reads as if nothing happened
            diagnosis.verdict = "warning"
    elif diagnosis.verdict == "healthy" and (made_up := made_up_finding(_line(result, "loss"), stats.steps_are_ordinal)):
        diagnosis.findings.append(made_up)  # a recovered run's log read alone: the NaN filter's value at the step
        diagnosis.verdict = "warning"
    return diagnosis


def sample_names(samples: list) -> str:
    """The quarantined samples of a recovery as a report shows them: `hash (index N)`, comma-separated."""
    names = [f"{s.get('hash')}" + (f" (index {s['index']})" if isinstance(s.get("index"), int) else "")
             for s in samples if isinstance(s, dict)]
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def recovered_finding(recoveries: list[dict[str, Any]]) -> Finding:
    """REC001: the live guard recovered steps in place; the run finished, but not on every batch."""
    parts = [f"step {r['step']} ({r['kind']}: {r['signature']} {r['code']} on rank(s) "
             f"{', '.join(map(str, r['ranks'])) or '?'})" for r in recoveries[:10]]
    more = f" and {len(recoveries) - 10} more" if len(recoveries) > 10 else ""
    lost = sum(r["steps_lost"] or 0 for r in recoveries)
    return Finding("REC001", "recovered", Severity.WARNING,
                   f"the live guard recovered {len(recoveries)} step(s) in place: {'; '.join(parts)}{more}; "
                   f"{lost} step(s) of data lost. The run went on, but each of these faults happened: see "
                   "`recoveries` for what was done", step=recoveries[0]["step"],
                   data={"steps": [r["step"] for r in recoveries], "steps_lost": lost})


# Events only a running optimizer step prints: a log holding only these (DeepSpeed's loss-scaler lines)
# is a training log, not "nothing to judge".
TRAINING_EVENTS = ("overflow", "scale-at-minimum", "nonfinite-detected")


def _judge(result: EngineResult, inputs: list[str]) -> Diagnosis:
    """The verdict on what was read: signature, onset and causes from the findings."""
    findings = sorted(result.findings, key=lambda f: (f.step is None, f.step or 0, -f.severity))
    primary = _primary(findings)
    if primary is None:
        verdict = "warning" if any(f.severity >= Severity.WARNING for f in findings) else "healthy"
        return Diagnosis(verdict, None, None, [], findings, result, inputs)
    signature = primary.signature
    family = {signature, *RELATED.get(signature, ())}
    onset = min((f.step for f in findings if f.signature in family and f.step is not None), default=None)
    verdict = SIGNATURES[signature][0]
    if verdict == "broken":  # the same meaning as halt_on="broken" in the guard and watch
        verdict = finding_verdict(signature, primary.severity)
    causes = rank_causes(signature, _evidence(result, findings, onset))
    if verdict == "healthy" and causes and causes[0].id in SUSPICIOUS_CAUSES and causes[0].likelihood == "likely":
        verdict = "warning"  # a tiny loss is fine, unless the evidence says the answers leak in
    return Diagnosis(verdict, signature, onset, causes, findings, result, inputs)


def _primary(findings: list[Finding]) -> Finding | None:
    candidates = [f for f in findings if f.signature in SIGNATURES and
                  (f.severity >= Severity.WARNING or SIGNATURES[f.signature][0] == "healthy")]
    if not candidates:
        return None
    # A run-killing finding (error or worse) outranks a warning whatever their signatures' precedence:
    # a few label-masking warnings must not hide the NaN that killed the run later.
    return min(candidates, key=lambda f: (f.severity < Severity.ERROR, PRECEDENCE.index(f.signature),
                                          -f.severity))


def _evidence(result: EngineResult, findings: list[Finding], onset: int | None) -> RunEvidence:
    """What the typed cause conditions read about this run."""
    facts = result.facts.known()
    if facts.get("world_size") is None and len(result.stats.ranks) > 1:
        facts["world_size"] = len(result.stats.ranks)
    measured: dict[tuple[str, str], float] = {}
    origins: dict[str, str] = {}
    ordinal = result.stats.steps_are_ordinal
    for finding in findings:
        for key, value in finding.data.items():  # e.g. LOSS007 eval_ratio
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                measured.setdefault((finding.code, key), value)
        if finding.code not in origins:
            origins[finding.code] = finding.location or _at(finding.step, ordinal)
    first = result.stats.first_step
    loss, lr, grad_norm = _line(result, "loss"), _line(result, "lr"), _line(result, "grad_norm")
    return RunEvidence(facts=facts, origins=dict(result.facts.origin), events=dict(result.stats.events),
                       fired={f.code for f in findings}, measured=measured,
                       onset_at_start=onset is not None and first is not None and onset <= first + 1,
                       event_origins=dict(result.stats.event_origins), finding_origins=origins,
                       onset_origin=_at(onset, ordinal), steady_logs_before_onset=_steady_before(result, onset),
                       columns=frozenset(signal for signal, _ in result.series.series),
                       train_losses_finite=_train_losses_finite(loss, result.stats.summary_nonfinite),
                       zero_norm_at_zero_lr=_zero_norm_at_zero_lr(lr, grad_norm),
                       grad_norm_grows=_grows_steadily(list(grad_norm.values())),
                       margins_all_zero=_all_zero(_line(result, "reward_margin")),
                       loss_at_ln2=_all_at(loss, math.log(2)),
                       no_token_scored=_zero_from_start(_line(result, "token_accuracy")))


def _line(result: EngineResult, signal: str) -> dict[int, float]:
    """A signal's logged values by step, the run-level line first, else the lowest rank's."""
    lines = sorted(((rank is not None, rank or 0), line) for (name, rank), line in result.series.series.items()
                   if name == signal)
    return dict(lines[0][1].points) if lines else {}


def _train_losses_finite(losses: dict[int, float], summary_nonfinite: bool) -> bool | None:
    """Every training loss is finite and non-zero, a run summary's included (its `train_loss` is training
    evidence though it names no step)."""
    if summary_nonfinite:
        return False
    if not losses:
        return None
    return all(math.isfinite(v) and v != 0.0 for v in losses.values())


# A steady rise: over at least this many logs, at least this share of the steps go up, and the last value is
# at least this many times the first. A sum of every gradient since the start grows so; a noisy norm does not.
_RISE_LOGS, _RISE_SHARE, _RISE_FACTOR = 8, 0.8, 3.0


def _grows_steadily(values: list[float]) -> bool | None:
    values = [v for v in values if math.isfinite(v)]
    if len(values) < _RISE_LOGS:
        return None
    ups = sum(b > a for a, b in zip(values, values[1:]))
    return ups >= _RISE_SHARE * (len(values) - 1) and values[-1] >= _RISE_FACTOR * max(values[0], 1e-12)


def _zero_from_start(line: dict[int, float]) -> bool | None:
    """The first logged value is exactly 0 and so is every one until the last (None: no such column)."""
    if not line:
        return None
    values = [line[step] for step in sorted(line)]
    return values[0] == 0.0 and all(v == 0.0 or not math.isfinite(v) for v in values)


def _all_zero(line: dict[int, float]) -> bool | None:
    return None if not line else all(v == 0.0 for v in line.values())


def _all_at(line: dict[int, float], value: float) -> bool | None:
    """Every value is `value` to four decimals (the Trainer's rounding; bf16 prints ln 2 as 0.6932)."""
    return None if len(line) < 2 else all(abs(v - value) <= 1.5e-4 for v in line.values())


_STUCK_LOGS = 3  # an LR of 0 on fewer logs can be a warmup's start


def _zero_norm_at_zero_lr(lrs: dict[int, float], norms: dict[int, float]) -> bool | None:
    beside = [norms[step] for step, lr in lrs.items() if lr == 0.0 and step in norms]
    return None if len(beside) < _STUCK_LOGS else all(norm == 0.0 for norm in beside)


# A loss spike or rise: what an unstable update looks like before a NaN.
_UNSTABLE = frozenset({"LOSS005", "LOSS006"})


def _steady_before(result: EngineResult, onset: int | None) -> int | None:
    """Finite training losses logged before the onset, when no spike or rise came before it; None when one
    did, or with no onset. (The loss series is the display series: thinned on long runs, which only lowers
    the count.)"""
    if onset is None or any(f.code in _UNSTABLE and f.step is not None and f.step <= onset
                            for f in result.findings):
        return None
    lines = [line for (signal, _), line in result.series.series.items() if signal == "loss"]
    return max((sum(1 for step, value in line.points if step < onset and math.isfinite(value) and value != 0.0)
                for line in lines), default=0)


def _at(step: int | None, ordinal: bool) -> str:
    """A step as a location in the log: the log's own step number, or the n-th log where it has none."""
    if step is None:
        return "the whole log"
    return f"log #{step}" if ordinal else f"step {step}"


def deciding_facts(causes: list[Cause]) -> list[str]:
    """What the inputs do not show and would decide between the leading candidates: the `decide` of each
    undecided cause among the first three, once each. Empty when the first cause is decided."""
    if not causes or not causes[0].undecided:
        return []
    seen: list[str] = []
    for cause in causes[:3]:
        if cause.undecided and cause.decide not in seen:
            seen.append(cause.decide)
    return seen
