"""The built site works opened from disk (``site/index.html`` over file://), and links to the repository.

``use_directory_urls: false`` in mkdocs.yml makes every page ``<name>.html`` and every link point at
such a file; with directory URLs a link such as ``getting-started/`` shows a folder listing when the
site is opened from disk. This builds the site and follows every relative ``href`` and ``src`` of
every page (but 404.html, whose links are absolute for a web server) to a file that exists. Also
checked: the repository link (``repo_url``) is in the header, the footer names setup.py's version, and each guide ends with a "How this
is tested" paragraph whose links point at files of this repository (``repo_url`` +
``blob/main/<path>``). Skipped without the docs tools.
"""
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from test_docs_build import ROOT, _missing_tools, _warnings

pytestmark = pytest.mark.skipif(bool(_missing_tools()), reason="the docs tools are not installed")

REPO_URL = "https://github.com/mindone-zero/mindone_zero"
BLOB = REPO_URL + "/blob/main/"
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)


def _links(page: Path):
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.links


@pytest.fixture(scope="module")
def site(docs_build):
    out, proc = docs_build
    assert proc.returncode == 0 and not _warnings(proc), proc.stdout + proc.stderr
    return out


def test_every_relative_link_opens_a_file_from_disk(site):
    broken = []
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) > 20
    for page in pages:
        for link in _links(page):
            parts = urlsplit(link)
            if parts.scheme or link.startswith(("#", "//", "mailto:", "data:")) or not parts.path:
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if not target.is_file():
                broken.append(f"{page.relative_to(site)}: {link}")
    assert not broken, f"links that open a folder or nothing from disk: {broken[:20]} ({len(broken)} in all)"


def test_the_header_links_the_repository(site):
    for page in ("index.html", "guides/offload.html"):
        assert f'href="{REPO_URL}"' in (site / page).read_text(encoding="utf-8"), page


def test_each_page_shows_the_version_it_describes(site):
    version = re.search(r'version="([^"]+)"', (ROOT / "setup.py").read_text(encoding="utf-8")).group(1)
    for page in ("index.html", "guides/offload.html", "reference/mindone_zero.html"):
        assert f"mindone_zero {version}, documentation of the main branch" in (site / page).read_text(
            encoding="utf-8"), page


def test_each_page_has_an_edit_link(site):
    for page in ("index.html", "guides/offload.html", "reference/mindone_zero.html"):
        source = page.replace(".html", ".md")
        assert f'href="{REPO_URL}/edit/main/docs/{source}"' in (site / page).read_text(encoding="utf-8"), page


@pytest.mark.parametrize("guide", GUIDES, ids=[g.stem for g in GUIDES])
def test_each_guide_ends_with_how_it_is_tested_linking_the_repository(guide):
    text = guide.read_text(encoding="utf-8")
    tail = text[text.rfind("**How this is tested:**"):]
    assert text.rfind("**How this is tested:**") > 0 and "\n## " not in tail, guide.name
    targets = re.findall(r"\]\((https://[^)\s]+)\)", tail)
    assert targets, guide.name
    for url in targets:
        assert url.startswith(BLOB), url
        assert (ROOT / url[len(BLOB):]).is_file(), url
