"""Generation and scoring: one generator over a task list, and the metrics of its inserts.

* :func:`generate` asks a generator for every task (editor view, same cursor convention for
  all) and records the insert and its wall-clock latency.
* :class:`ExecCache` executes ``(task, completion)`` programs in the sandbox, each distinct
  pair once per run (the empty floor, the baseline and several step counts share it).
* :func:`text_metrics` / :func:`exec_metrics` summarise.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from .generators import Generated, Generator
from .metrics import edit_similarity, exact_match, exact_match_ws, mean, percentile
from .sandbox import ExecResult, Sandbox
from .tasks import InfillTask


@dataclass(frozen=True)
class Output:
    task_id: str
    insert: str
    latency_s: float
    error: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # the generator's (Generated.info)


def _progress(total: int, desc: str, enabled: bool):
    return tqdm(total=total, desc=desc, unit="task", disable=not enabled, leave=False, dynamic_ncols=True)


def generate(gen: Generator, tasks: Sequence[InfillTask], *, desc: str = "", progress: bool = False) -> list[Output]:
    """Inserts for every task; an exception in the generator is recorded (empty insert)
    rather than aborting the run, and counted in the metrics as ``errors``."""
    out: list[Output] = []
    with _progress(len(tasks), desc or gen.name, progress) as bar:
        for t in tasks:
            v = t.editor_view()
            t0 = time.perf_counter()
            err = ""
            info: dict[str, Any] = {}
            try:
                got = gen.generate(v.text, v.offset, multiline=t.multiline)
            except Exception as e:  # noqa: BLE001 - a failed completion is a data point, not a crash
                got, err = "", f"{type(e).__name__}: {e}"
            if isinstance(got, Generated):
                got, info = got.text, got.info
            out.append(Output(t.task_id, got, time.perf_counter() - t0, err, info))
            bar.update(1)
    return out


def text_metrics(
    tasks: Sequence[InfillTask], outputs: Sequence[Output], groups: dict[str, Sequence[bool]] | None = None
) -> dict[str, Any]:
    """Exact match (strict / whitespace-normalised), edit similarity and latency; with
    ``groups`` (name -> one flag per task) also ``exact_match_<name>`` over each group's tasks."""
    targets = [t.editor_view().target for t in tasks]
    ins = [o.insert for o in outputs]
    lat = [o.latency_s for o in outputs if math.isfinite(o.latency_s)]  # nan: scored from a file
    em = [exact_match(a, b) for a, b in zip(ins, targets, strict=True)]
    split: dict[str, Any] = {}
    for name, flags in (groups or {}).items():
        hits = [e for e, f in zip(em, flags, strict=True) if f]
        split[f"{name}_tasks"] = len(hits)
        split[f"exact_match_{name}"] = mean(hits) if hits else None
    return {
        **split,
        "tasks": len(tasks),
        "exact_match": mean(em),
        "exact_match_ws": mean([exact_match_ws(a, b) for a, b in zip(ins, targets, strict=True)]),
        "edit_similarity": mean([edit_similarity(a, b) for a, b in zip(ins, targets, strict=True)]),
        "empty_outputs": sum(1 for x in ins if not x.strip()),
        "errors": sum(1 for o in outputs if o.error),
        "latency_p50_ms": 1000 * percentile(lat, 50),
        "latency_p90_ms": 1000 * percentile(lat, 90),
        "latency_p95_ms": 1000 * percentile(lat, 95),
        "latency_mean_ms": 1000 * mean(lat),
        **draft_metrics(outputs, em),
    }


