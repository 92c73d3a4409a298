"""The eval report's held-out and repository tables: a row per system of each set made."""

from __future__ import annotations

from diffill.evaluation.report import heldout_table, repo_table

FULL = {"tasks": 4, "exact_match": 0.5, "exact_match_ws": 0.75, "edit_similarity": 0.9,
        "latency_p50_ms": 12.5, "exact_match_inws": 0.25, "gather_p95_ms": 1.5}
SECTION = {"source": "corpus", "lines": {"systems": {"diffill": FULL, "baseline": {"tasks": 2}}},
           "spans": {"systems": {"diffill": {"tasks": 1}}}}


def _rows(table: str) -> list[list[str]]:
    return [line.split()[:3] for line in table.split("\n")[3:]]


def test_a_row_per_system_lines_then_spans() -> None:
    want = [["diffill", "lines", "4"], ["baseline", "lines", "2"], ["diffill", "spans", "1"]]
    assert _rows(heldout_table(SECTION)) == want
    assert _rows(repo_table(SECTION)) == want


def test_a_set_not_made_has_no_rows() -> None:
    section = {"source": "corpus", "lines": None, "spans": {"systems": {"diffill": FULL}}}
    assert _rows(heldout_table(section)) == [["diffill", "spans", "4"]]
    assert _rows(repo_table(section)) == [["diffill", "spans", "4"]]
