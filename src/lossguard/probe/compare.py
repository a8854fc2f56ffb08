"""Judge each arm and compare them step by step. Pure: no torch import.

An arm's diagnosis comes from `lossguard.analyze` over its stdout and the guard's per-rank events. Whether it
*dies* is stricter than "the detectors found something": an arm that met one non-finite gradient, skipped
that step and trained on (the very point of `check_grad_overflow: true`) survives; an arm whose loss stays
non-finite (or hidden as 0) to the end, whose job crashed, or whose run is broken for any other signature
(masked labels, no gradient flow, divergence, ...) dies.

An arm run more than once (`settle`) has one fate only when every run had it: otherwise it is `unstable`,
and the report says how many runs died. An arm "agrees with the baseline" only when it has the baseline's
fate and its losses and grad norms stay within tolerance; a fix is an arm that survived every run of a
baseline that died every run, and that changes a setting the baseline's death blames (`probe/blame.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lossguard.probe import blame
from lossguard.probe.arms import Arm

# Signatures whose run may recover after a skipped step; the others mean the run does not learn.
TRANSIENT = {"nonfinite", "nonfinite-hidden", "fp16-overflow", "loss-spike"}

# Default agreement tolerance between arms, per step: |Δloss| <= ATOL + RTOL * |baseline loss|.
# Measured on this machine (DeepSpeed 0.19.8, torch 2.13 CPU, 2 ranks): fp32 ZeRO-1/2/3 give bit-identical
# losses and grad norms over 10 steps (max |Δ| = 0); bf16 ZeRO-3 vs ZeRO-2 differ by ~1e-4 (docs/probe.md).
ATOL = 1e-3
RTOL = 1e-3

Trajectory = dict[int, float]


@dataclass
class ArmOutcome:
    arm: Arm
    verdict: str  # "survives" or "dies"
    signature: str | None  # the diagnosis signature, "crash" / "timeout" for a job that did not finish
    onset_step: int | None
    returncode: int
    loss: Trajectory
    grad_norm: Trajectory
    note: str = ""
    diagnosis: Any = None
    run: Any = None
    first_disagreement: int | None = None  # first step where it departs from the baseline beyond tolerance
    max_abs_dloss: float | None = None  # over the steps both logged finite losses
    max_abs_dgrad: float | None = None  # the same for the grad norm
    crash: str | None = None  # the crash's own error line (the job's last exception line), when it crashed
    repeats: list[ArmOutcome] = field(default_factory=list)  # the arm's later runs, same seed (`settle`)
    agrees: bool | None = None  # same fate as the baseline and within tolerance (None for the baseline)
    blamed: bool = False  # changes a setting the baseline's death blames

    @property
    def dies(self) -> bool:
        return self.verdict == "dies"

    @property
    def runs(self) -> list[ArmOutcome]:
        return [self, *self.repeats]

    @property
    def num_deaths(self) -> int:
        return sum(r.run_verdict == "dies" for r in self.runs)

    @property
    def run_verdict(self) -> str:
        """This run's own fate (`verdict` is the fate over every run)."""
        return self._run_verdict or self.verdict

    _run_verdict: str | None = None

    @property
    def started(self) -> bool:
        """The job reached a training step (a crash before one is a job that could not start)."""
        return bool(self.loss) or (self.run is not None and getattr(self.run, "last_step", None) is not None)

    @property
    def last_step(self) -> int | None:
        return max(self.loss) if self.loss else None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.arm.name, "changes": dict(self.arm.changes), "verdict": self.verdict,
                "signature": self.signature, "onset_step": self.onset_step, "returncode": self.returncode,
                "last_step": self.last_step, "first_disagreement_step": self.first_disagreement,
                "max_abs_dloss": self.max_abs_dloss,
                "max_abs_dgrad_norm": self.max_abs_dgrad, "note": self.note, "reason": self.arm.reason,
                "diagnosis_verdict": getattr(self.diagnosis, "verdict", None), "crash": self.crash,
                "agrees_with_baseline": self.agrees, "changes_blamed_setting": self.blamed,
                "runs": [r.run_dict() for r in self.runs]}

    def run_dict(self) -> dict[str, Any]:
        return {"verdict": self.run_verdict, "signature": self.signature, "onset_step": self.onset_step,
                "returncode": self.returncode, "last_step": self.last_step, "crash": self.crash,
                "dir": None if self.run is None else str(getattr(self.run, "dir", ""))}


def trajectories(series: dict[str, dict[str, list[tuple[int, float]]]]) -> tuple[Trajectory, Trajectory]:
    """Per-step loss (mean over the rank lines; a non-finite rank makes the step non-finite) and grad norm
    (largest over lines: the global norm is the same on every rank) from a diagnosis' series."""
    loss_lines = series.get("raw_loss") or series.get("loss") or {}
    loss: dict[int, list[float]] = {}
    for points in loss_lines.values():
        for step, value in points:
            loss.setdefault(int(step), []).append(float(value))
    grad: Trajectory = {}
    for points in (series.get("grad_norm") or {}).values():
        for step, value in points:
            value = float(value)
            old = grad.get(int(step))
            grad[int(step)] = value if old is None or not math.isfinite(value) or value > old else old
    return {s: sum(v) / len(v) for s, v in sorted(loss.items())}, dict(sorted(grad.items()))


