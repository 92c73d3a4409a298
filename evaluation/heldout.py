"""Masked lines and spans from the held-out corpus (code the model never trained on).

The held-out split is a jsonl of ``{package, path, text}`` documents. Tasks are sampled
deterministically from a seed:

* files are visited round-robin in a seeded shuffled order, one task per visit, so tasks
  spread over files instead of piling up in the largest ones;
* a *line* task hides one non-blank line (at most ``max_line_chars`` characters);
* a *span* task hides 2-4 consecutive lines (length drawn per task) whose first and last
  lines are non-blank and every line is at most ``max_line_chars`` characters.

Both are line holes in the sense of :mod:`.tasks` (same cursor convention as HumanEval: the
cursor at column 0 of an empty line, the target without its final newline). Lines and spans
use independent random streams, and the k-th task does not depend on how many tasks are asked
for, so a run with ``--limit`` is a prefix of the full run.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from .tasks import InfillTask, TaskError, read_jsonl

DEFAULT_HELDOUT = "data/corpus/heldout.jsonl"
"""Where ``diffill corpus --out data/corpus`` writes it, relative to the current directory."""
HELDOUT_ENV = "DIFFILL_HELDOUT"


def default_heldout_path() -> Path | None:
    """``$DIFFILL_HELDOUT``, else the corpus build's default location; None if absent."""
    for p in (os.environ.get(HELDOUT_ENV), DEFAULT_HELDOUT):
        if p and Path(p).is_file():
            return Path(p)
    return None


@dataclass(frozen=True)
class Document:
    name: str  # package/path
    lines: list[str]  # with their newlines


def read_documents(path: str | Path) -> list[Document]:
    docs: list[Document] = []
    for n, row in enumerate(read_jsonl(path), 1):
        text = row.get("text")
        if not isinstance(text, str):
            raise TaskError(f"{path}: document {n}: needs a string field 'text'")
        name = f"{row.get('package', '?')}/{row.get('path', n)}"
        text = text.replace("\r\n", "\n")
        if text and not text.endswith("\n"):
            text += "\n"
        docs.append(Document(name, text.splitlines(keepends=True)))
    return docs


def _ok(line: str, max_chars: int) -> bool:
    return bool(line.strip()) and len(line.rstrip("\n")) <= max_chars


def _task(doc: Document, start: int, k: int, kind: str) -> InfillTask:
    label = f"L{start + 1}" if k == 1 else f"L{start + 1}-L{start + k}"
    return InfillTask(
        task_id=f"heldout-{kind}/{doc.name}/{label}",
        prompt="".join(doc.lines[:start]),
        suffix="".join(doc.lines[start + k :]),
        canonical_solution="".join(doc.lines[start : start + k]),
    )


def sample_tasks(
    docs: list[Document],
    n: int,
    *,
    span: tuple[int, int] | None,
    seed: int = 0,
    max_line_chars: int = 200,
) -> list[InfillTask]:
    """``n`` line tasks (``span=None``) or span tasks (``span=(lo, hi)`` lines)."""
    kind = "line" if span is None else "span"
    rng = random.Random(f"{seed}/{kind}")
    order = list(range(len(docs)))
    rng.shuffle(order)
    out: list[InfillTask] = []
    seen: set[tuple[int, int, int]] = set()
    misses = 0
    i = 0
    while len(out) < n and order and misses < 20 * len(order) + 100:
        d = order[i % len(order)]
        i += 1
        doc = docs[d]
        k = 1 if span is None else rng.randint(span[0], span[1])
        starts = [
            s
            for s in range(0, len(doc.lines) - k + 1)
            if _ok(doc.lines[s], max_line_chars)
            and _ok(doc.lines[s + k - 1], max_line_chars)
            and all(len(x.rstrip("\n")) <= max_line_chars for x in doc.lines[s : s + k])
        ]
        if not starts:
            misses += 1
            continue
        s = rng.choice(starts)
        if (d, s, k) in seen:
            misses += 1
            continue
        seen.add((d, s, k))
        out.append(_task(doc, s, k, kind))
    return out


def repeats_in_file(task: InfillTask) -> bool:
    """Whether every non-blank line of the task's middle also occurs (stripped) on another
    line of the file: the tasks a copy from the context can solve (the non-neural baseline
    lives on them), reported apart from the rest by ``diffill eval``."""
    rest = {ln.strip() for ln in (task.prompt + task.suffix).split("\n")}
    middle = [ln.strip() for ln in task.canonical_solution.split("\n") if ln.strip()]
    return bool(middle) and all(ln in rest for ln in middle)


def heldout_tasks(
    path: str | Path, n_lines: int, n_spans: int, *, seed: int = 0, max_line_chars: int = 200
) -> tuple[list[InfillTask], list[InfillTask]]:
    docs = read_documents(path)
    lines = sample_tasks(docs, n_lines, span=None, seed=seed, max_line_chars=max_line_chars)
    spans = sample_tasks(docs, n_spans, span=(2, 4), seed=seed, max_line_chars=max_line_chars)
    return lines, spans
