"""Apply fix edits to a config while keeping the user's key order, indentation and comments.

JSON and block YAML are edited in the text at the span of the key; after every edit the text is
parsed again and compared with the same edit applied to the dict. If they ever disagree (an exotic
layout), the file is re-dumped with the detected indentation instead, with a warning.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from lossguard.lint.document import Document, parse_text
from lossguard.lint.rules.base import Edit

Path = tuple[str, ...]


def apply_to_dict(config: dict[str, Any], edits: list[Edit] | tuple[Edit, ...]) -> dict[str, Any]:
    out = copy.deepcopy(config)
    for edit in edits:
        node = out
        for key in edit.path[:-1]:
            if not isinstance(node.get(key), dict):
                if edit.op == "delete":
                    break
                node[key] = {}
            node = node[key]
        else:
            if edit.op == "set":
                node[edit.path[-1]] = copy.deepcopy(edit.value)
            else:
                node.pop(edit.path[-1], None)
    return out


def apply_to_text(doc: Document, edits: list[Edit]) -> tuple[str, list[str]]:
    """The edited text and warnings; the text parses to `apply_to_dict(doc.data, edits)`."""
    expected = apply_to_dict(doc.data, edits)
    current = doc
    try:
        for edit in edits:
            text = _edit(current, edit)
            current = parse_text(text, doc.source, doc.fmt)
        if current.data == expected:
            return current.text, []
    except Exception:  # any layout surprise: fall back to a faithful re-dump below
        pass
    return _redump(doc, expected), [f"{doc.source}: could not edit in place; re-wrote the file (key order kept, "
                                    "comments and custom layout lost)"]


def _edit(doc: Document, edit: Edit) -> str:
    if doc.fmt == "yaml" and not doc.block_style:
        raise ValueError("flow-style YAML")
    span = doc.spans.get(edit.path)
    if edit.op == "delete":
        return doc.text if span is None else (_delete_json if doc.fmt == "json" else _delete_yaml)(doc, edit.path)
    if span is not None and not (isinstance(edit.value, dict) and isinstance(_value_at(doc.data, edit.path), dict)):
        indent = _indent_of(doc.text, span.key_start) or ""
        rendered = _render_json(edit.value, indent, _unit(doc)) if doc.fmt == "json" else _render_yaml_inline(edit.value)
        return doc.text[:span.value_start] + rendered + doc.text[span.value_end:]
    # Insert below the deepest existing object on the path.
    depth = len(edit.path) - 1
    while depth > 0 and not isinstance(_value_at(doc.data, edit.path[:depth]), dict):
        depth -= 1
    if depth > 0 and edit.path[:depth] not in doc.spans:
        raise ValueError("parent without a span")
    value: Any = edit.value
    for key in reversed(edit.path[depth + 1:]):
        value = {key: value}
    insert = _insert_json if doc.fmt == "json" else _insert_yaml
    return insert(doc, edit.path[:depth], edit.path[depth], value)


def _value_at(data: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def _indent_of(text: str, pos: int | None) -> str | None:
    """The whitespace before `pos` on its line, or None if other text precedes it."""
    if pos is None:
        return None
    segment = text[_line_start(text, pos):pos]
    return segment if not segment.strip() else None


def _unit(doc: Document) -> str:
    for path, span in sorted(doc.spans.items(), key=lambda kv: kv[1].value_start):
        if len(path) == 1:
            indent = _indent_of(doc.text, span.key_start)
            if indent:
                return indent
    return "  " if doc.fmt == "yaml" else "    "


def _render_json(value: Any, indent: str, unit: str) -> str:
    if isinstance(value, (dict, list)) and value:
        return json.dumps(value, indent=unit, ensure_ascii=False).replace("\n", "\n" + indent)
    return json.dumps(value, ensure_ascii=False)


def _insert_json(doc: Document, parent: Path, key: str, value: Any) -> str:
    text, unit = doc.text, _unit(doc)
    children = doc.children(parent)
    if children:
        last = doc.spans[children[-1]]
        indent = _indent_of(text, last.key_start)
        member = f'"{key}": ' + _render_json(value, indent or "", unit)
        sep = ", " if indent is None else ",\n" + indent
        return text[:last.value_end] + sep + member + text[last.value_end:]
    span = doc.spans[parent]
    open_at = text.index("{", span.value_start)
    close_at = text.index("}", open_at)
    line = text[_line_start(text, open_at):open_at]
    base = line[: len(line) - len(line.lstrip())]
    inner = base + unit
    member = f'"{key}": ' + _render_json(value, inner, unit)
    return text[:open_at] + "{\n" + inner + member + "\n" + base + "}" + text[close_at + 1:]


def _delete_json(doc: Document, path: Path) -> str:
    text = doc.text
    span = doc.spans[path]
    start, end = span.key_start, span.value_end
    i = end
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == ",":  # not the last member: drop the member and its comma
        end = i + 1
        ls = _line_start(text, start)
        rest_end = text.find("\n", end)
        rest_end = len(text) if rest_end < 0 else rest_end
        if not text[ls:start].strip() and not text[end:rest_end].strip():
            return text[:ls] + text[rest_end + 1:]
        while end < len(text) and text[end] == " ":
            end += 1
        return text[:start] + text[end:]
    j = start - 1  # the last member: drop the comma before it
    while j >= 0 and text[j] in " \t\r\n":
        j -= 1
    if j >= 0 and text[j] == ",":
        return text[:j] + text[end:]
    return text[:start] + text[end:]


def _render_yaml_inline(value: Any) -> str:
    import yaml

    out = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, sort_keys=False)
    return out.removesuffix("\n...\n").strip()


def _insert_yaml(doc: Document, parent: Path, key: str, value: Any) -> str:
    import yaml

    text = doc.text
    children = doc.children(parent)
    if not children:
        raise ValueError("empty YAML mapping")
    first, last = doc.spans[children[0]], doc.spans[children[-1]]
    indent = _indent_of(text, first.key_start)
    if indent is None:
        raise ValueError("YAML key not at line start")
    if isinstance(value, dict):
        body = yaml.safe_dump(value, default_flow_style=False, sort_keys=False, indent=max(len(_unit(doc)), 2))
        unit = _unit(doc)
        block = "\n".join(indent + unit + line for line in body.rstrip("\n").split("\n"))
        new = f"{indent}{key}:\n{block}"
    else:
        new = f"{indent}{key}: {_render_yaml_inline(value)}"
    pos = _content_end(text, last.value_end)
    line_end = text.find("\n", pos)
    if line_end < 0:
        return text + "\n" + new + "\n"
    return text[:line_end + 1] + new + "\n" + text[line_end + 1:]


def _content_end(text: str, pos: int) -> int:
    while pos > 0 and text[pos - 1] in " \t\r\n":
        pos -= 1
    return pos


def _delete_yaml(doc: Document, path: Path) -> str:
    text = doc.text
    span = doc.spans[path]
    start = _line_start(text, span.key_start)
    end = text.find("\n", _content_end(text, span.value_end))
    return text[:start] + ("" if end < 0 else text[end + 1:])


def _redump(doc: Document, data: dict[str, Any]) -> str:
    if doc.fmt == "json":
        return json.dumps(data, indent=_unit(doc), ensure_ascii=False) + "\n"
    import yaml

    return yaml.safe_dump(data, default_flow_style=False, sort_keys=False)
