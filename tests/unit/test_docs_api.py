"""The API reference (docs/reference/*.md) documents every public name, from its docstring.

Each public name of ``mindone_zero`` and ``parallel_modules`` (its ``__all__``, read when the test
runs, or, for a package without one, every name not starting with ``_``) must have a
``::: package.name`` entry in one of the reference pages, which mkdocstrings renders from the
docstring, so no signature is written by hand. An entry for a name that is no longer exported
fails here; one for a name that no longer exists also fails ``mkdocs build --strict``
(tests/unit/test_docs_build.py).

Every function and class that a reference page renders (each ``:::`` entry, and the methods shown
under a class entry) documents each parameter of its signature in its Google-style ``Args``
section (read with griffe, the parser mkdocstrings uses; a class that inherits its constructor,
such as the ZeRO-3 Cells, in the rendered class that defines it), and each entry has an
``Examples`` section. An example either runs here, or names the test that runs the same calls:

* a block of ``>>>`` lines whose prose just before it names a test file (``On every rank ...
  (tests/dist/test_zero_parity.py runs these calls):``) is a fragment, or needs several ranks; the
  file must exist;
* every other block is a doctest (``>>>`` lines, with the output they print), run here in one
  subprocess: each entry's runnable blocks in order, with fresh globals, in an empty folder of its
  own, in PYNATIVE mode on the CPU.

``PARALLEL_MODULES``' docstring lists its mapping; the test checks the list against the dict.

Run ``python tests/unit/test_docs_api.py [name ...]`` to run the docstring examples by hand.
"""
import doctest
import functools
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
PACKAGES = ("mindone_zero", "parallel_modules")
ENTRY = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)
NAMED_TEST = re.compile(r"\btests/[\w/.-]+\.py\b")
EXAMPLES_TIMEOUT_S = 300

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


def test_the_docs_extra_installs_a_signature_formatter():
    """mkdocstrings wraps long signatures only with ruff or black installed ("Formatting signatures
    requires either Black or Ruff"); the ``docs`` extra brings one."""
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    docs_extra = re.search(r'"docs":\s*\[(.*)\],?\s*$', setup, re.M)
    assert docs_extra and re.search(r'"(ruff|black)\b', docs_extra.group(1)), "setup.py's docs extra lacks ruff or black"


def test_reference_pages_open_with_what_they_hold_not_how_to_edit_them():
    for page in REFERENCE.glob("*.md"):
        if page.name == "index.md":  # the section's front page
            continue
        text = page.read_text(encoding="utf-8")
        opening = text.split(":::", 1)[0]
        assert "To document" not in opening and "test_docs_api" not in opening, page.name


# ---------------------------------------------------------------- parameters and examples (griffe)

def _griffe():
    if importlib.util.find_spec("griffe") is None:
        pytest.skip("griffe (installed with the docs extra) is missing: python -m pip install -e \".[docs]\"")
    import griffe
    return griffe


