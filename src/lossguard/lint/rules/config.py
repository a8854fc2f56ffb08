"""Config consistency: types, "auto" values, batch arithmetic, warmup (DeepSpeed + HF integration)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lossguard.core.findings import Finding, Severity
from lossguard.lint.context import LintContext, as_bool, as_number, get_in
from lossguard.lint.rules.base import Example, Fix, Rule, set_

HF_DS = "https://huggingface.co/docs/transformers/main/en/deepspeed"

# key path -> expected kind, for the keys the rules read. "auto" is accepted wherever HF fills it.
_TYPES: dict[str, str] = {
    "zero_optimization": "dict", "fp16": "dict", "bf16": "dict", "optimizer": "dict", "scheduler": "dict",
    "zero_optimization.stage": "stage", "zero_optimization.overlap_comm": "bool",
    "zero_optimization.contiguous_gradients": "bool", "zero_optimization.use_multi_rank_bucket_allreduce": "bool",
    "zero_optimization.round_robin_gradients": "bool", "zero_optimization.reduce_scatter": "bool",
    "zero_optimization.allgather_partitions": "bool",
    "zero_optimization.reduce_bucket_size": "number", "zero_optimization.allgather_bucket_size": "number",
    "zero_optimization.stage3_prefetch_bucket_size": "number",
    "zero_optimization.stage3_param_persistence_threshold": "number",
    "fp16.enabled": "bool", "bf16.enabled": "bool", "bf16.check_grad_overflow": "bool",
    "train_batch_size": "int", "train_micro_batch_size_per_gpu": "int", "gradient_accumulation_steps": "int",
    "gradient_clipping": "number", "steps_per_print": "int",
}


def _coerce(value: Any, kind: str) -> tuple[bool, Any]:
    """(is it acceptable, the corrected value or None when no safe correction exists)."""
    if value == "auto" and kind != "dict":
        return True, None
    if kind == "dict":
        return isinstance(value, dict), None
    if kind == "bool":
        return isinstance(value, bool), as_bool(value)
    number = as_number(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if kind == "stage":
            return value in (0, 1, 2, 3), None
        if kind == "int":
            return float(value).is_integer() and value > 0, None
        return value >= 0, None
    if number is None or (kind in ("int", "stage") and not number.is_integer()):
        return False, None
    fixed = int(number) if number.is_integer() else number
    return False, fixed if kind != "stage" or fixed in (0, 1, 2, 3) else None


class ConfigTypes(Rule):
    """A DeepSpeed key holds a value of the wrong type (a string where a number or boolean belongs).

    What: `"overlap_comm": "false"` is a non-empty string: some readers take it as true; `"stage": "2"`
    or `"reduce_bucket_size": "5e8"` depend on DeepSpeed's pydantic coercion and break other tools
    (accelerate, the HF integration compare them as strings). Sections that must be objects and are not
    make DeepSpeed fail at start-up.

    Fix (safe when the intended value is unambiguous): write the value with its JSON type.
    """

    code = "DSC001"
    name = "config.types"
    severity = Severity.WARNING
    summary = "a DeepSpeed key holds a value of the wrong type"
    evidence = ("https://www.deepspeed.ai/docs/config-json/",)
    examples = (
        Example({"zero_optimization": {"stage": "2", "overlap_comm": "false"}}, valid=False,
                fixed={"zero_optimization": {"stage": 2, "overlap_comm": False}}),
        Example({"zero_optimization": "stage2"}, valid=False),
        Example({"zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": "auto"}}, valid=True),
        Example({"train_batch_size": 16, "zero_optimization": {"reduce_bucket_size": 5e8}}, valid=True),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        for path, kind in _TYPES.items():
            value = get_in(ctx.raw, path, _ABSENT)
            if value is _ABSENT:
                continue
            ok, fixed = _coerce(value, kind)
            if ok:
                continue
            expected = {"dict": "an object", "bool": "true or false", "stage": "0, 1, 2 or 3",
                        "int": "a positive integer", "number": "a non-negative number"}[kind]
            fix = Fix(f"write {path} as {fixed!r}", safe=True, edits=(set_(path, fixed),)) if fixed is not None else None
            yield self.finding(ctx, f"{path} is {value!r} ({type(value).__name__}); expected {expected}", path, fix=fix)


_ABSENT = object()


class BatchArithmetic(Rule):
    """`train_batch_size` ≠ `train_micro_batch_size_per_gpu` × `gradient_accumulation_steps` × world size.

    What: DeepSpeed derives whichever of the three is absent (integer division by the world size:
    `_set_batch_related_parameters`), then asserts the identity and that each is > 0 at start-up; the HF
    integration computes it from the arguments. This rule runs the same resolution and errs only where
    DeepSpeed itself would refuse, quoting its message; an absent `gradient_accumulation_steps` is derived
    (train_batch / (micro x world)), never taken as 1. Without a world size it errs only when no world
    size lets DeepSpeed start. A hand-written train_batch_size copied from an 8-GPU recipe fails on 4 GPUs, or, when
    the per-GPU keys are absent, silently changes gradient accumulation.

    Fix: set `train_batch_size: "auto"` under the HF Trainer, or make the numbers agree.
    """

    code = "DSC111"
    name = "batch.arithmetic"
    severity = Severity.ERROR
    summary = "train_batch_size does not equal micro × GA × world size"
    evidence = ("https://www.deepspeed.ai/docs/config-json/#batch-size-related-parameters",
                "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/config.py",
                "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/dataclasses.py")
    examples = (
        Example({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
                valid=False, args={"world_size": 4}),
        Example({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
                valid=False, note="not a multiple: no world size fits"),
        Example({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
                valid=True, args={"world_size": 4}),
        Example({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                 "gradient_accumulation_steps": "auto"}, valid=True, args={"world_size": 8}),
        Example({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4}, valid=True,
                note="GA absent: DeepSpeed derives 256 // 4 // world, not 1"),
        Example({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4}, valid=True, args={"world_size": 8},
                note="GA derived as 8"),
        Example({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, valid=False,
                note="no world size divides it: 30 != 4 * 7 * 1"),
        Example({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}, valid=False, args={"world_size": 8},
                note="derived GA is 0"),
        Example({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}, valid=False,
                args={"world_size": 8, "per_device_train_batch_size": 4},
                note="HF Trainer route: accelerate writes GA 1, so 64 != 4 * 1 * 8"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        from lossguard.lint.batchsize import check_batch

        values = [_batch_value(ctx.config.get(key, _ABSENT)) for key in _BATCH_KEYS]
        if any(v is _UNKNOWN for v in values):
            return  # "auto" or not a positive integer: filled at runtime or reported by DSC001
        total, micro, ga = values
        if total is None and micro is None:
            return  # the launcher supplies them (Megatron, accelerate's dataloader) or the config is not for training
        note = ""
        if ga is None and ctx.hf_args:  # accelerate's DeepSpeedPlugin writes GA 1 into a config without it
            ga, note = 1, "; accelerate adds gradient_accumulation_steps 1 when the key is absent"
        world = ctx.world_size
        verdict = check_batch(total, micro, ga, world)
        if verdict.refusal is None:
            return
        where = f"with {world} rank(s)" if world else "for every world size"
        path = next((k for k, v in zip(_BATCH_KEYS, values) if v is not None), "train_batch_size")
        yield self.finding(ctx, f"DeepSpeed refuses to start {where}: \"{verdict.refusal}\" "
                           f"({_written(values)}{note})", path)


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_UNKNOWN = object()


def _batch_value(value: Any) -> Any:
    if value is _ABSENT:
        return None
    number = as_number(value)
    if number is None or not number.is_integer() or number <= 0 or isinstance(value, bool):
        return _UNKNOWN  # DSC001 names a wrong type or a non-positive value
    return int(number)


def _written(values: list[Any]) -> str:
    names = ("train_batch_size", "micro", "GA")
    return ", ".join(f"{n} {v}" if v is not None else f"{n} absent (derived)" for n, v in zip(names, values))


class HfMismatch(Rule):
    """A DeepSpeed value disagrees with the HF training argument it must match.

    What: `HfTrainerDeepSpeedConfig.trainer_config_process` compares batch size, GA, clipping, lr,
    betas, eps, weight decay and fp16/bf16 with the TrainingArguments and raises "Please correct the
    following DeepSpeed config values that mismatch TrainingArguments values".

    Fix (safe under the HF Trainer): set the key to "auto" so the Trainer fills it.
    """

    code = "DSC112"
    name = "hf.mismatch"
    severity = Severity.ERROR
    summary = "a DeepSpeed value disagrees with the HF training arguments"
    evidence = (HF_DS,)
    examples = (
        Example({"gradient_accumulation_steps": 4}, valid=False, args={"gradient_accumulation_steps": 8},
                fixed={"gradient_accumulation_steps": "auto"}),
        Example({"gradient_accumulation_steps": "auto"}, valid=True, args={"gradient_accumulation_steps": 8}),
        Example({"gradient_accumulation_steps": 8}, valid=True, args={"gradient_accumulation_steps": 8}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        for path, (ds_value, hf_value, hf_key) in ctx.resolution.mismatches.items():
            dotted = ".".join(path)
            fix = Fix(f'set {dotted} to "auto"', safe=True, edits=(set_(dotted, "auto"),))
            yield self.finding(ctx, f"{dotted} is {ds_value!r} but the training arguments give {hf_key}={hf_value!r}; "
                               "the HF Trainer refuses to start", dotted, fix=fix)


class AutoUnresolved(Rule):
    """`"auto"` values that nothing here can resolve.

    What: only the HF Trainer / accelerate integration fills "auto". With plain
    `deepspeed.initialize` they are not filled: numeric keys fail validation or fall back to defaults.
    With training arguments lossguard resolves them like transformers does; what remains (step counts
    from the dataset length, hidden-size keys without a model config) is listed here.

    Fix: pass `--training-args` or `--cmd` so lint can resolve them, or write explicit values when the
    config is used outside the HF Trainer.
    """

    code = "DSC113"
    name = "config.auto-unresolved"
    severity = Severity.INFO
    summary = '"auto" values that cannot be resolved without the HF Trainer'
    evidence = (HF_DS, "https://github.com/huggingface/transformers/blob/main/src/transformers/integrations/deepspeed.py")
    examples = (
        Example({"train_micro_batch_size_per_gpu": "auto"}, valid=False),
        Example({"train_micro_batch_size_per_gpu": "auto"}, valid=True, args={"per_device_train_batch_size": 4}),
        Example({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}, valid=False,
                args={"learning_rate": 1e-5}, note="hidden size unknown"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        unresolved = {p: why for p, why in ctx.resolution.unresolved.items() if p[0] != "scheduler" or not ctx.hf_args}
        if not unresolved:
            return
        keys = ", ".join(".".join(p) for p in unresolved)
        reasons = sorted(set(unresolved.values()))
        yield self.finding(ctx, f'"auto" left unresolved: {keys} ({"; ".join(reasons)})', ".".join(next(iter(unresolved))),
                           keys=[".".join(p) for p in unresolved])


class WarmupExceedsRun(Rule):
    """Warmup as long as or longer than the run.

    What: with warmup ≥ total steps the LR never reaches its peak (a run that "does not learn"), and a
    scheduler whose warmup exceeds `total_num_steps` in WarmupDecayLR goes negative on some versions.

    Fix: shorten the warmup (a few percent of the steps), or check max_steps / epochs.
    """

    code = "DSC114"
    name = "scheduler.warmup-exceeds-run"
    severity = Severity.WARNING
    summary = "warmup is as long as the run or longer"
    signature = "lr-zero"
    evidence = ("https://deepspeed.readthedocs.io/en/latest/schedulers.html",)
    examples = (
        Example({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 1000, "total_num_steps": 500}}},
                valid=False),
        Example({}, valid=False, args={"warmup_steps": 200, "max_steps": 100}),
        Example({}, valid=False, args={"warmup_ratio": 1.0}),
        Example({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 500}}},
                valid=True),
        Example({}, valid=True, args={"warmup_steps": 10, "max_steps": 100}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        params = get_in(ctx.config, "scheduler.params", {})
        if isinstance(params, dict):
            warm, total = as_number(params.get("warmup_num_steps")), as_number(params.get("total_num_steps"))
            if warm and total and warm >= total:
                yield self.finding(ctx, f"scheduler warmup_num_steps {warm:g} >= total_num_steps {total:g}: the LR "
                                   "never leaves warmup", "scheduler.params.warmup_num_steps")
        warm, total = as_number(ctx.arg("warmup_steps")), as_number(ctx.arg("max_steps"))
        if warm and total and total > 0 and warm >= total:
            yield self.finding(ctx, f"warmup_steps {warm:g} >= max_steps {total:g}: the LR never leaves warmup",
                               "args.warmup_steps")
        ratio = as_number(ctx.arg("warmup_ratio"))
        if ratio is not None and ratio >= 1:
            yield self.finding(ctx, f"warmup_ratio {ratio:g} >= 1: the whole run is warmup", "args.warmup_ratio")


class DeepSpeedSchema(Rule):
    """The installed DeepSpeed's own config model rejects the config (opt-in: `--deepspeed-schema`).

    What: builds `deepspeed.runtime.config.DeepSpeedConfig` on the config with "auto" resolved, which
    runs DeepSpeed's pydantic models (unknown keys in zero_optimization, bad types, batch checks).
    Importing DeepSpeed imports torch (seconds), so lint does this only on request.

    Fix: the message is DeepSpeed's own; correct the key it names.
    """

    code = "DSC002"
    name = "config.deepspeed-schema"
    severity = Severity.ERROR
    summary = "the installed DeepSpeed's config model rejects the config (opt-in)"
    evidence = ("https://www.deepspeed.ai/docs/config-json/",)
    examples = (
        Example({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comn": True}}, valid=False,
                options={"deepspeed_schema": True}, note="typo: overlap_comn"),
        Example({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comm": False}}, valid=True,
                options={"deepspeed_schema": True}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.options.get("deepspeed_schema"):
            return
        from importlib.util import find_spec

        if find_spec("deepspeed") is None:
            yield self.finding(ctx, "--deepspeed-schema: DeepSpeed is not installed here; schema not checked", "",
                               severity=Severity.INFO)
            return
        import copy
        import logging

        from lossguard.lint.resolve import auto_paths

        config = copy.deepcopy(ctx.config)
        for path in auto_paths(config):  # what HF would fill at runtime; drop so DeepSpeed uses defaults
            node = get_in(config, path[:-1]) if len(path) > 1 else config
            node.pop(path[-1], None)
        if "train_micro_batch_size_per_gpu" in config and "gradient_accumulation_steps" in config:
            config.pop("train_batch_size", None)  # DeepSpeed derives it for its own world size (DSC111 checks)
        if not any(k in config for k in ("train_batch_size", "train_micro_batch_size_per_gpu")):
            config["train_micro_batch_size_per_gpu"] = 1
        from lossguard.lint.quiet import stdout_to_stderr

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        try:
            with stdout_to_stderr():  # DeepSpeed's import and validation print; stdout is the report
                from deepspeed.runtime.config import DeepSpeedConfig

                DeepSpeedConfig(config)
        except Exception as exc:  # DeepSpeed raises ValidationError, AssertionError, ValueError...
            first = " ".join(str(exc).split())[:400]
            yield self.finding(ctx, f"DeepSpeed rejects the config: {type(exc).__name__}: {first}", "")


class RouteUnread(Rule):
    """The accelerate YAML names a DeepSpeed config file that cannot be read from here.

    What: `deepspeed_config.deepspeed_config_file` is resolved relative to the YAML; when it is missing or
    unreadable, lint checks only what accelerate would build from the YAML's other keys, and says so rather
    than reporting a clean run. accelerate itself stops at start-up when the file is missing.

    Fix: run lint where the file is, or pass the DeepSpeed JSON itself.
    """

    code = "DSC003"
    name = "config.route-unread"
    severity = Severity.WARNING
    summary = "the DeepSpeed config file an accelerate YAML names cannot be read; only the YAML was checked"
    evidence = ("https://huggingface.co/docs/accelerate/usage_guides/deepspeed",)
    examples = (
        Example({"zero_optimization": {"stage": 2}}, valid=False,
                options={"route_unread": "acc.yaml: deepspeed_config.deepspeed_config_file names ds.json, "
                                         "which cannot be read: ds.json: no such file; check the path"}),
        Example({"zero_optimization": {"stage": 2}}, valid=True),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        why = ctx.options.get("route_unread")
        if why:
            yield self.finding(ctx, f"{why}; checked only the keys accelerate builds from the YAML", "")
