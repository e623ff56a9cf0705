"""The API reference (docs/reference/*.md) documents every public name, from its docstring.

Each public name of ``mindone_zero`` and ``parallel_modules`` (its ``__all__``, or, for a package
without one, every name not starting with ``_``) must have a ``::: package.name`` entry in one of
the reference pages, which mkdocstrings renders from the docstring, so no signature is written by
hand. An entry for a name that is no longer exported fails here; one for a name that no longer
exists also fails ``mkdocs build --strict`` (tests/unit/test_docs_build.py).
"""
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
PACKAGES = ("mindone_zero", "parallel_modules")
ENTRY = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)


def public_names(package: str):
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_") and not isinstance(vars(module)[n], type(module))]
    return sorted(names)


def reference_entries():
    """``{"package.name": "page.md"}`` for every ``::: package.name`` line of the reference pages."""
    entries = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for name in ENTRY.findall(page.read_text(encoding="utf-8")):
            entries[name] = page.name
    return entries


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_in_the_api_reference(package):
    entries = reference_entries()
    missing = [n for n in public_names(package) if f"{package}.{n}" not in entries]
    assert not missing, (f"{package} exports {missing}, which docs/reference/ does not document: add a line "
                         f"'::: {package}.<name>' to docs/reference/{package}.md for each")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_reference_entry_is_a_public_name(package):
    exported = set(public_names(package))
    stale = sorted(f"{name} ({page})" for name, page in reference_entries().items()
                   if name.startswith(package + ".") and name.count(".") == 1
                   and name.split(".", 1)[1] not in exported)
    assert not stale, f"docs/reference/ documents names that {package} no longer exports: {stale}"


def test_reference_pages_are_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in REFERENCE.glob("*.md"):
        assert f"reference/{page.name}" in nav, f"docs/reference/{page.name} is not in mkdocs.yml's nav"
