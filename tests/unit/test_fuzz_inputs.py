"""Seeded mutants of real-shaped logs through the real `lossguard analyze` entry point: every one ends in a
verdict or a one-line refusal (exit 0, 1 or 2), never in "internal error" (issue #16: 11 of 300 did)."""

from __future__ import annotations

import csv
import io
import json
import random
import re

import pytest

from lossguard.cli.main import main
from tests.conftest import FIXTURES

EXCERPTS = FIXTURES / "excerpts"
REAL = FIXTURES / "real"
MUTANTS = 300


def _seeds() -> list[tuple[str, bytes]]:
    """Real-shaped inputs: stdout logs, JSONL, trainer_state.json, a raw JSON list and a CSV."""
    seeds = [(p.name, p.read_bytes()) for p in sorted(EXCERPTS.glob("*.log")) + sorted(EXCERPTS.glob("*.jsonl"))]
    seeds.append(("trainer_state.json", (REAL / "healthy-bf16" / "trainer_state.json").read_bytes()))
    seeds.append(("raw_log.json", (REAL / "healthy-raw" / "raw_log.json").read_bytes()[:6000]))
    seeds.append(("stdout.log", (REAL / "fp16-overflow" / "stdout.log").read_bytes()[:20000]))
    rows = io.StringIO()
    writer = csv.writer(rows)
    writer.writerow(["step", "loss", "grad_norm", "learning_rate"])
    for step in range(1, 41):
        writer.writerow([step, 2.5 - step * 0.01, 1.0 + step % 3 * 0.1, 1e-5])
    seeds.append(("metrics.csv", rows.getvalue().encode()))
    seeds.append(("events-rank0.jsonl", _events_file()))
    return seeds


def _events_file() -> bytes:
    """The live guard's events file, written by its own sink."""
    import tempfile

    from lossguard.core.records import EVENT, Record
    from lossguard.monitor.sinks import JsonlSink, record_line

    with tempfile.TemporaryDirectory() as folder:
        sink = JsonlSink(folder, 0, {"world_size": 1})
        for step in range(1, 31):
            loss = float("nan") if step >= 20 else 2.5 - step * 0.01
            sink.write(record_line(Record(step, 0, {"loss": loss, "grad_norm": 1.0 + step % 3 * 0.1})))
        sink.write(record_line(Record(20, 0, kind=EVENT, event="overflow", data={"scale": 1024.0})))
        sink.close()
        return sink.path.read_bytes()


_ODD_VALUES = [b"9" * 5000, b"1e999", b"-1e999", b"1.7976931348623157e309", b"4e-324", b"\x00", b"\x00" * 64, b"nan", b"-inf", b"1e-400", b"0x1p3",
               b"\xff\xfe", b"\"", b"{", b"]", b"\n", b"1" + b"0" * 400 + b".5", b"-0.0", b"NaN", b"Infinity"]


_NUMBER = re.compile(rb"\d+(?:\.\d+)?(?:e-?\d+)?")


def _odd_numbers(data: bytes, rng: random.Random) -> bytes:
    """A few numbers (steps, losses, epochs) replaced by values that do not fit: 5000 digits, 1e999, nan."""
    spans = [m.span() for m in _NUMBER.finditer(data)]
    for start, end in sorted(rng.sample(spans, min(len(spans), rng.randint(1, 3))), reverse=True):
        data = data[:start] + rng.choice(_ODD_VALUES) + data[end:]
    return data


def _mutate(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.4:
        data = _odd_numbers(data, rng)
    data = bytearray(data)
    for _ in range(rng.randint(0, 3)):
        if not data:
            break
        kind = rng.randrange(5)
        where = rng.randrange(len(data))
        if kind == 0:  # byte flip
            data[where] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut
            del data[where:]
        elif kind == 2:  # odd value spliced over a number
            data[where:where + rng.randint(1, 8)] = rng.choice(_ODD_VALUES)
        elif kind == 3:  # NUL run
            data[where:where] = b"\x00" * rng.randint(1, 32)
        else:  # a copied span (duplicated lines, broken nesting)
            other = rng.randrange(len(data))
            data[where:where] = data[other:other + rng.randint(1, 400)]
    return bytes(data)


def _cases():
    rng = random.Random(16)
    seeds = _seeds()
    for number in range(MUTANTS):
        name, data = seeds[number % len(seeds)]
        fmt = ("human", "json", "html")[number % 3]
        yield number, name, _mutate(data, rng), fmt


def _strict_json(text: str) -> bool:
    """json.loads takes NaN and Infinity; a JSON consumer (jq, JavaScript) does not."""
    def refuse(constant):
        raise ValueError(constant)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


def test_no_mutant_ends_in_an_internal_error(tmp_path, capsys):
    failures = []
    for number, name, data, fmt in _cases():
        target = tmp_path / f"{number}-{name}"
        target.write_bytes(data)
        args = ["analyze", str(target)]
        if fmt == "json":
            args += ["--format", "json"]
        elif fmt == "html":
            args += ["--html", str(tmp_path / f"{number}.html")]
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        code = exit_info.value.code or 0
        out, err = capsys.readouterr()
        if "internal error" in err or code not in (0, 1, 2) or (code == 2 and target.name not in err):
            failures.append(f"{target.name} ({fmt}): exit {code}: {err.strip()[:300]}")
        elif fmt == "json" and code != 2 and not _strict_json(out):
            failures.append(f"{target.name}: the JSON report is not strict JSON: {out[:300]}")
    assert not failures, f"{len(failures)} of {MUTANTS}:\n" + "\n".join(failures)


def test_most_mutants_are_still_read_as_logs(tmp_path):
    """The fuzz is worth something only if most mutants still parse: most end in a verdict, not a refusal."""
    from lossguard.api import analyze
    from lossguard.sources.base import SourceError

    read = 0
    for number, name, data, _ in list(_cases())[:60]:
        target = tmp_path / f"{number}-{name}"
        target.write_bytes(data)
        try:
            analyze([target])
        except SourceError:
            continue
        read += 1
    assert read >= 40, read
