"""What the cause ranking reads about a run (`RunEvidence`) and the typed subjects a clue reads from it
(diagnose/clues.py): each is checked when the module that builds it loads, instead of a string key that
silently never matches when it is misspelt. A subject reads None when the inputs do not tell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from lossguard.core.facts import RunFacts

FACT_NAMES = frozenset(f.name for f in fields(RunFacts) if f.name != "origin")
_CODE = re.compile(r"^[A-Z]+[0-9]{3}$")
_EVENT = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass
class RunEvidence:
    """What the ranking may read about one run: facts, log events, findings and the numbers they carry."""

    facts: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    fired: set[str] = field(default_factory=set)
    measured: dict[tuple[str, str], float] = field(default_factory=dict)
    onset_at_start: bool | None = None
    # Where each was read, for evidence lines: event name -> "train.log:12"; detector code -> "step 40".
    event_origins: dict[str, str] = field(default_factory=dict)
    finding_origins: dict[str, str] = field(default_factory=dict)
    onset_origin: str | None = None
    # Finite losses logged before the onset while no spike or rise was found: a steady run that then died.
    steady_logs_before_onset: int | None = None
    columns: frozenset[str] = frozenset()  # the signals the log shows (catalog names: loss, lr, ...)
    # Every training loss logged is finite and non-zero (a 0.0 can be the Trainer's NaN filter); None: no
    # training loss was logged.
    train_losses_finite: bool | None = None
    # The learning rate is exactly 0 on at least three logs (stuck, not a warmup's first log): is the grad
    # norm beside it exactly 0 on every such log (True), or not (False)? None: no log shows that.
    zero_norm_at_zero_lr: bool | None = None
    # The grad norm rises steadily over the run (most steps up, ending several times where it began); None:
    # too few grad norms logged to tell.
    grad_norm_grows: bool | None = None
    # Every DPO reward margin logged is exactly 0 (True) or one is not (False); None: no margin column.
    margins_all_zero: bool | None = None
    # Every training loss logged is ln 2 to its printed precision (a pairwise loss at a margin of 0).
    loss_at_ln2: bool | None = None
    # The token accuracy is exactly 0 from the first log on (True), or the first log's is not (False); None:
    # no token-accuracy column.
    no_token_scored: bool | None = None


@dataclass(frozen=True, slots=True)
class Fact:
    """A RunFacts field; a name RunFacts lacks fails at import."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in FACT_NAMES:
            raise ValueError(f"unknown run fact {self.name!r}; RunFacts has {sorted(FACT_NAMES)}")

    def read(self, run: RunEvidence) -> Any:
        return run.facts.get(self.name)

    def origin(self, run: RunEvidence) -> str | None:
        return run.origins.get(self.name)


@dataclass(frozen=True, slots=True)
class Event:
    """How many times a log event (`overflow`, `tokenization-mismatch`, ...) was seen; unknown when never.
    The names the sources emit are checked by a test (tests/unit/test_causes.py)."""

    name: str

    def __post_init__(self) -> None:
        if not _EVENT.match(self.name):
            raise ValueError(f"event names are lower-case-with-dashes, got {self.name!r}")

    def read(self, run: RunEvidence) -> Any:
        return run.events.get(self.name) or None

    def origin(self, run: RunEvidence) -> str | None:
        return run.event_origins.get(self.name)


@dataclass(frozen=True, slots=True)
class Fired:
    """True when a detector code fired; unknown otherwise. Codes are checked against the registry in a test."""

    code: str

    def __post_init__(self) -> None:
        if not _CODE.match(self.code):
            raise ValueError(f"detector codes look like LOSS001, got {self.code!r}")

    def read(self, run: RunEvidence) -> Any:
        return True if self.code in run.fired else None

    def origin(self, run: RunEvidence) -> str | None:
        return run.finding_origins.get(self.code)


@dataclass(frozen=True, slots=True)
class Measured:
    """A number a finding carries (`LOSS007` `eval_ratio`)."""

    code: str
    key: str

    def __post_init__(self) -> None:
        Fired(self.code)  # same code check

    def read(self, run: RunEvidence) -> Any:
        return run.measured.get((self.code, self.key))

    def origin(self, run: RunEvidence) -> str | None:
        return run.finding_origins.get(self.code)


