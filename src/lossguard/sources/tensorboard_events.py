"""TensorBoard event files, read with the `tensorboard` package's own loader (no hand-written decoder)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lossguard.core.records import EVAL, TRAIN, Record
from lossguard.sources.base import SourceError
from lossguard.sources.vocabulary import meaning


class TensorBoardSource:
    name = "tensorboard"

    def sniff(self, path: Path, head: bytes) -> bool:
        return "tfevents" in path.name

    def parse(self, path: Path) -> Iterator[Record]:
        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        except ImportError:
            from lossguard.install_hint import install_command

            raise SourceError(f"{path}: reading TensorBoard files needs the `tensorboard` package; "
                              f"install it with `{install_command('tensorboard')}`") from None
        pending: dict[int, dict[str, float]] = {}
        order: list[int] = []
        try:
            for event in EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    number = _scalar(value)
                    name = meaning(value.tag).catalog
                    if name is None or number is None:
                        continue
                    if event.step not in pending:
                        pending[event.step] = {}
                        order.append(event.step)
                    pending[event.step][name] = number
        except Exception as exc:  # the loader raises DataLossError and friends on a damaged file
            if not pending:
                raise SourceError(f"{path}: could not read TensorBoard events ({type(exc).__name__}: {exc})") from None
        # One record per step and kind; HF writes `train/*` and `eval/*` tags at the same step.
        for step in sorted(order):
            signals = pending[step]
            train = {k: v for k, v in signals.items() if k != "eval_loss"}
            if train:
                yield Record(step=step, signals=train, kind=TRAIN, source=path.name)
            if "eval_loss" in signals:
                yield Record(step=step, signals={"eval_loss": signals["eval_loss"]}, kind=EVAL, source=path.name)


def _scalar(value) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and value.tensor.float_val:
        return float(value.tensor.float_val[0])
    if value.HasField("tensor") and value.tensor.double_val:
        return float(value.tensor.double_val[0])
    if value.HasField("tensor") and value.tensor.tensor_content and value.tensor.dtype == 1:
        import struct

        return struct.unpack("<f", value.tensor.tensor_content[:4])[0]
    return None