def _dead_from(loss: Trajectory) -> int | None:
    """The first step of the final run of dead losses (non-finite, or exactly 0 as the Trainer hides NaN)."""
    onset = None
    for step, value in loss.items():
        dead = not math.isfinite(value) or value == 0.0
        if dead and onset is None:
            onset = step
        elif not dead:
            onset = None
    return onset


def judge(arm: Arm, run: Any, diagnosis: Any, expected_steps: int | None = None,
          crash: str | None = None) -> ArmOutcome:
    """`expected_steps`: the step count the job was asked to run, when probe knows it (built-in workload,
    or `{steps}` in --cmd). A job that reached it with a live loss and only then exited non-zero crashed at
    shutdown (torch + gloo, or an NCCL watchdog, can abort a rank at interpreter exit): the arm survives,
    with the exit code in its note, so a teardown crash is not taken for the config killing training.
    `crash`: the job's own last error line, shown with a crash."""
    series = diagnosis.result.series.to_dict() if diagnosis is not None else {}
    loss, grad = trajectories(series)
    signature = getattr(diagnosis, "signature", None)
    onset = getattr(diagnosis, "onset_step", None)
    broken = getattr(diagnosis, "verdict", None) == "broken"
    dead_from = _dead_from(loss)
    exit_note = ""
    finished = (expected_steps is not None and run.last_step is not None and run.last_step >= expected_steps
                and bool(loss) and dead_from is None and not (broken and signature not in TRANSIENT))
    if run.returncode != 0 and not run.timed_out and finished:
        exit_note = f"the job exited {run.returncode} after its last step ({run.last_step}): a crash at shutdown"
    elif run.timed_out or run.returncode != 0:
        why = "timeout" if run.timed_out else "crash"
        note = f"job ended with {why} (exit {run.returncode})" + (f": {crash}" if crash and not run.timed_out else "")
        return ArmOutcome(arm, "dies", signature or why, onset if signature else (dead_from or run.last_step),
                          run.returncode, loss, grad, note=note, diagnosis=diagnosis, run=run,
                          crash=None if run.timed_out else crash)
    if not loss:
        return ArmOutcome(arm, "dies", signature or "no-steps", onset, run.returncode, loss, grad,
                          note="no training step was observed", diagnosis=diagnosis, run=run)
    if dead_from is not None:
        return ArmOutcome(arm, "dies", signature or "nonfinite", dead_from if onset is None else min(onset, dead_from),
                          run.returncode, loss, grad, note="loss non-finite (or hidden as 0) to the end",
                          diagnosis=diagnosis, run=run)
    if broken and signature not in TRANSIENT:
        return ArmOutcome(arm, "dies", signature, onset, run.returncode, loss, grad, diagnosis=diagnosis, run=run)
    notes = [exit_note] if exit_note else []
    if signature is not None:
        notes.append(f"{signature} at step {onset}, recovered: loss finite to the end (step {max(loss)})")
    return ArmOutcome(arm, "survives", signature, onset, run.returncode, loss, grad, note="; ".join(notes),
                      diagnosis=diagnosis, run=run)


def disagreement(base: Trajectory, other: Trajectory, *, atol: float = ATOL,
                 rtol: float = RTOL) -> tuple[int | None, float | None]:
    """(first step where `other` departs from `base` beyond tolerance, or finiteness differs; max |Δloss| over
    the steps both have finite)."""
    first, worst = None, None
    for step in sorted(set(base) & set(other)):
        a, b = base[step], other[step]
        if math.isfinite(a) and math.isfinite(b):
            delta = abs(a - b)
            worst = delta if worst is None else max(worst, delta)
            off = delta > atol + rtol * abs(a)
        else:
            off = math.isfinite(a) != math.isfinite(b)
        if off and first is None:
            first = step
    return first, worst


def settle(outcome: ArmOutcome, repeats: list[ArmOutcome]) -> ArmOutcome:
    """Join an arm's later runs to its first: one fate when every run had it, else `unstable` (never one
    run's fate picked over another's)."""
    for run in (outcome, *repeats):
        run._run_verdict = run.run_verdict
    outcome.repeats = list(repeats)
    fates = {r.run_verdict for r in outcome.runs}
    if len(fates) > 1:
        outcome.verdict = "unstable"
        deaths = [r for r in outcome.runs if r.run_verdict == "dies"]
        how = "; ".join(f"run {outcome.runs.index(r) + 1}: {_how(r)}" for r in deaths)
        outcome.note = "; ".join(x for x in (f"dies in {len(deaths)} of {len(outcome.runs)} runs ({how})",
                                              outcome.note) if x)
    return outcome


