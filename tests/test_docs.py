"""The documentation holds together: every relative link in README.md and docs/*.md names a file
that exists and, with `#anchor`, a heading of that page (GitHub's anchors); the README stays a
front door (at most 15 KB) that links every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_BYTES = 15_000

FENCE = re.compile(r"^[ \t]*(```|~~~)")
CODE_SPAN = re.compile(r"``.*?``|`[^`]*`", re.S)
# [text](target) and ![alt](target); text may hold one level of brackets; an optional "title"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:name|id)\s*=\s*["']([^"']+)["']""")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")


def pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text outside fenced code blocks, line numbers kept (code lines become empty)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if m and m.group(1) == fence:
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text lower-cased, punctuation dropped (letters,
    digits, `_`, `-` and spaces stay), each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (repeats get -1, -2, ...), HTML name/id."""
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for line in prose(text).split("\n"):
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link and image outside code."""
    body = prose(text)
    body = CODE_SPAN.sub(lambda m: "\n" * m.group().count("\n"), body)
    found = []
    for pattern in (LINK, REF_DEF, HTML_ATTR):
        for m in pattern.finditer(body):
            found.append((body.count("\n", 0, m.start(1)) + 1, m.group(1)))
    return sorted(found)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """One line per relative link of `page` whose file or heading is missing."""
    problems = []
    for line, target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{line}: link {target!r}"
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            problems.append(f"{where}: no file {dest.relative_to(root) if dest.is_relative_to(root) else dest}")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest.read_text()):
            problems.append(f"{where}: {dest.relative_to(root)} has no heading with anchor #{anchor}")
    return problems


def test_every_relative_link_resolves():
    problems = [p for page in pages() for p in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_front_door():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes, over {README_MAX_BYTES:,}: move detail to docs/"
    linked = {(README.parent / target.partition("#")[0]).resolve() for _, target in links(README.read_text())}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md links no page {unlinked}: add them to its Documentation table"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Calibration (`pipeline calibrate`)", "calibration-pipeline-calibrate"),
        ("Memory per task: the models", "memory-per-task-the-models"),
        ("The scale run (`benchmarks/scale_run.py`)", "the-scale-run-benchmarksscale_runpy"),
        ("zh / UDHR: 1 doc(s), 4676 chars", "zh--udhr-1-docs-4676-chars"),
        ("The crawl YAML's `train:` section", "the-crawl-yamls-train-section"),
        ("Why our own steps", "why-our-own-steps"),
        ("Against the targets (4 GB, permissive config)", "against-the-targets-4-gb-permissive-config"),
        ("Dedup (benchmarks/dedup_throughput.py)", "dedup-benchmarksdedup_throughputpy"),
    ],
)
def test_anchors_follow_githubs_rules(heading, anchor):
    assert slug(heading) == anchor


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Page A\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Front\n\n"
        "[ok](docs/a.md) [ok](docs/a.md#two-words) [ok](docs/a.md#two-words-1) [ok](#front)\n"
        "[file](docs/b.md)\n"
        "[anchor](docs/a.md#three-words)\n"
        "[here](#nowhere) ![img](docs/missing.png)\n"
        "`[code](docs/c.md)` and https links pass: [x](https://example.com/y.md)\n\n"
        "```\n[fenced](docs/d.md)\n```\n"
    )
    problems = broken_links(page, tmp_path)
    assert [p.split(": ", 1)[0] for p in problems] == ["README.md:4", "README.md:5", "README.md:6", "README.md:6"]
    assert "no file docs/b.md" in problems[0]
    assert "docs/a.md has no heading with anchor #three-words" in problems[1]
    assert "README.md has no heading with anchor #nowhere" in problems[2]
    assert "no file docs/missing.png" in problems[3]
