"""The note index on the design page (docs/design.md, "Notes") matches the notes the code defines.

An invariant that spans files is explained once, in a named note, and cited elsewhere by its name.
A note is *defined* by a line that starts with ``[Note: name]`` (after the indentation and, in a
comment, ``# ``) and has nothing after it, or a sentence starting with a capital letter or ``(``:

    # [Note: hpZ]                              a comment block's first line
    [Note: padding]                            a docstring paragraph's first line
    # [Note: split rule] (DESIGN section 3) The one rule ...
    [Note: non-reentrant recompute] In MindSpore 2.10 ...

Every other mention cites one: ``[Note: padding] in partition.py``, ``[Note: comm plan]: ...``,
a docstring that opens with ``[Note: direct reads] of ...`` (on the line of its quotes), a mention
inside a sentence. The index must list every defined
note with the file that defines it, and nothing else. This file, whose examples above follow the
syntax, is not scanned.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("mindone_zero", "parallel_modules", "tools", "tests")
DEFINITION = re.compile(r"^\s*(?:#\s*)?\[Note: ([^\]]+)\](?:\s*$|\s+[A-Z(])")
INDEX_ROW = re.compile(r"^\|\s*`\[Note: ([^\]]+)\]`\s*\|\s*`([^`]+)`\s*\|\s*$")


def note_definitions(root: Path = ROOT):
    """``{(name, file)}`` of every note defined in the scanned folders' Python files."""
    found = set()
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            if path.resolve() == Path(__file__).resolve():
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                match = DEFINITION.match(line)
                if match:
                    found.add((match.group(1), path.relative_to(root).as_posix()))
    return found


def index_entries():
    """``{(name, file)}`` of the rows of the note index in docs/design.md."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Notes\n", 1)[1]
    return {m.groups() for m in map(INDEX_ROW.match, section.splitlines()) if m}


@pytest.mark.parametrize("line,name", [
    ("# [Note: hpZ]", "hpZ"),
    ("    [Note: padding]", "padding"),
    ("# [Note: split rule] (DESIGN section 3) The one rule for which", "split rule"),
    ("    [Note: non-reentrant recompute] In MindSpore 2.10 PYNATIVE, a Cell", "non-reentrant recompute"),
    ("        # [Note: same graph on every rank] On the CPU backend, the collectives", "same graph on every rank"),
])
def test_definitions_are_recognised(line, name):
    assert DEFINITION.match(line).group(1) == name


@pytest.mark.parametrize("line", [
    "        # [Note: coalesced gathers] in coalesce.py: all the split parameters in one all-gather",
    '        """[Note: direct reads] of this layer\'s ``construct``',
    '        """[Note: comm plan]: the gathers ``construct`` calls',
    "  [Note: non-reentrant recompute].",
    "            [Note: buckets] in fusion.py), or a ``FusionConfig``",
    "    x = f(y)  # [Note: Div on CPU] in comm.py",
    "    [Note: checkpoint layout]; the protocol that keeps a crash",
])
def test_citations_are_not_definitions(line):
    assert DEFINITION.match(line) is None


def test_each_note_is_defined_once():
    names = [name for name, _ in note_definitions()]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"notes defined in more than one place (keep one, cite it from the others): {twice}"


def test_the_index_lists_every_note_and_nothing_else():
    defined, listed = note_definitions(), index_entries()
    assert listed, "docs/design.md has no note index rows under '## Notes'"
    missing = sorted(defined - listed)
    stale = sorted(listed - defined)
    rows = "\n".join(f"| `[Note: {n}]` | `{f}` |" for n, f in missing)
    assert not missing, f"docs/design.md's note index misses these notes; add the rows:\n{rows}"
    assert not stale, f"docs/design.md's note index lists notes that the code no longer defines there: {stale}"
