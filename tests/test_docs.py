"""The guide and the evidence link only to what exists."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "results" / "claims.md", REPO / "results" / "notebook.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to missing {missing}"


def test_the_readme_is_a_guide_of_at_most_300_lines_that_links_every_doc():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} <= set(relative_links(REPO / "README.md"))
    assert "make test" in readme and "make demo" in readme
