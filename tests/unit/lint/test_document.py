"""Config loading (positions, lenient JSON, errors) and in-place fixes that keep the user's layout."""

from __future__ import annotations

import json

import pytest

from lossguard.lint.document import ConfigError, load_config, parse_text, read_document
from lossguard.lint.fix import apply_to_text
from lossguard.lint.rules.base import delete, set_


def test_strict_json_no_warning(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}')
    data, warnings = load_config(str(path))
    assert data == json.loads(path.read_text()) and warnings == []


def test_comments_and_trailing_commas_read_with_warning(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{\n  // ZeRO-2\n  "zero_optimization": {"stage": 2, /* x */ "overlap_comm": true,},\n  "a": [1, 2,],\n}\n')
    data, warnings = load_config(str(path))
    assert data == {"zero_optimization": {"stage": 2, "overlap_comm": True}, "a": [1, 2]}
    assert len(warnings) == 1 and "comments and trailing commas" in warnings[0]


def test_duplicate_key_warns(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"a": 1,\n "a": 2}')
    data, warnings = load_config(str(path))
    assert data == {"a": 2} and "ds.json:2" in warnings[0] and "duplicate" in warnings[0]


@pytest.mark.parametrize(("text", "line"), [('{\n  "a": 1\n  "b": 2\n}', 3), ('{\n\n  "a": tru\n}', 3),
                                            ("{\n 'a': 1}", 2), ('{"a": 1', 1)])
def test_invalid_json_names_the_line(tmp_path, text, line):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert f"bad.json: line {line}" in str(err.value)


def test_yaml_and_errors(tmp_path):
    good = tmp_path / "ds.yaml"
    good.write_text("zero_optimization:\n  stage: 2\n")
    assert load_config(str(good))[0] == {"zero_optimization": {"stage": 2}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\n b: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+ column \d+: invalid YAML"):
        load_config(str(bad))


@pytest.mark.parametrize("text", ["[1, 2]", "3", '"x"'])
def test_top_level_must_be_mapping(tmp_path, text):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(str(path))


def test_missing_directory_empty(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path))
    (tmp_path / "e.json").write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        load_config(str(tmp_path / "e.json"))


def test_line_of_path():
    doc = parse_text('{\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_comm": true\n  }\n}', "x.json", "json")
    assert doc.line_of(("zero_optimization", "overlap_comm")) == 4
    assert doc.line_of(("zero_optimization", "missing")) == 2


JSON = """{
    "bf16": {
        "enabled": "auto"
    },
    // keep me
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": true,
        "reduce_bucket_size": "auto"
    },
    "communication_data_type": "fp32",
    "steps_per_print": 100
}
"""


def _fix(text, fmt, edits):
    doc = parse_text(text, "x", fmt)
    new, warnings = apply_to_text(doc, edits)
    assert warnings == []
    return new


def test_json_set_insert_delete_keep_layout():
    new = _fix(JSON, "json", [set_("zero_optimization.overlap_comm", False), set_("bf16.check_grad_overflow", True),
                              delete("communication_data_type"), delete("steps_per_print"),
                              set_("new.nested.key", 1)])
    assert "// keep me" in new
    assert '        "overlap_comm": false,\n' in new
    assert '        "enabled": "auto",\n        "check_grad_overflow": true\n    },' in new
    assert "communication_data_type" not in new and "steps_per_print" not in new
    assert '"new": {\n        "nested": {\n            "key": 1\n        }\n    }\n}' in new
    parse_text(new, "x", "json")


def test_json_inline_and_empty_objects():
    assert json.loads(_fix('{"a": {"b": 1}, "c": {}}', "json", [set_("a.d", 2), set_("c.e", 3)])) == \
        {"a": {"b": 1, "d": 2}, "c": {"e": 3}}
    assert _fix('{"a": 1, "b": 2}', "json", [delete("a")]) == '{"b": 2}'
    assert _fix('{\n  "a": 1,\n  "b": 2\n}', "json", [delete("b")]) == '{\n  "a": 1\n}'


def test_yaml_edits_keep_comments():
    text = "# ds config\nzero_optimization:\n  stage: 2  # two\n  overlap_comm: true\nbf16:\n  enabled: auto\n"
    new = _fix(text, "yaml", [set_("zero_optimization.overlap_comm", False), set_("bf16.check_grad_overflow", True),
                              set_("steps_per_print", 10), delete("zero_optimization.stage")])
    assert new == ("# ds config\nzero_optimization:\n  overlap_comm: false\nbf16:\n  enabled: auto\n"
                   "  check_grad_overflow: true\nsteps_per_print: 10\n")


def test_flow_yaml_falls_back_to_redump():
    doc = parse_text("zero_optimization: {stage: 2, overlap_comm: true}\n", "x.yaml", "yaml")
    new, warnings = apply_to_text(doc, [set_("zero_optimization.overlap_comm", False)])
    assert warnings and parse_text(new, "x", "yaml").data == {"zero_optimization": {"stage": 2, "overlap_comm": False}}


def test_read_document_sniffs_format(tmp_path):
    path = tmp_path / "ds_config"
    path.write_text("zero_optimization:\n  stage: 3\n")
    assert read_document(str(path)).fmt == "yaml"
