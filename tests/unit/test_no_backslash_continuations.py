"""No Python file of the package, its tools or its tests continues a line with a backslash.

Readers and tracing tools lose the functions that follow a backslash continuation (the architecture
review's walk missed every function after one); parentheses continue a line as well. The check reads
tokens, so a backslash inside a string or a comment (a regex, a Windows path, ``"\\\\"``) is not one.
"""
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("mindone_zero", "parallel_modules", "tools", "tests")


def continuation_lines(source: str) -> list[int]:
    """Line numbers that end in a backslash outside every token (string, comment): continuations."""
    covered = {}  # row -> [(first column, past-the-end column)] of the tokens on it
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        (srow, scol), (erow, ecol) = tok.start, tok.end
        for row in range(srow, erow + 1):
            covered.setdefault(row, []).append((scol if row == srow else 0, ecol if row == erow else 1 << 30))
    found = []
    for row, line in enumerate(source.splitlines(), 1):
        col = len(line) - 1
        if line.endswith("\\") and not any(a <= col < b for a, b in covered.get(row, ())):
            found.append(row)
    return found


def test_the_check_finds_a_continuation_and_no_backslash_in_a_string_or_comment():
    assert continuation_lines("x = 1 + \\\n    2\ny = 3\n") == [1]
    assert continuation_lines("if a and \\\n        b:\n    pass\n") == [1]
    assert continuation_lines('s = "a\\\\"\nt = r"\\d+\\\\"\n# a comment \\\nu = 1\n') == []
    assert continuation_lines('doc = """one \\\ntwo"""\nv = 1\n') == []  # inside a string: no continuation


def test_no_python_file_has_a_backslash_continuation():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            found += [f"{path.relative_to(ROOT)}:{n}" for n in continuation_lines(source)]
    assert not found, f"backslash line continuations (use parentheses): {found}"