@functools.lru_cache(maxsize=None)
def entry_options():
    """``{"package.name": options dict}`` of every ``:::`` entry, from the indented YAML under it."""
    import yaml
    found = {}
    for page in sorted(REFERENCE.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = ENTRY.match(line)
            if not match:
                continue
            block = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and not nxt.startswith("    "):
                    break
                block.append(nxt)
            found[match.group(1)] = (yaml.safe_load(textwrap.dedent("\n".join(block))) or {}).get("options", {})
    return found


def _load(identifiers):
    """griffe objects (aliases followed) of ``identifiers``, loaded from this checkout's sources."""
    griffe = _griffe()
    loader = griffe.GriffeLoader(docstring_parser=griffe.Parser.google, search_paths=[str(ROOT)])
    for top in sorted(set(PACKAGES) | {i.split(".", 1)[0] for i in identifiers}):
        loader.load(top)
    loader.resolve_aliases(external=False, implicit=False)
    return {i: _final(loader.modules_collection[i]) for i in identifiers}


def _final(obj):
    return obj.final_target if obj.is_alias else obj


def _sections(obj):
    griffe = _griffe()
    if obj.docstring is None:
        return []
    return obj.docstring.parse(griffe.Parser.google, warn_unknown_params=False, warn_missing_types=False)


def _kind(section) -> str:
    return section.kind.value


def _documented_params(obj) -> list:
    return [p.name.lstrip("*") for s in _sections(obj) if _kind(s) in ("parameters", "other parameters")
            for p in s.value]


def _signature_params(obj) -> list:
    return [p.name for p in obj.parameters if p.name not in ("self", "cls")]


@functools.lru_cache(maxsize=None)
def rendered_callables():
    """``{identifier: griffe object}`` of every function and class a reference page renders: the
    ``:::`` entries, and the methods shown under a class entry (``members`` if the entry lists
    them, else every public method with a docstring; plus its ``inherited_members``)."""
    options = entry_options()
    objects = _load(list(options))
    out = {}
    for ident, obj in objects.items():
        if obj.kind.value not in ("function", "class"):
            continue
        out[ident] = obj
        if obj.kind.value != "class" or options[ident].get("members") is False:
            continue
        listed = options[ident].get("members")
        inherited = options[ident].get("inherited_members") or []
        names = list(listed) if listed else [n for n, m in obj.members.items() if not n.startswith("_")
                                             and _final(m).docstring is not None]
        names += [n for n in inherited if n not in names]
        for name in names:
            member = _final(obj.all_members[name])
            if member.kind.value == "function" and "property" not in member.labels:
                out[f"{ident}.{name}"] = member
    return out


def _constructor_docs(obj, callables):
    """The object whose docstring documents ``obj``'s parameters: ``obj``, or, for a class that
    inherits its ``__init__``, the rendered base class that defines it (the ZeRO-3 Cells point to
    ``ZeroCell``); None when that base is not on a reference page."""
    if obj.kind.value != "class" or "__init__" in obj.members:
        return obj
    owner = next((base for base in obj.mro() if "__init__" in base.members), None)
    if owner is None:
        return obj
    return owner if any(c is owner for c in callables.values()) else None


def test_every_parameter_is_documented():
    undocumented, unknown = [], []
    callables = rendered_callables()
    for ident, obj in callables.items():
        docs = _constructor_docs(obj, callables)
        if docs is None:
            undocumented.append(f"{ident}: its constructor's class is on no reference page")
            continue
        params, documented = _signature_params(obj), _documented_params(docs)
        undocumented += [f"{ident}: {p}" for p in params if p not in documented]
        unknown += [f"{ident}: {p}" for p in documented if p not in params]
    assert not undocumented, f"parameters without an entry in their docstring's Args section: {undocumented}"
    assert not unknown, f"Args entries for parameters the signature does not have: {unknown}"


EXAMPLE_WIDTH = 80  # characters of an example line that a code block shows at a 1400 px window


def test_examples_fit_the_page_and_returns_are_one_entry():
    """Example lines fit the page's code blocks; a ``Returns`` section is one entry (a continuation
    line that is not indented starts a second, wrong row)."""
    wide, returns = [], []
    for ident, obj in rendered_callables().items():
        wide += [f"{ident}: {line}" for _, code in example_blocks(obj) for line in code.splitlines()
                 if len(line) > EXAMPLE_WIDTH]
        returns += [ident for s in _sections(obj) if _kind(s) == "returns" and len(s.value) > 1]
    assert not wide, f"example lines over {EXAMPLE_WIDTH} characters: {wide}"
    assert not returns, f"Returns sections of more than one entry (indent the continuation lines): {returns}"


def example_blocks(obj) -> list:
    """``(prose, code)`` of each run of ``>>>`` lines in ``obj``'s ``Examples`` sections, with the
    prose just before it (which names the test that runs a block that does not run here)."""
    blocks = []
    for section in _sections(obj):
        if _kind(section) != "examples":
            continue
        prose = ""
        for kind, text in section.value:
            if kind.value == "examples":
                blocks.append((prose, text))
                prose = ""
            else:
                prose = text
    return blocks


def test_every_entry_has_an_example_that_runs_or_names_its_test():
    callables = rendered_callables()
    without, missing_tests = [], []
    for ident in entry_options():
        if ident not in callables:
            continue
        blocks = example_blocks(callables[ident])
        if not blocks:
            without.append(ident)
        for prose, _ in blocks:
            missing_tests += [f"{ident}: {t}" for t in NAMED_TEST.findall(prose) if not (ROOT / t).is_file()]
    assert not without, f"reference entries without an 'Examples:' section of '>>>' lines: {without}"
    assert not missing_tests, f"examples name tests that do not exist: {missing_tests}"


def runnable_examples():
    """``{identifier: doctest source}``: the example blocks of each entry whose prose names no test."""
    callables = rendered_callables()
    out = {}
    for ident in entry_options():
        blocks = example_blocks(callables[ident]) if ident in callables else []
        code = [code for prose, code in blocks if not NAMED_TEST.search(prose)]
        if code:
            out[ident] = "\n\n".join(code)
    return out


def test_there_are_runnable_docstring_examples():
    assert len(runnable_examples()) >= 10, sorted(runnable_examples())


def test_the_docstring_examples_run():
    """All of them in one subprocess (MindSpore starts once), each with fresh globals and folder."""
    names = sorted(runnable_examples())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *names], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=EXAMPLES_TIMEOUT_S)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}"
    assert f"{len(names)} entries passed" in proc.stdout, proc.stdout[-4000:]


