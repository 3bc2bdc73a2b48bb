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


def test_every_success_figure_of_the_readme_is_generated():
    """Outside its generated blocks (and the demo's transcript) the README types no success rate or k/n count:
    those come from the records through ``python -m studies.claims``; only an interval's 95% is written by hand."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"<!-- generated:([\w-]+) -->\n(.*?)<!-- /generated:\1 -->", readme, flags=re.S)
    assert {"tasks", "recipes", "which-to-pick", "evidence"} <= {name for name, _ in blocks}
    assert all(body.strip() for _, body in blocks)  # filled, not empty markers
    prose = re.sub(r"```.*?```", "", re.sub(r"<!-- generated:([\w-]+) -->.*?<!-- /generated:\1 -->", "", readme, flags=re.S),
                   flags=re.S)
    typed = [m for m in re.findall(r"\b\d+(?:\.\d+)?\s?%|\b\d+/\d+\b", prose) if m != "95%"]
    assert not typed, f"hand-typed figures in README.md: {typed}"
