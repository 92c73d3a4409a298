"""The speed-quality frontier: quality (HumanEval pass@1, held-out exact match) against the
median latency per completion, one point per number of refinement steps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def parse_steps(spec: str) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]`` (sorted, unique, each >= 1)."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            k = int(part)
        except ValueError:
            raise ValueError(f"--frontier: {part!r} is not an integer") from None
        if k < 1:
            raise ValueError(f"--frontier: steps must be >= 1, got {k}")
        out.add(k)
    if not out:
        raise ValueError("--frontier: no step counts given")
    return sorted(out)


def _fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def frontier_table(points: Sequence[dict[str, Any]]) -> str:
    head = f"{'steps':>5}  {'pass@1':>7}  {'EM(ho)':>7}  {'ES(ho)':>7}  {'p50 ms':>8}  {'p90 ms':>8}"
    rows = [head, "-" * len(head)]
    for p in points:
        rows.append(
            f"{p['steps']:>5}  {_fmt(p.get('pass_at_1'), '7.3f')}  "
            f"{_fmt(p.get('heldout_exact_match'), '7.3f')}  {_fmt(p.get('heldout_edit_similarity'), '7.3f')}  "
            f"{_fmt(p.get('latency_p50_ms'), '8.1f')}  {_fmt(p.get('latency_p90_ms'), '8.1f')}"
        )
    return "\n".join(rows)


def plot_frontier(
    points: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    references: dict[str, float] | None = None,
    title: str = "diffill: quality vs latency (steps annotated)",
) -> Path:
    """Saves the frontier as a PNG (matplotlib, Agg backend). ``references`` are horizontal
    lines for fixed pass@1 values (empty floor, baseline)."""
    import matplotlib  # optional dependency (diffill[plot]), only for --plot

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    xs = [p.get("latency_p50_ms") for p in points]
    series = (("pass_at_1", "HumanEval single-line pass@1", "o-"), ("heldout_exact_match", "held-out line EM", "s--"))
    for key, label, style in series:
        pts = [
            (x, p[key], p["steps"])
            for x, p in zip(xs, points, strict=True)
            if x is not None and p.get(key) is not None and not math.isnan(p[key]) and not math.isnan(x)
        ]
        if not pts:
            continue
        ax.plot([a for a, _, _ in pts], [b for _, b, _ in pts], style, label=label)
        for a, b, k in pts:
            ax.annotate(f"{k}", (a, b), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ref_styles = (":", "-.", (0, (1, 3)))
    for i, (name, y) in enumerate((references or {}).items()):
        if y is not None and not math.isnan(y):
            ax.axhline(y, linestyle=ref_styles[i % len(ref_styles)], linewidth=1.2,
                       color=("gray", "tab:red", "tab:green")[i % 3], label=f"{name} = {y:.3f}")
    valid = [x for x in xs if x is not None and not math.isnan(x) and x > 0]
    if len(valid) >= 2 and max(valid) / min(valid) > 4:
        ax.set_xscale("log")
    ax.set_xlabel("median latency per completion (ms)")
    ax.set_ylabel("score")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