@dataclass(frozen=True, slots=True)
class OnsetAtStart:
    """The failure shows from the first logged step."""

    def read(self, run: RunEvidence) -> Any:
        return run.onset_at_start

    def origin(self, run: RunEvidence) -> str | None:
        return run.onset_origin


@dataclass(frozen=True, slots=True)
class SteadyBeforeOnset:
    """How many finite losses were logged before the onset with no spike or rise among them."""

    def read(self, run: RunEvidence) -> Any:
        return run.steady_logs_before_onset

    def origin(self, run: RunEvidence) -> str | None:
        return run.onset_origin and f"before {run.onset_origin}"


@dataclass(frozen=True, slots=True)
class AnyKnown:
    """What shows of a group of facts and finding numbers: a short description of the first known ones, or
    False when none is known (the inputs show none of them)."""

    names: tuple[str, ...]
    numbers: tuple[tuple[str, str], ...] = ()  # (detector code, key)

    def __post_init__(self) -> None:
        for name in self.names:
            Fact(name)
        for code, key in self.numbers:
            Measured(code, key)

    def read(self, run: RunEvidence) -> Any:
        shown = [f"{name} {run.facts[name]}" for name in self.names if run.facts.get(name) is not None]
        shown += [f"{code} {key}" for code, key in self.numbers if run.measured.get((code, key))]
        return ", ".join(shown[:3]) if shown else False

    def origin(self, run: RunEvidence) -> str | None:
        return next((run.origins[name] for name in self.names if run.facts.get(name) is not None
                     and name in run.origins), None)


@dataclass(frozen=True, slots=True)
class Column:
    """True when the log shows one of these signals (catalog names); unknown otherwise."""

    signals: tuple[str, ...]

    def read(self, run: RunEvidence) -> Any:
        return True if run.columns.intersection(self.signals) else None

    def origin(self, run: RunEvidence) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class RunNumber:
    """A property of the run's logged columns that the diagnosis computes (a RunEvidence field)."""

    name: str
    where: str = ""  # the columns it is computed from, as the evidence line's location

    def __post_init__(self) -> None:
        if self.name not in {f.name for f in fields(RunEvidence)}:
            raise ValueError(f"RunEvidence has no field {self.name!r}")

    def read(self, run: RunEvidence) -> Any:
        return getattr(run, self.name)

    def origin(self, run: RunEvidence) -> str | None:
        return self.where or None


@dataclass(frozen=True, slots=True)
class EvalOnlyNonfinite:
    """The first non-finite value was an evaluation loss (LOSS001 on_eval) and every training loss is finite
    and non-zero. A training loss of 0.0 beside a NaN eval loss is what the Trainer's NaN filter prints for a
    NaN training loss: not eval-only. Unknown without a non-finite value or a training loss."""

    def read(self, run: RunEvidence) -> Any:
        on_eval = run.measured.get(("LOSS001", "on_eval"))
        if on_eval is None or run.train_losses_finite is None:
            return None
        return bool(on_eval) and run.train_losses_finite

    def origin(self, run: RunEvidence) -> str | None:
        return run.finding_origins.get("LOSS001")


Subject = (Fact | Event | Fired | Measured | OnsetAtStart | SteadyBeforeOnset | AnyKnown | Column | RunNumber
           | EvalOnlyNonfinite)
_OPS = {
    "==": lambda actual, expected: actual == expected,
    "in": lambda actual, expected: actual in expected,
    ">=": lambda actual, expected: isinstance(actual, (int, float)) and actual >= expected,
    "<=": lambda actual, expected: isinstance(actual, (int, float)) and actual <= expected,
    "endswith": lambda actual, expected: str(actual).endswith(expected),
    "inside": lambda actual, expected: expected.contains(str(actual)),
    # A subject that reads a description of what it found, or False (AnyKnown): found or not.
    "found": lambda actual, expected: bool(actual) == expected,
}
OPS = frozenset(_OPS)


def compare(op: str, actual: Any, expected: Any) -> bool | None:
    """`actual OP expected`; None where it cannot be told (a version a window cannot place)."""
    return _OPS[op](actual, expected)