def draft_metrics(outputs: Sequence[Output], right: Sequence[bool]) -> dict[str, Any]:
    """From the generators' ``info`` (model generators only; ``{}`` otherwise): mean model
    steps and calls per completion, and for draft and verify the share of completions sent
    drafts (``draft_offered``), answered by a verified draft (``draft_accepted``), the
    acceptance rate among those offered, how often an accepted draft was wrong (not the
    target: ``draft_wrong_rate``), the steps of draft-answered completions and the accepted
    count per source. ``right``: per output, whether it is the target."""
    infos = [o.info for o in outputs]
    if not any("steps" in i for i in infos):
        return {}
    n = len(infos)
    offered = [bool(i.get("drafts")) for i in infos]
    acc = [bool(i.get("draft_verified")) for i in infos]
    acc_right = [r for a, r in zip(acc, right, strict=True) if a]
    by_source: dict[str, int] = {}
    for i, a in zip(infos, acc, strict=True):
        if a:
            by_source[str(i.get("source"))] = by_source.get(str(i.get("source")), 0) + 1
    draft_steps = [i.get("steps", 0) for i, a in zip(infos, acc, strict=True) if a]
    out: dict[str, Any] = {
        "steps_mean": mean([i.get("steps", 0) for i in infos]),
        "model_calls_mean": mean([i["model_calls"] for i in infos if "model_calls" in i])
        if any("model_calls" in i for i in infos) else None,
    }
    if any(offered):
        out.update({
            "draft_offered": sum(offered) / n,
            "draft_accepted": sum(acc) / n,
            "draft_accept_rate": sum(acc) / sum(offered),
            "draft_wrong_rate": (1 - mean(acc_right)) if acc_right else None,
            "draft_steps_mean": mean(draft_steps) if draft_steps else None,
            "draft_accepted_by_source": by_source,
        })
    return out


class ExecCache:
    """Runs programs in the sandbox, each distinct ``(task_id, completion)`` once."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.results: dict[tuple[str, str], ExecResult] = {}

    def run(
        self, pairs: Iterable[tuple[InfillTask, str]], *, desc: str = "execute", progress: bool = False
    ) -> None:
        todo: dict[tuple[str, str], InfillTask] = {}
        for t, comp in pairs:
            key = (t.task_id, comp)
            if key not in self.results and key not in todo:
                todo[key] = t
        if not todo:
            return
        keys = list(todo)
        programs = [todo[k].program(k[1]) for k in keys]
        with _progress(len(programs), desc, progress) as bar:
            res = self.sandbox.run_many(programs, progress=lambda: bar.update(1))
        self.results.update(zip(keys, res, strict=True))

    def get(self, task: InfillTask, completion: str) -> ExecResult:
        return self.results[(task.task_id, completion)]


def exec_metrics(tasks: Sequence[InfillTask], completions: Sequence[str], cache: ExecCache) -> dict[str, Any]:
    """pass@1 (one greedy sample per task) and the outcome counts; needs ``cache.run`` first."""
    res = [cache.get(t, c) for t, c in zip(tasks, completions, strict=True)]
    counts = Counter(r.status for r in res)
    return {
        "pass_at_1": mean([r.passed for r in res]),
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0),
        "timeout": counts.get("timeout", 0),
    }


def per_task_rows(
    tasks: Sequence[InfillTask], outputs: Sequence[Output], cache: ExecCache | None
) -> list[dict[str, Any]]:
    """One row per task for the details file."""
    rows = []
    for t, o in zip(tasks, outputs, strict=True):
        v = t.editor_view()
        row: dict[str, Any] = {
            "task_id": t.task_id,
            "insert": o.insert,
            "target": v.target,
            "exact_match": o.insert == v.target,
            "latency_ms": round(1000 * o.latency_s, 3),
        }
        if o.error:
            row["error"] = o.error
        if o.info:
            row.update({k: v for k, v in o.info.items() if k != "drafts"})
            if o.info.get("drafts"):
                row["drafts"] = o.info["drafts"]
        if cache is not None and t.executable:
            r = cache.get(t, t.completion_for(o.insert))
            row["status"] = r.status
            if not r.passed:
                row["detail"] = r.detail[-300:]
        rows.append(row)
    return rows
