"""Small units (STYLE.md 10): no file under src/ over 400 lines, no function over 80.

A generated table may be exempt, and only by saying so in its first five lines with the marker below, so
the exemption is visible to whoever opens the file. No file is exempt by name here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
GENERATED_MARKER = "lossguard: generated table, exempt from the size limits"


def _python_files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _is_generated(text: str) -> bool:
    return any(GENERATED_MARKER in line for line in text.splitlines()[:5])


def _long_functions(path: Path, text: str) -> list[str]:
    """Each function (method, nested function) longer than the limit, from its `def` line to its last line."""
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}() is {length} lines")
    return found


def test_the_walk_finds_the_sources() -> None:
    files = _python_files()
    assert len(files) > 50 and SRC / "lossguard" / "api.py" in files


def test_the_function_measure_counts_def_to_end() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = SRC / "example.py"
    assert _long_functions(path, f"def short():\n{body[: body.rfind(chr(10))]}\n") == []
    assert _long_functions(path, f"def long():\n{body}\n") == [f"src/example.py:1 long() is {MAX_FUNCTION_LINES + 1} lines"]


def test_only_a_marker_at_the_top_exempts_a_file() -> None:
    assert _is_generated(f'"""Onset table. {GENERATED_MARKER}: scripts/make_table.py writes it."""\n')
    assert not _is_generated("\n" * 5 + f"# {GENERATED_MARKER}\n")  # buried below the top: not an exemption


def test_no_file_over_the_line_limit() -> None:
    over = []
    for path in _python_files():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES and not _is_generated(text):
            over.append(f"{path.relative_to(ROOT)} is {lines} lines")
    assert not over, f"files over {MAX_FILE_LINES} lines (split them by responsibility):\n" + "\n".join(over)


def test_no_function_over_the_line_limit() -> None:
    over = []
    for path in _python_files():
        text = path.read_text(encoding="utf-8")
        if not _is_generated(text):
            over.extend(_long_functions(path, text))
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)
