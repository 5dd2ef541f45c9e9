"""Every relative link in README.md and docs/**/*.md resolves: the file (or folder) exists, and a #anchor names a
heading (GitHub's slug rule) or an explicit <a id> of the target page."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        s = slug(heading)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text())) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such anchor)")
    assert not broken, f"{page.relative_to(ROOT)}: " + ", ".join(broken)


def test_readme_stays_a_front_door():
    """Issue 26: the README is the way in (<= 15 KB); measured tables and method details live in docs/."""
    assert len((ROOT / "README.md").read_bytes()) <= 15 * 1024


def test_slug_follows_github():
    assert slug("Measured again on the 2026-11-25 machine: 1.71×") == "measured-again-on-the-2026-11-25-machine-171"
    assert slug("Options (`method_options.*`)") == "options-method_options"


LOGS = ROOT / "docs" / "logs"
# Index links (the README's and docs/README.md's "logs/") name no log; a dated folder (gpu/2026-11-30/) cites its files.
INDEX_FOLDERS = {LOGS, LOGS / "tiny", LOGS / "small", LOGS / "gpu"}


def test_every_log_is_cited():
    """docs/logs holds only the raw logs a current page cites: a relative link from README.md or docs/**/*.md other
    than the LOG.md notes (to the file, or to a dated folder holding it), or its path in a recipe or script (a
    training recipe's shipped result)."""
    cited: set[Path] = set()
    folders: set[Path] = set()
    for page in PAGES:
        if page.name == "LOG.md":
            continue
        for target in links(page):
            path = target.partition("#")[0]
            if path:
                dest = (page.parent / path).resolve()
                if dest.is_dir():
                    if LOGS.resolve() in dest.parents and dest not in {d.resolve() for d in INDEX_FOLDERS}:
                        folders.add(dest)
                else:
                    cited.add(dest)
    named = "\n".join(p.read_text(errors="replace") for d in ("recipes", "scripts") for p in (ROOT / d).rglob("*")
                      if p.is_file() and p.suffix in {".yaml", ".sh", ".py", ".md"})
    orphans = [str(f.relative_to(ROOT)) for f in sorted(LOGS.rglob("*")) if f.is_file()
               and f.resolve() not in cited
               and not any(d in f.resolve().parents for d in folders)
               and str(f.relative_to(ROOT)) not in named]
    assert not orphans, "logs no current page cites (remove them, or cite them): " + ", ".join(orphans)