@dataclass
class Comparison:
    outcomes: list[ArmOutcome]
    recommended: ArmOutcome | None
    verdict_line: str
    exit_code: int
    atol: float = ATOL
    rtol: float = RTOL
    notes: list[str] = field(default_factory=list)


def measure(outcomes: list[ArmOutcome], *, atol: float = ATOL, rtol: float = RTOL) -> None:
    """Each arm against the baseline: where it departs, by how much, whether it agrees (same fate and
    within tolerance), whether it changes what the baseline's death blames."""
    base = outcomes[0]
    for outcome in outcomes[1:]:
        first_loss, outcome.max_abs_dloss = disagreement(base.loss, outcome.loss, atol=atol, rtol=rtol)
        first_grad, outcome.max_abs_dgrad = disagreement(base.grad_norm, outcome.grad_norm, atol=atol, rtol=rtol)
        firsts = [s for s in (first_loss, first_grad) if s is not None]
        outcome.first_disagreement = min(firsts) if firsts else None
        outcome.agrees = outcome.verdict == base.verdict and outcome.first_disagreement is None
        outcome.blamed = blame.changes_blamed(outcome.arm.changes, base.signature, base.crash)


def candidates(outcomes: list[ArmOutcome]) -> list[ArmOutcome]:
    """The arms that may be the fix, in arm order: survived, and change a setting the death blames."""
    measure(outcomes)
    return [o for o in outcomes[1:] if o.verdict == "survives" and o.blamed]


def compare(outcomes: list[ArmOutcome], *, atol: float = ATOL, rtol: float = RTOL) -> Comparison:
    measure(outcomes, atol=atol, rtol=rtol)
    base = outcomes[0]

    def done(recommended: ArmOutcome | None, line: str, code: int) -> Comparison:
        return Comparison(outcomes, recommended, line, code, atol, rtol)

    if base.verdict == "survives":
        return done(None, _baseline_survives(outcomes) + ": keep your config", 0)
    if all(o.dies and not o.started and o.crash for o in outcomes):
        crashes = dict.fromkeys(o.crash for o in outcomes)
        return done(None, "every arm crashed before its first step: " + " / ".join(crashes)
                    + "; fix that in the config (or the command), then probe again", 2)
    if base.verdict == "unstable":
        return done(None, f"baseline dies in {base.num_deaths} of {len(base.runs)} runs ({_how(base)}): the "
                    "death does not repeat, so no arm's survival proves a fix", 1)
    head = f"baseline dies at step {base.onset_step} with {base.signature}"
    head += f" in all {len(base.runs)} runs" if len(base.runs) > 1 else ""
    fixes = [o for o in outcomes[1:] if o.verdict == "survives" and o.blamed]
    if fixes:
        best = fixes[0]
        runs = f" in all {len(best.runs)} runs" if len(best.runs) > 1 else ""
        return done(best, f"{head}; arm `{best.arm.name}` survives{runs} → fix", 0)
    why = [f"arm `{o.arm.name}` dies in {o.num_deaths} of {len(o.runs)} runs" for o in outcomes[1:]
           if o.verdict == "unstable"]
    why += [f"arm `{o.arm.name}` survives but changes nothing the death blames "
            f"({blame.describe(base.signature, base.crash)})" for o in outcomes[1:]
            if o.verdict == "survives" and not o.blamed]
    if not why:
        return done(None, f"{head}; every arm dies: no fix proven", 1)
    return done(None, f"{head}; " + "; ".join(why) + ": no fix proven", 1)


def _baseline_survives(outcomes: list[ArmOutcome]) -> str:
    base = outcomes[0]
    line = f"baseline survives {base.last_step} steps"
    line += f" ({base.note})" if base.note else ""
    dead = [o for o in outcomes[1:] if o.dies]
    unstable = [o for o in outcomes[1:] if o.verdict == "unstable"]
    if dead:
        line += "; arm " + ", ".join(f"`{o.arm.name}` dies ({_how(o)})" for o in dead)
    if unstable:
        line += "; arm " + ", ".join(f"`{o.arm.name}` dies in {o.num_deaths} of {len(o.runs)} runs"
                                     for o in unstable)
    if dead or unstable:
        return line
    line += "; no arm dies"
    if len(outcomes) > 1 and all(o.agrees for o in outcomes[1:]):
        worst = max((o.max_abs_dloss or 0.0) for o in outcomes[1:])
        line += f", and all {len(outcomes)} agree within tolerance (max |Δloss| {worst:.2g})"
    return line


def _how(outcome: ArmOutcome) -> str:
    dying = next((r for r in outcome.runs if r.run_verdict == "dies"), outcome)
    return f"{dying.signature} at step {dying.onset_step}"
