"""lossguard: keep DeepSpeed / Hugging Face fine-tuning runs from dying silently.

The pure part (records, detectors, diagnosis, log sources, lint) imports no torch. The live guard
(`LossguardCallback`, `LossguardLightningCallback`, `attach`, `Guard`) is imported lazily so
`import lossguard` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "LossguardCallback": "lossguard.monitor.adapters.hf",
    "LossguardLightningCallback": "lossguard.monitor.adapters.lightning",
    "attach": "lossguard.monitor.adapters.deepspeed",
    "Guard": "lossguard.monitor.guard",
    "LossguardHalt": "lossguard.monitor.guard",
    "RecoverOptions": "lossguard.monitor.options",
    "analyze": "lossguard.api",
}


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'lossguard' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)


__all__ = ["__version__", *_LAZY]
