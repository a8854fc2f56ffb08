"""Writes the format-zoo excerpts of torchtitan, verl, OLMo, Composer and MaxText logs
(tests/fixtures/excerpts/formats/): each line in the shape the named function prints (see that folder's
README for the package version it was read from), with generated numbers.

    python scripts/make_zoo_tool_logs.py
"""

from __future__ import annotations

import math
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "excerpts" / "formats"
rng = random.Random(7)


def w(name: str, lines: list[str]) -> None:
    (OUT / name).write_text("\n".join(lines) + "\n")


def torchtitan() -> None:
    """torchtitan 0.3.0 components/metrics.py MetricsProcessor.log / log_validation, colours on."""
    red, green, orange, turquoise, blue, cyan, magenta, yellow, reset = (
        "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[34m", "\x1b[96m", "\x1b[35m", "\x1b[33m", "\x1b[39m")
    lines = []
    loss = 10.9
    for step in range(1, 21):
        dead = step >= 12
        loss = loss * 0.93 + rng.uniform(-0.05, 0.05)
        shown = "     nan" if dead else f"{loss:8.5f}"
        norm = "    nan" if dead else f"{rng.uniform(1.5, 4):7.4f}"
        lines.append(f"[rank0]:[titan] 2025-06-02 09:14:{step:02d},511 - root - INFO - {red}step: {step:2}  {green}loss: {shown}  "
                     f"{orange}grad_norm: {norm}  {turquoise}memory: 41.27GiB(43.44%)  {blue}tps: {rng.randint(5200, 5600):,}  "
                     f"{cyan}tflops: 301.44  {magenta}mfu: 30.48%{reset}")
        if step % 10 == 0:
            lines.append(f"[rank0]:[titan] 2025-06-02 09:14:{step:02d},900 - root - INFO - {yellow}validate step: {step:2}  "
                         f"{green}loss: {('    nan' if dead else f'{loss + 0.1:7.4f}')}  {turquoise}memory: 41.27GiB(43.44%)  "
                         f"{blue}tps: 12,345{reset}")
    w("torchtitan_ansi_nan_broken.log", lines)


def verl(name: str, dead_from: int | None) -> None:
    """verl 0.9.1 utils/logger/aggregate_logger.py concat_dict_to_str, printed by the Ray driver."""
    lines = []
    for step in range(1, 16):
        dead = dead_from is not None and step >= dead_from
        entropy = 0.62 - step * 0.004
        lines.append(f"(TaskRunner pid=48211) step:{step} - global_seqlen/mean:{rng.randint(180000, 190000)}.0 - "
                     f"actor/entropy:{'nan' if dead else f'{entropy:.6f}'} - "
                     f"actor/pg_loss:{'nan' if dead else f'{rng.uniform(-0.02, 0.02):.6f}'} - "
                     f"actor/pg_clipfrac:{rng.uniform(0.001, 0.004):.6f} - actor/ppo_kl:{rng.uniform(-1e-4, 1e-4):.8f} - "
                     f"actor/grad_norm:{'nan' if dead else f'{rng.uniform(0.1, 0.4):.6f}'} - actor/lr:1e-06 - "
                     f"critic/score/mean:{0.0 if dead else 0.2 + step * 0.02:.6f} - "
                     f"critic/rewards/mean:{0.0 if dead else 0.2 + step * 0.02:.6f} - "
                     f"response_length/mean:{rng.uniform(300, 340):.3f} - timing_s/step:{rng.uniform(60, 70):.4f}")
    w(name, lines)


def olmo() -> None:
    """ai2-olmo 0.6.0 olmo/train.py Trainer.log_metrics_to_console (its format_float), OLMo's log format."""
    lines = []
    loss = 11.2
    for step in range(1, 13):
        loss = loss * 0.96
        dead = step >= 8

        def shown(value: float, dead: bool = dead) -> str:
            return "nan" if dead else (f"{value:.2f}" if value > 10 else f"{value:.3f}" if value > 1 else f"{value:.4f}")

        lines.append(f"2024-02-01 10:{step:02d}:07.118\tjupiter-cs-aus-112.reviz.ai2.in:0\tolmo.train:1231\tINFO\t"
                     f"[step={step}/739328,epoch=0]")
        lines += [f"    train/CrossEntropyLoss={shown(loss)}", f"    train/Perplexity={'nan' if dead else f'{math.exp(loss):,.0f}'}",
                  f"    throughput/total_tokens={step * 4194304:,}", f"    optim/total_grad_norm={shown(rng.uniform(0.8, 2.5))}",
                  "    System/Peak GPU Memory (MB)=41,012"]
    w("olmo_console_nan_broken.log", lines)


def composer() -> None:
    """mosaicml 0.32.1 composer/loggers/console_logger.py log_to_console, max_duration in batches."""
    lines = []
    loss = 2.61
    for batch in range(1, 9):
        loss = loss * 0.97
        lines += [f"[batch={batch}/4800]:", f"\t Train time/batch: {batch - 1}", f"\t Train time/sample: {(batch - 1) * 64}",
                  f"\t Train time/token: {(batch - 1) * 131072}", "\t Train memory/peak_allocated_mem: 61.2100",
                  "\t Train trainer/device_train_microbatch_size: 4", f"\t Train loss/train/total: {loss:.4f}",
                  f"\t Train metrics/train/LanguageCrossEntropy: {loss:.4f}", "\t Train throughput/batches_per_sec: 0.2512",
                  f"\t Train lr-DecoupledAdamW/group0: {min(batch, 5) * 1e-6:.4e}"]
    w("composer_console_batches_healthy.log", lines)


def maxtext() -> None:
    """MaxText train.py `completed step: ...` (MaxText is not on PyPI: the shape its README shows)."""
    lines = []
    loss = 10.87
    for step in range(0, 14):
        loss = loss * 0.95
        lines.append(f"completed step: {step}, seconds: {rng.uniform(1.2, 1.3):.3f}, TFLOP/s/device: {rng.uniform(150, 160):.3f}, "
                     f"Tokens/s/device: {rng.uniform(3300, 3400):.3f}, total_weights: 65536, "
                     f"loss: {'nan' if step >= 9 else f'{loss:.3f}'}")
    w("maxtext_completed_step_nan_broken.log", lines)


if __name__ == "__main__":
    torchtitan()
    verl("verl_grpo_healthy.log", None)
    verl("verl_grpo_nan_broken.log", 9)
    olmo()
    composer()
    maxtext()
