"""Config documents: the parsed dict plus where every key sits in the text.

JSON is read by a small position-keeping parser that also accepts what DeepSpeed's hjson reader
accepts in practice (`//`, `/* */` and `#` comments, trailing commas), with a warning. YAML positions
come from PyYAML's node marks. Positions serve two purposes: messages name `file:line`, and `--fix`
edits the text at the right span instead of re-dumping the file.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from lossguard.lint.tomldoc import TomlError, load_toml

Path = tuple[str, ...]


class ConfigError(ValueError):
    """An unreadable config: the message names the file, the line and the next step."""


@dataclass(slots=True)
class Span:
    key_start: int | None  # offset of the key token; None for the root
    value_start: int
    value_end: int
    line: int  # 1-based line of the key (or of the value for the root)


@dataclass(slots=True)
class Document:
    text: str
    fmt: str  # "json", "yaml" or "toml"
    data: dict[str, Any]
    source: str = "<config>"
    warnings: list[str] = field(default_factory=list)
    spans: dict[Path, Span] = field(default_factory=dict)
    block_style: bool = True  # YAML: False when some mapping is flow style (fix re-dumps then)

    def line_of(self, path: Path) -> int | None:
        """The line of the deepest existing key along `path`."""
        for i in range(len(path), 0, -1):
            span = self.spans.get(path[:i])
            if span is not None:
                return span.line
        return None

    def children(self, path: Path) -> list[Path]:
        return sorted((p for p in self.spans if len(p) == len(path) + 1 and p[: len(path)] == path),
                      key=lambda p: self.spans[p].value_start)


class _Lines:
    """Offset -> (line, column) by bisection over the line starts, found once: counting newlines from the
    start for every key made a 150k-key config take minutes."""

    def __init__(self, text: str):
        self.starts = [0]
        at = text.find("\n")
        while at >= 0:
            self.starts.append(at + 1)
            at = text.find("\n", at + 1)

    def line_col(self, offset: int) -> tuple[int, int]:
        index = bisect.bisect_right(self.starts, offset) - 1
        return index + 1, offset - self.starts[index] + 1


def _int_or_float(token: str) -> int | float:
    """Python refuses ints of more than 4300 digits; such a number is infinite as a float."""
    return int(token) if len(token) <= 4000 else float(token)


_NUMBERS = json.JSONDecoder(parse_int=_int_or_float)


class _JsonParser:
    """Recursive descent over JSON with comments and trailing commas; values match `json.loads`."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.lenient: list[str] = []
        self.duplicates: list[tuple[str, int]] = []
        self.spans: dict[Path, Span] = {}
        self.odd_numbers: list[tuple[str, int, str]] = []  # (dotted key, line, the number as written)
        self.lines = _Lines(text)

    def line(self, offset: int) -> int:
        return self.lines.line_col(offset)[0]

    def fail(self, what: str, offset: int | None = None) -> ConfigError:
        line, col = self.lines.line_col(self.pos if offset is None else offset)
        return ConfigError(f"line {line} column {col}: {what}")

    def skip(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            ch = text[self.pos]
            if ch in " \t\r\n\ufeff":
                self.pos += 1
            elif ch == "#" or text.startswith("//", self.pos):
                self.lenient.append("comments")
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            elif text.startswith("/*", self.pos):
                self.lenient.append("comments")
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise self.fail("unterminated /* comment")
                self.pos = end + 2
            else:
                return

    def parse(self) -> Any:
        self.skip()
        value = self.value(())
        self.skip()
        if self.pos < len(self.text):
            raise self.fail(f"unexpected text after the top-level value: {self.text[self.pos:self.pos + 20]!r}")
        return value

    def value(self, path: Path) -> Any:
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of file")
        ch = self.text[self.pos]
        if ch == "{":
            return self.obj(path)
        if ch == "[":
            return self.array(path)
        if ch == '"':
            return self.string()
        return self.literal(path)

    def string(self) -> str:
        start = self.pos
        i = start + 1
        text = self.text
        while True:
            end = text.find('"', i)
            if end < 0 or "\n" in text[i:end]:
                raise self.fail("unterminated string", start)
            backslashes = 0
            j = end - 1
            while text[j] == "\\":
                backslashes += 1
                j -= 1
            if backslashes % 2 == 0:
                break
            i = end + 1
        self.pos = end + 1
        try:
            return json.loads(text[start:self.pos])
        except json.JSONDecodeError as exc:
            raise self.fail(f"bad string: {exc.msg}", start) from None

    def literal(self, path: Path) -> Any:
        start = self.pos
        text = self.text
        while self.pos < len(text) and text[self.pos] not in ",}]:\n\r\t /#":
            self.pos += 1
        token = text[start:self.pos]
        if not token:
            raise self.fail(f"expected a value, found {text[start]!r}", start)
        try:
            value = _NUMBERS.decode(token)  # numbers, true, false, null; NaN/Infinity as json does
        except ValueError:
            hint = " (strings need double quotes)" if token[:1].isalpha() or token[:1] == "'" else ""
            raise self.fail(f"expected a value, found {token!r}{hint}", start) from None
        if isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and abs(value) >= 2**63:
            self.odd_numbers.append((".".join(path), self.line(start), token))
        return value

    def obj(self, path: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.pos += 1
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return out
        while True:
            self.skip()
            if self.text.startswith("}", self.pos):  # trailing comma
                self.lenient.append("trailing commas")
                self.pos += 1
                return out
            if not self.text.startswith('"', self.pos):
                raise self.fail("expected a double-quoted key")
            key_start = self.pos
            key = self.string()
            self.skip()
            if not self.text.startswith(":", self.pos):
                raise self.fail(f"expected ':' after key {key!r}")
            self.pos += 1
            self.skip()
            value_start = self.pos
            child = (*path, key)
            if key in out:
                self.duplicates.append((".".join(child), self.line(key_start)))
            out[key] = self.value(child)
            self.spans[child] = Span(key_start, value_start, self.pos, self.line(key_start))
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                continue
            if self.text.startswith("}", self.pos):
                self.pos += 1
                return out
            raise self.fail(f"expected ',' or '}}' after the value of {'.'.join(child)!r}")

    def array(self, path: Path) -> list[Any]:
        out: list[Any] = []
        self.pos += 1
        while True:
            self.skip()
            if self.text.startswith("]", self.pos):
                if out and self.text[self._prev_nonspace()] == ",":
                    self.lenient.append("trailing commas")
                self.pos += 1
                return out
            out.append(self.value((*path, str(len(out)))))
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif not self.text.startswith("]", self.pos):
                raise self.fail("expected ',' or ']' in a list")

    def _prev_nonspace(self) -> int:
        i = self.pos - 1
        while i > 0 and self.text[i] in " \t\r\n":
            i -= 1
        return i


def parse_json(text: str, source: str) -> Document:
    parser = _JsonParser(text)
    try:
        data = parser.parse()
    except RecursionError:
        raise ConfigError("nesting too deep") from None
    doc = Document(text=text, fmt="json", data=data, source=source, spans=parser.spans)
    doc.spans[()] = Span(None, _first_value(text), len(text.rstrip()), 1)
    if parser.lenient:
        kinds = " and ".join(sorted(set(parser.lenient)))
        doc.warnings.append(f"{source}: not strict JSON ({kinds}); read leniently as DeepSpeed's hjson reader "
                            "does, but json.load() in other tools will reject it")
    for key, line, token in parser.odd_numbers:
        shown = token if len(token) <= 24 else f"{token[:12]}... ({len(token)} characters)"
        integer = token.lstrip("+-").isdigit()
        what = "does not fit a 64-bit integer" if integer else "is not a finite number"
        doc.warnings.append(f"{source}:{line}: {key or 'a value'} = {shown} {what}; DeepSpeed and torch "
                            "refuse or overflow on it: write the value you mean")
    for key, line in parser.duplicates:
        doc.warnings.append(f"{source}:{line}: duplicate key {key!r}; the last value wins here, "
                            "DeepSpeed refuses duplicate keys")
    return doc


def _first_value(text: str) -> int:
    brace = text.find("{")
    return max(brace, 0)


def parse_yaml(text: str, source: str) -> Document:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        root = loader.get_single_node()  # parsed once; the data is built from these nodes
        _check_expansion(root)
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    doc = Document(text=text, fmt="yaml", data=data, source=source)
    if isinstance(root, yaml.MappingNode):
        doc.spans[()] = Span(None, root.start_mark.index, root.end_mark.index, 1)
        _yaml_spans(root, (), doc)
    return doc


# A config is a few hundred values. Aliases (`*a`) share one node, but everything that walks the data
# (the rules, `--fix`, printing) sees every use: ten levels of ten aliases are 10^10 values from 500 bytes.
MAX_NODES = 1_000_000
MAX_DEPTH = 100


def _check_expansion(root: Any) -> None:
    """Refuse a YAML document that expands, through aliases, to more than MAX_NODES values or nests
    deeper than MAX_DEPTH; linear in the distinct nodes (each node's expanded size is computed once)."""
    sizes: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()  # expanded, not finished: meeting one again is a cycle
    order = [(root, False)] if root is not None else []
    while order:  # iterative post-order: a deep document must not exhaust the Python stack
        node, done = order.pop()
        if id(node) in sizes:
            continue
        children = _child_nodes(node)
        if not done:
            if any(id(child) in open_nodes for child in children) or id(node) in open_nodes:
                raise ConfigError("the YAML contains itself through an alias (*name inside its own &name); "
                                  "write the values out")
            open_nodes.add(id(node))
            order.append((node, True))
            order.extend((child, False) for child in children if id(child) not in sizes)
            continue
        open_nodes.discard(id(node))
        size = 1 + sum(sizes[id(c)][0] for c in children if id(c) in sizes)
        depth = 1 + max((sizes[id(c)][1] for c in children if id(c) in sizes), default=0)
        if size > MAX_NODES:
            raise ConfigError(f"the YAML expands through its aliases (*name) to more than {MAX_NODES:,} values "
                              "(an alias bomb?); write the values out")
        if depth > MAX_DEPTH:
            raise ConfigError(f"nested deeper than {MAX_DEPTH} levels")
        sizes[id(node)] = (size, depth)


def _child_nodes(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _yaml_spans(node: Any, path: Path, doc: Document) -> None:
    import yaml

    if node.flow_style:
        doc.block_style = False
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        child = (*path, str(key_node.value))
        doc.spans[child] = Span(key_node.start_mark.index, value_node.start_mark.index, value_node.end_mark.index,
                                key_node.start_mark.line + 1)
        if isinstance(value_node, yaml.MappingNode):
            _yaml_spans(value_node, child, doc)


def sniff_format(path: str, text: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in (".yaml", ".yml"):
        return "yaml"
    if ext in (".json", ".jsonc", ".hjson", ".toml"):
        return "toml" if ext == ".toml" else "json"
    return "json" if text.lstrip().startswith(("{", "//", "/*")) else "yaml"


def parse_text(text: str, source: str, fmt: str) -> Document:
    try:
        if fmt == "toml":  # torchtitan train configs: values only, no key positions
            doc = Document(text=text, fmt="toml", data=load_toml(text), source=source)
        else:
            doc = parse_json(text, source) if fmt == "json" else parse_yaml(text, source)
    except (ConfigError, TomlError) as exc:
        raise ConfigError(f"{source}: {exc}; fix the syntax and run again") from None
    if not isinstance(doc.data, dict):
        kind = type(doc.data).__name__ if doc.data is not None else "nothing"
        raise ConfigError(f"{source}: the top level must be a mapping of DeepSpeed keys, got {kind}; "
                          "pass the DeepSpeed config file itself")
    return doc


def read_document(path: str) -> Document:
    """Read a DeepSpeed config (JSON, JSON with comments, or YAML) keeping key positions."""
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a directory; pass the DeepSpeed config file inside it (e.g. {path}/ds_config.json)")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; check the path") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (not UTF-8); pass the DeepSpeed JSON or YAML config") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if not text.strip():
        raise ConfigError(f"{path}: the file is empty; a DeepSpeed config needs at least a zero_optimization block")
    return parse_text(text, path, sniff_format(path, text))


def load_config(path: str) -> tuple[dict[str, Any], list[str]]:
    """The config as a dict plus loader warnings. Raises ConfigError with a one-line message."""
    doc = read_document(path)
    return doc.data, doc.warnings
