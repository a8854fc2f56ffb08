"""The guard's options: one typed, keyword-only, validated-once object shared by every entry point."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lossguard.core.findings import Finding, Severity
from lossguard.diagnose.signatures import SIGNATURES as _SIGNATURE_TABLE
from lossguard.diagnose.signatures import finding_verdict

# The signature ids `halt_on` may name: the diagnosis's own table, never a copy.
SIGNATURES = tuple(_SIGNATURE_TABLE)
# A verdict named in `halt_on` means what the diagnosis means by it (diagnose.signatures.finding_verdict).
VERDICTS = {"warning": 1, "broken": 2}


class OptionError(ValueError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoverOptions:
    """How `recover=True` behaves; `recover=RecoverOptions(budget=..., window=...)` refines it.

    `budget`: the most steps the commit gate may hold within any `window` consecutive optimizer steps; the
    fault that would exceed it halts the run instead (LossguardHalt on every rank, whether or not `halt_on`
    is set). Defaults: 3 in 100. A held step costs one batch of data; three in a hundred is already 3% of
    the data dropped, and faults that come back that often are not transient: the weights or the data
    stream are bad, and holding more steps would hide a broken run behind a finishing one. A fault on
    every step (weights already non-finite: the gate cannot repair what was applied) halts at the
    fourth step.

    `snapshot_every`: keep host snapshots of each rank's own state every S steps (monitor/snapshots.py), so a
    fault seen only after the step was applied (non-finite weights) is rolled back; 0: off. A snapshot costs
    host memory per rank, about 12 bytes per TRAINED parameter for fp32 Adam (less per rank under ZeRO),
    times `keep` (2), and a rollback a fresh copy of the optimizer state at its peak. None (the default)
    decides by that cost, measured at the first step against the host memory free per local rank: on, every
    10 steps, when it fits, off otherwise; said in one line at the start (monitor/sizing.py).

    `replay`: replay a held step to classify it (`transient` / `sample`, monitor/replay.py) where the entry
    point can: `Guard.commit(..., forward=...)`, and `attach(engine)` when the engine took one micro-batch
    called with keyword tensors whose output carries the loss. False: hold only (no extra forward).
    """

    budget: int = 3
    window: int = 100
    snapshot_every: int | None = None
    keep: int = 2
    replay: bool = True

    def __post_init__(self) -> None:
        problems = [f"recover.{name} must be an int >= 1, got {getattr(self, name)!r}"
                    for name in ("budget", "window", "keep") if not _positive_int(getattr(self, name))]
        if not isinstance(self.replay, bool):
            problems.append(f"recover.replay must be True or False, got {self.replay!r}")
        every = self.snapshot_every
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 0):
            problems.append(f"recover.snapshot_every must be None (decided by the host's free memory) or an int >= 0, "
                            f"got {every!r}")
        if not problems and self.budget > self.window:
            problems.append(f"recover.budget ({self.budget}) must not exceed recover.window ({self.window})")
        if problems:
            raise OptionError("lossguard: bad option(s): " + "; ".join(problems))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardOptions:
    events_dir: str | Path | None = None
    # None: never halt. A severity ("error"), a verdict ("broken"), a signature ("nonfinite"), a
    # detector code ("LOSS001"), or a list of these.
    halt_on: str | list[str] | tuple[str, ...] | None = None
    fingerprint_every: int = 50  # weight fingerprint + update ratio every N optimizer steps (0: never)
    console: bool = True  # print findings on rank 0
    console_min_severity: str = "warning"
    webhook_url: str | None = None  # Slack-compatible POST {"text": ...} from rank 0, off-thread
    webhook_min_severity: str = "error"
    raise_errors: bool = False  # re-raise lossguard's own errors into the training loop
    # group name -> parameter-name substrings, for the per-group update ratio. None: automatic
    # (LoRA parameters, then the model's top-level modules).
    module_groups: dict[str, list[str]] | None = None
    update_sample_size: int = 4096  # elements of each parameter sampled for the update ratio
    # Up to this many ranks, every step gathers every rank's row (all records, every step). Above it, a
    # step reduces a summary and gathers only when the summary shows something (monitor/summary.py).
    detail_every_step_up_to: int = 16
    # After a halt, the process ends with this exit status once training has returned on every rank (the
    # entry point raises SystemExit; monitor/guard.py `exit_after_halt`). None: exit as the script does.
    exit_code_on_halt: int | None = None
    # Hold a faulty step on every rank instead of applying it (`Guard.commit`, `attach`'s and the Trainer
    # callback's gated step: monitor/recover.py, adapters/deepspeed.py, adapters/hf_gate.py). False:
    # off; True: RecoverOptions() defaults; a RecoverOptions refines them.
    recover: bool | RecoverOptions = False
    detectors: list[Any] | None = field(default=None, compare=False)  # None: every registered detector

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.fingerprint_every, int) or self.fingerprint_every < 0:
            problems.append(f"fingerprint_every must be an int >= 0, got {self.fingerprint_every!r}")
        if not isinstance(self.detail_every_step_up_to, int) or isinstance(self.detail_every_step_up_to, bool) \
                or self.detail_every_step_up_to < 0:
            problems.append(f"detail_every_step_up_to must be an int >= 0, got {self.detail_every_step_up_to!r}")
        for name in ("console_min_severity", "webhook_min_severity"):
            try:
                Severity.parse(getattr(self, name))
            except (ValueError, AttributeError):
                problems.append(f"{name} must be info, warning, error or critical, got {getattr(self, name)!r}")
        try:
            halt_rules(self.halt_on)
        except OptionError as exc:
            problems.append(str(exc))
        code = self.exit_code_on_halt
        if code is not None and (not isinstance(code, int) or isinstance(code, bool) or not 1 <= code <= 255):
            problems.append(f"exit_code_on_halt must be None or an int from 1 to 255 (3: what `lossguard watch` "
                            f"exits with after a halt), got {code!r}")
        if not isinstance(self.recover, (bool, RecoverOptions)):
            problems.append(f"recover must be True, False or a lossguard.RecoverOptions(budget=..., window=...), "
                            f"got {self.recover!r}")
        if self.webhook_url is not None and not str(self.webhook_url).startswith(("http://", "https://")):
            problems.append(f"webhook_url must be an http(s) URL, got {self.webhook_url!r}")
        if problems:
            raise OptionError("lossguard: bad option(s): " + "; ".join(problems))

    @property
    def recovery(self) -> RecoverOptions | None:
        """The recovery settings, None when recovery is off."""
        if isinstance(self.recover, RecoverOptions):
            return self.recover
        return RecoverOptions() if self.recover else None


def halt_rules(halt_on: Any) -> list[tuple[str, Any]]:
    """`halt_on` as ("severity", Severity) / ("verdict", rank) / ("signature", id) / ("code", code) rules."""
    if halt_on is None:
        return []
    items = [halt_on] if isinstance(halt_on, str) else list(halt_on)
    rules: list[tuple[str, Any]] = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise OptionError(f"halt_on entries must be non-empty strings, got {item!r}")
        text = item.strip()
        low = text.lower()
        if low in VERDICTS:
            rules.append(("verdict", VERDICTS[low]))
        elif low in ("info", "error", "critical"):
            rules.append(("severity", Severity.parse(low)))
        elif low in SIGNATURES:
            rules.append(("signature", low))
        elif text[:1].isalpha() and text.upper() == text:
            rules.append(("code", text))
        else:
            raise OptionError(
                f"halt_on={item!r} is not a severity (info/warning/error/critical), a verdict (broken), "
                f"a signature ({', '.join(SIGNATURES)}) or a detector code"
            )
    return rules


def should_halt(rules: list[tuple[str, Any]], findings: list[Finding]) -> list[Finding]:
    """The findings that trigger a halt under `rules`."""
    hits = []
    for finding in findings:
        for kind, value in rules:
            if (
                (kind == "severity" and finding.severity >= value)
                or (kind == "verdict" and VERDICTS.get(finding_verdict(finding.signature, finding.severity), 0) >= value)
                or (kind == "signature" and finding.signature == value)
                or (kind == "code" and finding.code == value)
            ):
                hits.append(finding)
                break
    return hits
