"""Every relative link in README.md and the documentation pages (docs/, the MkDocs site) points
at a file or folder that exists, and README.md's links to a heading of a page name one that the
page has. Anchors between pages of the site are checked by `mkdocs build --strict` (mkdocs.yml,
`validation.links.anchors`)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# [text](target) and ![alt](target), with an optional "title"; the text may hold `code`.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def _pages() -> list[Path]:
    pages = [ROOT / "README.md"]
    for page in sorted(DOCS.rglob("*.md")):
        if (DOCS / "results" / "data") in page.parents:  # sweep data, left out of the site
            continue
        pages.append(page)
    return pages


def relative_links(text: str) -> list[str]:
    """The relative link targets of a markdown text, outside code blocks and code spans."""
    text = _CODE.sub("", _FENCE.sub("", text))
    targets = []
    for match in _LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
            continue  # http:, mailto:, an anchor on the same page, a site-absolute path
        targets.append(target)
    return targets


def test_the_link_finder_sees_links_and_skips_code():
    text = (
        "[a](docs/a.md) ![b](img/b.png \"title\") [`c`](c.md#part) [d](https://x.org) [e](#here)\n"
        "`[f](not-a-link.md)`\n```\n[g](nor-this.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md", "img/b.png", "c.md#part"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file(page):
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs make it (for the headings these pages use)."""
    text = _CODE.sub(lambda m: m.group(0).strip("`"), heading).strip().lower()
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text))


def test_slug_is_the_anchor_of_a_heading():
    assert _slug("The batched engine (experiments)") == "the-batched-engine-experiments"
    assert _slug("Client processes: `dfedrw run`") == "client-processes-dfedrw-run"


def test_readme_anchors_name_headings_of_their_pages():
    readme = ROOT / "README.md"
    broken = []
    for target in relative_links(readme.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        if not anchor or not path.endswith(".md"):
            continue
        text = _FENCE.sub("", (readme.parent / path).read_text(encoding="utf-8"))
        headings = {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}
        if anchor not in headings:
            broken.append(target)
    assert not broken, f"README.md: links to headings that do not exist: {broken}"
