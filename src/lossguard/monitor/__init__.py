"""The live guard: collects per-rank signals inside a running job and feeds them to the detectors.

Entry points: `LossguardCallback` (HF Trainer, `adapters/hf.py`), `attach(engine)` (raw DeepSpeed,
`adapters/deepspeed.py`) and `Guard` (plain PyTorch / DDP loop, `guard.py`). They share `Monitor`
(`core.py`); `dist.py` is the only module that touches `torch.distributed`.
"""
