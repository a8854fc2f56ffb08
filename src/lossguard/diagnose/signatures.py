"""Failure signature ids (DESIGN.md), their meaning, verdict, and precedence when several fire."""

from __future__ import annotations

# id -> (verdict when it fires, one-line meaning). Order = precedence: the first that fired is primary.
SIGNATURES: dict[str, tuple[str, str]] = {
    "rank-desync": ("broken", "ranks disagree on weights (live): data-parallel replicas drifted apart"),
    "fp16-overflow": ("broken", "fp16 loss-scale overflow storm: skipped steps, scale at its floor, frozen LR"),
    "masked-labels": ("broken", "no supervised tokens: template / tokenization mismatch, truncation, "
                                "image-token mismatch"),
    "nonfinite-hidden": ("broken", "NaN/Inf disguised: loss logged as 0.0 by the Trainer's NaN filter, "
                                   "or grad_norm pinned at a DeepSpeed sentinel (1.0, sqrt 2, sqrt 3, ...)"),
    "nonfinite": ("broken", "loss or gradients are NaN/Inf and the log shows it"),
    "no-grad-flow": ("broken", "gradient norm 0 while loss is non-zero: nothing trainable receives gradient"),
    "lr-zero": ("broken", "learning rate 0 or frozen after warmup should have moved it"),
    "divergence": ("broken", "loss blows up and does not come back"),
    "zero-loss": ("broken", "loss exactly 0 and nothing else tells which kind"),
    "not-learning": ("broken", "loss flat, repeating or at chance level: the model is not learning (weights not "
                               "updated, nothing to learn, or a learning rate too small to matter)"),
    "loss-spike": ("warning", "isolated spikes that recover"),
    "memorization": ("healthy", "loss legitimately tiny (fast decay, finite varying grads)"),
}

PRECEDENCE = list(SIGNATURES)

# Signatures that are one death seen two ways: the onset is the earliest step of either. A grad norm
# that turns NaN one log before the loss shows 0.0 is the same event.
RELATED: dict[str, tuple[str, ...]] = {
    "nonfinite-hidden": ("nonfinite",),
    "nonfinite": ("nonfinite-hidden",),
}


def finding_verdict(signature: str | None, severity: int) -> str:
    """The verdict one finding implies; the diagnosis's verdict and `halt_on="broken"` / `"warning"` in the
    guard and in `watch` all mean this. Broken: an error or worse whose signature means a dead run;
    warning: any other finding at warning or worse; healthy otherwise."""
    from lossguard.core.findings import Severity

    if severity >= Severity.ERROR and SIGNATURES.get(signature, ("broken",))[0] == "broken":
        return "broken"
    return "warning" if severity >= Severity.WARNING else "healthy"
