"""The figures README.md quotes from `make demo` are those a run of the demo config gives: the
documents read and kept, each step's count in the tour, the drop reasons it names, the tokens
and shards. A recipe change that moves them fails here until the README says the new ones."""

from __future__ import annotations

import json
import re

from gristmill.pipeline.report import journey as stats

from ..conftest import REPO


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _readme() -> str:
    return " ".join((REPO / "README.md").read_text().split())  # sentences wrap across lines


def _find(pattern: str, text: str) -> re.Match:
    found = re.search(pattern, text)
    assert found, f"README.md no longer says /{pattern}/: update this test with the sentence"
    return found


def test_the_readme_quotes_the_demo_runs_figures(demo_run_dir):
    readme = _readme()
    rows = {
        r.step.split("_", 1)[-1] if r.step[:2].isdigit() else r.step: r
        for r in stats.journey(stats.read_run(demo_run_dir))
    }
    manifest = json.loads((demo_run_dir / "tokens" / "manifest.json").read_text())
    read, kept = rows["read_wet"].docs_out, rows["tokenize"].docs_in

    done = _find(r"`done runs/crawl: ([\d,]+) documents read, ([\d,]+) kept \(([\d.]+)%\)", readme)
    assert (_number(done[1]), _number(done[2]), done[3]) == (read, kept, f"{100 * kept / read:.1f}")

    tour = _find(
        r"`url_filter` drops ([\d,]+) of the ([\d,]+) records, `langid` keeps ([\d,]+) of the ([\d,]+) left .*?"
        r"the C4 and Gopher filters leave ([\d,]+), `kenlm` and `quality` ([\d,]+); exact dedup removes ([\d,]+)"
        r" repeated paragraphs \(and ([\d,]+) documents too short without them\), near dedup no document;"
        r" tokenization writes ([\d,]+) tokens in (\d+) shards",
        readme,
    )
    said = [_number(g) for g in tour.groups()]
    url, lang, exact = rows["url_filter"], rows["langid"], rows["exact_dedup"]
    assert said == [
        url.docs_in - url.docs_out,
        url.docs_in,
        lang.docs_out,
        lang.docs_in,
        rows["gopher_quality"].docs_out,
        rows["quality"].docs_out,
        exact.counters["paragraphs_removed"],
        exact.docs_in - exact.docs_out,
        manifest["totals"]["tokens"],
        len(manifest["shards"]),
    ]
    assert rows["near_dedup"].docs_in == rows["near_dedup"].docs_out  # "near dedup no document"

    inspect = _find(r"\(the demo: ([\d,]+) documents, ([\d,]+) tokens", readme)
    assert (_number(inspect[1]), _number(inspect[2])) == (manifest["totals"]["documents"], manifest["totals"]["tokens"])

    # the drop reasons the tour names as examples are reasons the demo drops documents for
    named = _find(r"\*\*Drops by reason\*\* says why \(([^)]*)\)", readme)[1]
    reasons = {reason for r in rows.values() for reason in r.drops}
    for reason in re.findall(r"`(\w+)`", named):
        assert reason in reasons, f"README.md names the drop reason {reason!r}, which the demo does not give"


def test_the_stage_folders_the_readme_names_are_the_demo_runs(demo_run_dir):
    readme = _readme()
    named = set(re.findall(r"\b(\d{2}_[a-z_]+)/", readme))
    assert {"01_curate"} < named, named
    have = {p.name for p in demo_run_dir.iterdir() if p.is_dir()}
    assert named <= have, f"README.md names stage folders the demo does not write: {sorted(named - have)}"
    last = max(have - {"tokens", "train"})
    assert f"`01_curate/` to `{last}/`" in readme  # "one folder per stage, 01_curate/ to the last"
