"""Safe config loading (issue #16): a 500-byte YAML alias bomb stays a 500-byte problem, nesting and
self-reference are refused by name, numbers that do not fit become a warning about the value, and the
line/column lookup is linear in the file (a 150k-key config took minutes). Inputs built here."""

from __future__ import annotations

import json
import time

import pytest

from lossguard.lint.document import MAX_NODES, ConfigError, parse_text


def _alias_bomb(levels: int = 9) -> str:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(levels):
        name, previous = chr(98 + level), chr(97 + level)
        lines.append(f"{name}: &{name} [{', '.join(['*' + previous] * 10)}]")
    return "\n".join(lines) + "\n"


def _cpu(action) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        action()
        best = min(best, time.process_time() - start)
    return best


def test_an_alias_bomb_is_refused_at_the_cost_of_its_size():
    bomb = _alias_bomb()
    assert len(bomb) < 500 and MAX_NODES < 10 ** 10  # expands to 10^10 values
    with pytest.raises(ConfigError, match=r"bomb\.yaml: .*alias"):
        parse_text(bomb, "bomb.yaml", "yaml")
    plain = "\n".join(f"k{i}: [x, x, x, x, x, x, x, x, x, x]" for i in range(10)) + "\n"

    def refuse():
        with pytest.raises(ConfigError):
            parse_text(bomb, "bomb.yaml", "yaml")

    # The refusal costs what parsing a plain document of the same size does, not the expansion.
    assert _cpu(refuse) < 20 * _cpu(lambda: parse_text(plain, "plain.yaml", "yaml")) + 0.01


def test_aliases_within_budget_still_load():
    doc = parse_text("base: &b {stage: 2}\nzero_optimization: *b\n", "ok.yaml", "yaml")
    assert doc.data["zero_optimization"] == {"stage": 2}


@pytest.mark.parametrize(("text", "fmt", "needle"), [
    ("a: &a [1, *a]\n", "yaml", "itself"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "yaml", "nest"),
    ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 150)) + "  " * 150 + "v: 1\n", "yaml", "nested"),
    ('{"a": ' + "[" * 50000 + "]" * 50000 + "}", "json", "nesting"),
])
def test_self_reference_and_deep_nesting_are_named_refusals(text, fmt, needle):
    with pytest.raises(ConfigError, match=needle) as info:
        parse_text(text, f"cfg.{fmt}", fmt)
    assert str(info.value).startswith(f"cfg.{fmt}: ")


def test_numbers_that_do_not_fit_are_warnings_about_the_value():
    text = ('{"train_batch_size": ' + "9" * 5000 + ',\n "zero_optimization": {"reduce_bucket_size": 1e999},\n'
            ' "gradient_clipping": NaN, "steps": 99999999999999999999999, "lr": 1e-5}')
    doc = parse_text(text, "huge.json", "json")
    warnings = "\n".join(doc.warnings)
    assert "huge.json:1: train_batch_size = 999999999999... (5000 characters) does not fit" in warnings
    assert "huge.json:2: zero_optimization.reduce_bucket_size = 1e999 is not a finite number" in warnings
    assert "gradient_clipping = NaN" in warnings and "steps = 99999999999999999999999" in warnings
    assert "lr" not in warnings.replace("lr.", "")  # an ordinary number is not flagged
    assert doc.data["train_batch_size"] == float("inf")


def test_the_line_lookup_is_linear_in_the_file():
    def config(keys: int) -> str:
        return json.dumps({"zero_optimization": {"stage": 2}, "extra": {f"k{i}": i for i in range(keys)}}, indent=2)

    small, big = config(10_000), config(40_000)
    doc = parse_text(big, "big.json", "json")
    assert doc.spans[("extra", "k39999")].line == 40_005 and doc.line_of(("extra", "k5")) == 11
    ratio = _cpu(lambda: parse_text(big, "big.json", "json")) / _cpu(lambda: parse_text(small, "s.json", "json"))
    assert ratio < 8, ratio  # 4x the keys: ~4x the time (it was ~16x: a newline count per key)


def test_a_lint_of_a_huge_number_is_a_finding_not_an_internal_error(cli, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text('{"train_batch_size": ' + "9" * 5000 + ', "zero_optimization": {"stage": 2}}')
    proc = cli("lint", config)
    err = proc.stderr.decode()
    assert proc.returncode in (0, 1) and "internal error" not in err and "train_batch_size" in err, err
