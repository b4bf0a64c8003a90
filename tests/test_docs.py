"""The documentation's references hold: every file a page links to or cites exists, and every
generated report names a commit of this repository (so a reader can tell how old a figure
is against the code it describes)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    {ROOT / "README.md"}
    | {
        p
        for top in ("docs", "deploy", "replica", "bench", "helm")
        for p in ROOT.glob(f"{top}/**/*.md")
    }
)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_CITED = re.compile(
    r"(?<![\w/.-])((?:docs|bench|deploy|replica|helm|tests|router_policies|gateway)/[\w./-]*\w"
    r"\.(?:png|md|jsonl|json\.gz|json|yaml|py))(?![\w.])"
)
_CODE = re.compile(r"[Cc]ode: git ([0-9a-f]{7,40})\b")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_file_a_page_links_to_or_cites_exists(page: Path) -> None:
    text = page.read_text()
    missing = []
    for target in _LINK.findall(text):
        path = target.split("#", 1)[0]
        if path and not re.match(r"^[a-z]+:", path) and not (page.parent / path).exists():
            missing.append(target)
    missing += [path for path in _CITED.findall(text) if not (ROOT / path).exists()]
    assert missing == []


def test_the_checks_see_a_missing_link_and_a_missing_citation(tmp_path: Path) -> None:
    text = "[a plot](gone.png) and docs/nowhere.md, but docs/overhead.md is there"
    assert _LINK.findall(text) == ["gone.png"]
    assert [p for p in _CITED.findall(text) if not (ROOT / p).exists()] == ["docs/nowhere.md"]


def test_every_generated_report_names_a_commit_of_this_repository() -> None:
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True
    )
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("not a full git checkout: commits cannot be looked up")
    named = {sha for page in PAGES for sha in _CODE.findall(page.read_text())}
    assert named, "no generated report names its commit"
    unknown = [
        sha
        for sha in sorted(named)
        if subprocess.run(
            ["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=ROOT, capture_output=True
        ).returncode
    ]
    assert unknown == []
