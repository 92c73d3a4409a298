"""Text tables and the results JSON of ``diffill eval``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .frontier import frontier_table


def sanitize(x: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, tuples -> lists, Paths -> str."""
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {str(k): sanitize(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [sanitize(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sanitize(data), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _f(x: Any, spec: str = "6.3f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-".rjust(len(format(0.0, spec)))
    return format(x, spec)


DRAFT_HEAD = f" {'p95 ms':>8} {'steps':>5} {'d.acc':>5} {'d.wrong':>7}"
DRAFT_NOTE = ("steps: mean model steps per completion; d.acc: share answered by a draft the "
              "model verified; d.wrong: share of those not the target")


def _draft_cols(s: dict[str, Any]) -> str:
    return (f" {_f(s.get('latency_p95_ms'), '8.1f')} {_f(s.get('steps_mean'), '5.2f')}"
            f" {_f(s.get('draft_accepted'), '5.2f')} {_f(s.get('draft_wrong_rate'), '7.2f')}")


def humaneval_table(section: dict[str, Any]) -> str:
    head = (f"{'system':<12} {'pass@1':>7} {'pass':>6} {'fail':>6} {'t/o':>5} {'EM':>6} {'EM(ws)':>6}"
            f" {'p50 ms':>8}" + DRAFT_HEAD)
    rows = [f"{section['title']} ({section['tasks']} tasks)", head, "-" * len(head)]
    for name, s in section["systems"].items():
        rows.append(
            f"{name:<12} {_f(s.get('pass_at_1'), '7.3f')} {s.get('passed', '-'):>6} {s.get('failed', '-'):>6} "
            f"{s.get('timeout', '-'):>5} {_f(s.get('exact_match'))} {_f(s.get('exact_match_ws'))} "
            f"{_f(s.get('latency_p50_ms'), '8.1f')}" + _draft_cols(s)
        )
    if any("draft_accepted" in s for s in section["systems"].values()):
        rows.append(DRAFT_NOTE)
    return "\n".join(rows)


def _by_set(section: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(system, set, its summary) for each system of the section's line and span sets, in
    that order; a set the run did not make is left out."""
    for kind in ("lines", "spans"):
        part = section.get(kind)
        if not part:
            continue
        for name, s in part["systems"].items():
            yield name, kind, s


def heldout_table(section: dict[str, Any]) -> str:
    head = (f"{'system':<12} {'set':<6} {'tasks':>5} {'EM':>6} {'EM(ws)':>6} {'ES':>6} {'p50 ms':>8}"
            f" {'EM rep':>6} {'EM new':>6}" + DRAFT_HEAD)
    rows = [f"Held-out corpus ({section['source']})", head, "-" * len(head)]
    for name, kind, s in _by_set(section):
        rows.append(
            f"{name:<12} {kind:<6} {s['tasks']:>5} {_f(s.get('exact_match'))} {_f(s.get('exact_match_ws'))} "
            f"{_f(s.get('edit_similarity'))} {_f(s.get('latency_p50_ms'), '8.1f')}"
            f" {_f(s.get('exact_match_repeated'))} {_f(s.get('exact_match_fresh'))}" + _draft_cols(s)
        )
    counts = []
    for kind in ("lines", "spans"):
        some = next(iter((section.get(kind) or {}).get("systems", {}).values()), {})
        if "repeated_tasks" in some:
            counts.append(f"{kind} {some['repeated_tasks']}/{some['tasks']}")
    if counts:
        rows.append("EM rep: tasks whose middle's lines all occur elsewhere in the file ("
                    + ", ".join(counts) + "); EM new: the others")
    return "\n".join(rows)


def repo_table(section: dict[str, Any]) -> str:
    head = (f"{'system':<15} {'set':<6} {'tasks':>5} {'EM':>6} {'ES':>6} {'EM inws':>7}"
            f" {'p50 ms':>8} {'gath.p95':>8}" + DRAFT_HEAD)
    rows = [f"Repository-level held-out set ({section['source']}; workspace: the rest of the "
            "package)", head, "-" * len(head)]
    for name, kind, s in _by_set(section):
        rows.append(
            f"{name:<15} {kind:<6} {s['tasks']:>5} {_f(s.get('exact_match'))} "
            f"{_f(s.get('edit_similarity'))} {_f(s.get('exact_match_inws'), '7.3f')} "
            f"{_f(s.get('latency_p50_ms'), '8.1f')} {_f(s.get('gather_p95_ms'), '8.2f')}"
            + _draft_cols(s))
    some = next(iter((section.get("lines") or {}).get("systems", {}).values()), {})
    if "inws_tasks" in some:
        rows.append(f"EM inws: the {some['inws_tasks']} line tasks whose middle's lines all occur "
                    "in another file of the package")
    return "\n".join(rows)


def repo_cost_table(c: dict[str, Any]) -> str:
    return "\n".join([
        f"Workspace index cost ({c['files']} files, {c['chunks']} chunks, "
        f"{c['chars'] / 1e6:.1f} M chars; roots {', '.join(c['roots'])})",
        f"build {_f(c.get('build_s'), '.2f')} s on a background thread; resident memory "
        f"+{_f(c.get('rss_delta_mb'), '.1f')} MB",
        f"context gathering per request p50 {_f(c.get('gather_p50_ms'), '.2f')} ms, "
        f"p95 {_f(c.get('gather_p95_ms'), '.2f')} ms, max {_f(c.get('gather_max_ms'), '.2f')} ms",
        f"a completion: idle {_f(c.get('completion_idle_ms'), '.1f')} ms, while the index "
        f"builds {_f(c.get('completion_while_building_ms'), '.1f')} ms",
    ])


def render(results: dict[str, Any]) -> str:
    parts: list[str] = []
    if "humaneval" in results:
        parts.append(humaneval_table(results["humaneval"]))
    if "heldout" in results:
        parts.append(heldout_table(results["heldout"]))
    if "repo" in results:
        parts.append(repo_table(results["repo"]))
    if "repo_cost" in results:
        parts.append(repo_cost_table(results["repo_cost"]))
    if results.get("frontier"):
        parts.append("Speed-quality frontier\n" + frontier_table(results["frontier"]))
    sb = results.get("sandbox")
    if sb:
        parts.append(
            "Sandbox: network=" + str(sb.get("network")) + "; processes=" + str(sb.get("processes"))
            + "; user=" + str(sb.get("user")) + "; writes=" + str(sb.get("writes"))
        )
    for n in results.get("notes", []):
        parts.append("note: " + n)
    if results.get("files"):
        parts.append("wrote: " + ", ".join(str(v) for v in results["files"].values()))
    return "\n\n".join(parts)
