"""No tracked file carries a merge's conflict markers.

A merge resolved in haste once committed `<<<<<<< HEAD` into docs/design.md's note index; the docs test
that reads the index then failed in CI, far from the cause. This check names the file and line at once."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A conflict block's three marker lines, each whole: seven characters, then a label or nothing.
MARKER = re.compile(r"^(<{7}( .*)?|={7}|>{7}( .*)?)$")


def conflict_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines(), 1) if MARKER.match(line)]


def test_the_pattern_finds_a_conflict_block_and_nothing_like_it():
    block = "a\n<<<<<<< HEAD\nx\n=======\ny\n>>>>>>> branch\nb\n"
    assert conflict_lines(block) == [2, 4, 6]
    assert conflict_lines("Title\n=====\n========\n<<<<<<<< x\n") == []


def test_no_tracked_file_has_conflict_markers():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".png", ".svg", ".whl", ".ckpt", ".safetensors", ".npz", ".npy"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{n}" for n in conflict_lines(text)]
    assert not found, f"merge conflict markers committed: {found}"
