"""HF Trainer argument risks: hidden NaN losses, PEFT + reentrant checkpointing (known issues lora-reentrant-checkpointing and the Trainer's NaN filter)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from lossguard.core.findings import Finding, Severity
from lossguard.lint.context import LintContext
from lossguard.lint.rules.base import Example, Fix, Rule


class NanInfFilter(Rule):
    """`logging_nan_inf_filter` left on (the HF default).

    What: the Trainer replaces a NaN/Inf step loss by the running average; a logging window that is all
    NaN logs exactly `loss: 0.0`. A dead run then looks like a perfectly converged one, while the NaN
    gradients are still applied (the option only changes logging).

    Fix (manual, a training argument): `--logging_nan_inf_filter False`, or run LossguardCallback,
    which records the raw loss.
    """

    engines = ("deepspeed", "fsdp")  # not tied to the engine
    code = "HFA201"
    name = "trainer.nan-inf-filter"
    severity = Severity.INFO
    summary = "logging_nan_inf_filter on: NaN losses are logged as 0.0"
    signature = "nonfinite-hidden"
    evidence = ("https://github.com/huggingface/transformers/blob/main/src/transformers/trainer.py",
                "https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments.logging_nan_inf_filter")
    examples = (
        Example({}, valid=False, args={"learning_rate": 1e-5}),
        Example({}, valid=True, args={"logging_nan_inf_filter": False}),
        Example({}, valid=True, note="no training arguments: nothing to say"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.hf_args or ctx.arg("logging_nan_inf_filter", True) is False:
            return
        given = "is True" if "logging_nan_inf_filter" in ctx.args else "is unset (default True)"
        yield self.finding(ctx, f"logging_nan_inf_filter {given}: NaN/Inf losses are logged as 0.0, hiding a dead run",
                           "args.logging_nan_inf_filter",
                           fix=Fix("pass --logging_nan_inf_filter False (or use LossguardCallback)", safe=True))


# Frameworks that call enable_input_require_grads() / pass use_reentrant=False themselves.
_HANDLES_INPUT_GRADS = {"llamafactory", "axolotl"}
# Calls in a training script that give the checkpointed blocks an input that requires grad
# (prepare_model_for_kbit_training calls enable_input_require_grads for reentrant checkpointing).
_INPUT_GRAD_CALLS = re.compile(r"enable_input_require_grads\s*\(|prepare_model_for_kbit_training\s*\(|"
                               r"[\"']?use_reentrant[\"']?\s*[:=]\s*False")


def _script_handles_input_grads(script: Any) -> bool | None:
    """True / False when the launch command's script can be read here; None when it cannot."""
    if not isinstance(script, str):
        return None
    try:
        with open(script, encoding="utf-8", errors="replace") as fh:
            return bool(_INPUT_GRAD_CALLS.search(fh.read()))
    except OSError:
        return None


class PeftReentrantCheckpointing(Rule):
    """PEFT/LoRA + gradient checkpointing with reentrant checkpoints and no input grads.

    What: with `use_reentrant=True` (the historic default) torch.utils.checkpoint back-propagates into a
    block only if one of its inputs requires grad. Frozen embeddings → no gradient reaches the LoRA
    weights inside checkpointed blocks: grad_norm 0, loss flat, lora_B stays 0. PyTorch warns "None of
    the inputs have requires_grad=True".

    A possibility, not a certainty: many scripts call `enable_input_require_grads()` (or
    `prepare_model_for_kbit_training`). When `--cmd` names a script lint can read, it looks for those
    calls: found → silent, absent → warning; script not readable → info.

    Fix (manual): `--gradient_checkpointing_kwargs '{"use_reentrant": false}'` or call
    `model.enable_input_require_grads()` (LLaMA-Factory, axolotl, LLaVA and GLM-4 scripts do).
    """

    engines = ("deepspeed", "fsdp")  # not tied to the engine
    code = "HFA202"
    name = "peft.reentrant-checkpointing"
    severity = Severity.WARNING
    summary = "LoRA + reentrant gradient checkpointing: no gradient may reach the adapters"
    signature = "no-grad-flow"
    evidence = ("https://github.com/microsoft/LoRA/issues/120",
                "https://github.com/huggingface/transformers/blob/main/src/transformers/modeling_utils.py")
    examples = (
        Example({}, valid=False, args={"lora": True, "gradient_checkpointing": True}),
        Example({}, valid=True, args={"lora": True, "gradient_checkpointing": True,
                                      "gradient_checkpointing_kwargs": {"use_reentrant": False}}),
        Example({}, valid=True, args={"lora": True, "gradient_checkpointing": True, "framework": "llamafactory"}),
        Example({}, valid=True, args={"lora": False, "gradient_checkpointing": True}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.arg("lora") or not ctx.arg("gradient_checkpointing"):
            return
        if ctx.arg("framework") in _HANDLES_INPUT_GRADS:
            return
        kwargs = ctx.arg("gradient_checkpointing_kwargs")
        if isinstance(kwargs, dict) and kwargs.get("use_reentrant") in (False, "false", "False"):
            return
        handled = _script_handles_input_grads(ctx.arg("script"))
        if handled:
            return
        fix = Fix("pass --gradient_checkpointing_kwargs '{\"use_reentrant\": false}'", safe=True)
        if handled is False:
            yield self.finding(ctx, f"LoRA with reentrant gradient checkpointing and {ctx.arg('script')} calls neither "
                               "enable_input_require_grads() nor prepare_model_for_kbit_training(): no gradient may "
                               "reach the adapters inside checkpointed blocks", "args.gradient_checkpointing_kwargs",
                               fix=fix)
            return
        yield self.finding(ctx, "LoRA with gradient_checkpointing and use_reentrant not set to False: if the script "
                           "does not call enable_input_require_grads(), no gradient reaches the adapters (pass --cmd "
                           "with the script so lint can check)", "args.gradient_checkpointing_kwargs", fix=fix,
                           severity=Severity.INFO)
