"""Every documentation page the code and the docs point to exists, and so does every heading a link
names (`page.md#heading`): a user following `--help` or a link never lands nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import reasonrl

ROOT = Path(reasonrl.__file__).parent.parent.parent
DOCS = ROOT / "docs"
SOURCES = [*sorted((ROOT / "src" / "reasonrl").rglob("*.py")), *sorted(DOCS.glob("*.md")), ROOT / "README.md"]
# `docs/name.md` in code and text; markdown links to a page of docs/, with an optional #anchor.
MENTION = re.compile(r"docs/([A-Za-z0-9_\-]+\.md)")
LINK = re.compile(r"\]\((?:\.\./)?(?:docs/)?([A-Za-z0-9_\-]+\.md)(?:#([A-Za-z0-9_\-]+))?\)")


def anchors(page: Path) -> set[str]:
    """The GitHub anchors of a page's headings (lower case, punctuation dropped, spaces as dashes) and
    its explicit ones (`<a id="name">`)."""
    text = page.read_text()
    found = set(re.findall(r'<a id="([^"]+)">', text))
    for line in text.splitlines():
        if match := re.match(r"#+\s+(.*)", line):
            heading = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            found.add(heading.replace(" ", "-"))
    return found


def references() -> list[tuple[str, str, str]]:
    """(where, page, anchor) for every mention of and link to a docs page."""
    found = []
    for source in SOURCES:
        text = source.read_text()
        where = str(source.relative_to(ROOT))
        found += [(where, page, "") for page in MENTION.findall(text)]
        if source.suffix == ".md":
            found += [(where, page, anchor) for page, anchor in LINK.findall(text) if not page.startswith("http")]
    return found


def test_the_references_were_read():
    assert len(references()) > 50


@pytest.mark.parametrize(("where", "page", "anchor"), sorted(set(references())))
def test_every_referenced_page_and_heading_exists(where, page, anchor):
    if where == "README.md" and page == "README.md":  # docs/README.md is the index of docs/
        assert (DOCS / page).exists()
        return
    target = DOCS / page
    assert target.exists(), f"{where} points to docs/{page}, which does not exist"
    if anchor:
        assert anchor in anchors(target), f"{where} links to docs/{page}#{anchor}, a heading that does not exist"
