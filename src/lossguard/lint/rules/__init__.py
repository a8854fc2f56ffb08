"""The lint rule registry: a plain tuple of rule classes, one family a module.

`all_rules()` returns one instance of every rule in code order; `get_rule("DSC101")` or
`get_rule("zero.overlap-comm")` returns one rule (its `.code .name .severity .summary .doc()
.evidence .examples` feed `lossguard rules` and `lossguard explain`).
"""

from __future__ import annotations

from lossguard.lint.rules.base import Edit, Example, Fix, Rule
from lossguard.lint.rules.config import (
    AutoUnresolved,
    BatchArithmetic,
    ConfigTypes,
    DeepSpeedSchema,
    HfMismatch,
    RouteUnread,
    WarmupExceedsRun,
)
from lossguard.lint.rules.fsdp import FsdpCheckpointingTwice, FsdpPeftFlatParams
from lossguard.lint.rules.hazards import (
    ClippingDropped,
    OneBitWithZero,
    RemovedFeature,
    SchedulerReplaced,
    Zero3NoHfSave,
)
from lossguard.lint.rules.precision import (
    Bf16OverflowCheck,
    Bf16SkipsInvisible,
    Fp16AndBf16,
    Fp16NoClipping,
    Fp16OnBf16Model,
    Zero3Bf16NoOverflowCheck,
)
from lossguard.lint.rules.trainer import NanInfFilter, PeftReentrantCheckpointing
from lossguard.lint.rules.versions import (
    DeepSpeedBf16Unclipped,
    DeepSpeedZero3StreamRace,
    TorchCudnnSdpa,
    TransformersGaLossBug,
)
from lossguard.lint.rules.zero import (
    AutoBucketOverlap,
    CommDtypeFp32,
    MultiRankBucketAllreduce,
    OverlapComm,
    Zero2GradientRegression,
)

RULES: tuple[type[Rule], ...] = tuple(sorted((
    ConfigTypes, DeepSpeedSchema, RouteUnread,
    OverlapComm, CommDtypeFp32, AutoBucketOverlap, MultiRankBucketAllreduce, Zero2GradientRegression,
    Bf16OverflowCheck, Zero3Bf16NoOverflowCheck, Fp16AndBf16, Fp16NoClipping, Fp16OnBf16Model, Bf16SkipsInvisible,
    BatchArithmetic, HfMismatch, AutoUnresolved, WarmupExceedsRun,
    NanInfFilter, PeftReentrantCheckpointing,
    ClippingDropped, SchedulerReplaced, OneBitWithZero, Zero3NoHfSave, RemovedFeature,
    TorchCudnnSdpa, TransformersGaLossBug, DeepSpeedBf16Unclipped, DeepSpeedZero3StreamRace,
    FsdpCheckpointingTwice, FsdpPeftFlatParams,
), key=lambda r: r.code))


def all_rules() -> list[Rule]:
    return [cls() for cls in RULES]


def get_rule(code_or_name: str) -> Rule | None:
    key = code_or_name.strip()
    for cls in RULES:
        if key.upper() == cls.code or key.lower() == cls.name:
            return cls()
    return None


def select_rules(select: list[str] | None = None, ignore: list[str] | None = None) -> list[Rule]:
    """Rules whose code starts with, or whose name equals or starts with, a select entry, minus ignores."""

    def matches(rule: Rule, patterns: list[str]) -> bool:
        return any(rule.code.startswith(p.upper()) or rule.name == p.lower() or rule.name.startswith(p.lower() + ".")
                   or rule.name.startswith(p.lower() + "-") for p in patterns)

    rules = all_rules()
    if select:
        rules = [r for r in rules if matches(r, select)]
    if ignore:
        rules = [r for r in rules if not matches(r, ignore)]
    return rules


__all__ = ["RULES", "Edit", "Example", "Fix", "Rule", "all_rules", "get_rule", "select_rules"]