def run_examples(names) -> int:
    """Run the doctests of ``names`` (default: every runnable entry); print failures; 0 if all pass."""
    import mindspore as ms
    sources = runnable_examples()
    names = list(names) or sorted(sources)
    failed = []
    home = os.getcwd()
    for name in names:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        test = doctest.DocTestParser().get_doctest(sources[name], {"__name__": "__main__"}, name, None, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        with tempfile.TemporaryDirectory() as folder:
            os.chdir(folder)
            try:
                result = runner.run(test, out=sys.stdout.write)
            finally:
                os.chdir(home)
        if result.failed or not result.attempted:
            failed.append(name)
    print(f"{len(names) - len(failed)} entries passed; failed: {failed}")
    return 1 if failed else 0


# ---------------------------------------------------------------- PARALLEL_MODULES' listed mapping

MAPPING_ROW = re.compile(r"^\s*\|\s*``([\w.]+)``\s*\|\s*``([\w.]+)``\s*\|\s*$")


def _public_path(cls) -> str:
    """``nn.Dense``, ``mint.nn.Linear``, ``parallel_modules.Dense``: how a user spells the class (its
    ``mint.nn`` name first: MindSpore 2.10's ``nn.Linear`` is ``mint.nn.Linear``)."""
    import mindspore
    import parallel_modules
    if getattr(parallel_modules, cls.__name__, None) is cls:
        return f"parallel_modules.{cls.__name__}"
    for prefix, namespace in (("mint.nn", mindspore.mint.nn), ("nn", mindspore.nn)):
        names = sorted(name for name, value in vars(namespace).items() if value is cls and not name.startswith("_"))
        if names:
            return f"{prefix}.{names[0]}"
    return f"{cls.__module__}.{cls.__qualname__}"


def test_parallel_modules_docstring_lists_the_mapping():
    from parallel_modules import PARALLEL_MODULES
    obj = _load(["parallel_modules.PARALLEL_MODULES"])["parallel_modules.PARALLEL_MODULES"]
    listed = [m.groups() for m in map(MAPPING_ROW.match, obj.docstring.value.splitlines()) if m]
    actual = [(_public_path(k), _public_path(v)) for k, v in PARALLEL_MODULES.items()]
    table = "\n".join(f"| ``{k}`` | ``{v}`` |" for k, v in actual)
    assert listed == actual, ("PARALLEL_MODULES' docstring (mindone_zero/zero3/layers.py) must list its "
                              f"mapping in order; its rows should read:\n{table}")


if __name__ == "__main__":
    sys.exit(run_examples(sys.argv[1:]))
