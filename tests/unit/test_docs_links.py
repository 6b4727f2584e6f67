"""Every relative link in the docs and the README reaches a file, and every #anchor a heading there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = CODE.sub("", path.read_text())
    return {_slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def _broken(root: Path = ROOT) -> list[str]:
    bad = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in LINK.findall(CODE.sub("", doc.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                bad.append(f"{doc.relative_to(root)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{doc.relative_to(root)}: {target} (no such heading)")
    return bad


def test_every_doc_link_and_anchor_resolves() -> None:
    assert _broken() == []


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Spot evidence: target (c)\n\n```\n## not a heading\n```\n")
    (tmp_path / "README.md").write_text("[ok](docs/a.md#spot-evidence-target-c) [gone](docs/b.md) "
                                        "[stale](docs/a.md#speed) [code](docs/a.md#not-a-heading) [web](https://x.org/#y)\n")
    assert _broken(tmp_path) == ["README.md: docs/b.md (no such file)", "README.md: docs/a.md#speed (no such heading)",
                                 "README.md: docs/a.md#not-a-heading (no such heading)"]
    assert _slug("Target (c) at 16 nodes (issue 11/13)") == "target-c-at-16-nodes-issue-1113"
    assert _slug("Bounded wait (`recovery.spot_wait_minutes`)") == "bounded-wait-recoveryspot_wait_minutes"
