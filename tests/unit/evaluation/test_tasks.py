"""Task building, the cursor convention, task/sample files."""

from __future__ import annotations

import json

import pytest
from diffill.evaluation.tasks import (
    InfillTask,
    TaskError,
    humaneval_single_line_tasks,
    read_humaneval,
    read_samples,
    read_tasks,
    single_line_tasks,
    subset,
    write_samples,
    write_tasks,
)


@pytest.fixture(scope="module")
def problems():
    return read_humaneval()


@pytest.fixture(scope="module")
def tasks(problems):
    return single_line_tasks(problems)


def test_one_task_per_non_blank_canonical_line(problems, tasks):
    assert len(problems) == 164
    expected = sum(1 for p in problems for ln in p["canonical_solution"].splitlines() if ln.strip())
    assert len(tasks) == expected
    assert len(tasks) == 1033  # OpenAI's HumanEval-SingleLineInfilling has 1033 tasks too
    assert len({t.task_id for t in tasks}) == len(tasks)


def test_reconstruction_and_line_shape(problems, tasks):
    by_id = {p["task_id"]: p for p in problems}
    for t in tasks:
        pid = t.task_id.split("/", 1)[1].rsplit("/", 1)[0]
        p = by_id[pid]
        assert t.prompt + t.canonical_solution + t.suffix == p["prompt"] + p["canonical_solution"]
        assert t.canonical_solution.endswith("\n") and t.canonical_solution.count("\n") == 1
        assert t.canonical_solution.strip()
        assert t.line_hole and not t.multiline and t.executable
        assert t.entry_point == p["entry_point"] and t.test == p["test"]


def test_line_index_in_task_id(tasks):
    t = next(t for t in tasks if t.task_id == "SingleLineInfilling/HumanEval/0/L0")
    assert t.canonical_solution == "    for idx, elem in enumerate(numbers):\n"
    # a blank canonical line gets no task but keeps its index: HumanEval/0 line 6 is blank
    ids = {t.task_id for t in tasks if "/HumanEval/0/" in t.task_id}
    assert "SingleLineInfilling/HumanEval/0/L6" not in ids
    assert "SingleLineInfilling/HumanEval/0/L7" in ids


def test_editor_view_puts_cursor_on_an_empty_line(tasks):
    t = tasks[0]
    v = t.editor_view()
    assert v.offset == len(t.prompt)
    assert v.prefix == t.prompt and v.suffix == "\n" + t.suffix
    assert v.target == t.canonical_solution[:-1]  # indentation in, newline out
    assert v.target.startswith("    ")
    # the document after inserting the target is the original program
    assert v.text[: v.offset] + v.target + v.text[v.offset :] == t.prompt + t.canonical_solution + t.suffix
    assert t.completion_for(v.target) == t.canonical_solution
    assert t.insert_from_completion(t.canonical_solution) == v.target
    # the empty floor under the same convention leaves a blank line
    assert t.completion_for("") == "\n"


def test_non_line_hole_is_shown_as_is():
    t = InfillTask("x", "def f():\n    return (", ")\n", "1 + 2", "def check(c):\n    assert c() == 3\n", "f")
    assert not t.line_hole
    v = t.editor_view()
    assert v.text == "def f():\n    return ()\n" and v.offset == len(t.prompt) and v.target == "1 + 2"
    assert t.completion_for("1 + 2") == "1 + 2"
    assert t.program("1 + 2").endswith("\ncheck(f)\n")


def test_tasks_and_samples_roundtrip(tmp_path, tasks):
    p = tmp_path / "t.jsonl"
    write_tasks(p, tasks[:5])
    assert read_tasks(p) == tasks[:5]
    s = tmp_path / "s.jsonl"
    write_samples(s, [(t.task_id, t.canonical_solution) for t in tasks[:5]] + [(tasks[0].task_id, "dup")])
    got = read_samples(s)
    assert got[tasks[0].task_id] == tasks[0].canonical_solution  # first sample wins
    assert len(got) == 5


def test_read_tasks_names_the_bad_field(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"task_id": "a", "prompt": "", "suffix": "", "test": "", "entry_point": ""}) + "\n")
    with pytest.raises(TaskError, match="canonical_solution"):
        read_tasks(p)
    p.write_text("{not json\n")
    with pytest.raises(TaskError, match=":1: not JSON"):
        read_tasks(p)


def test_subset_is_even_and_deterministic():
    xs = list(range(100))
    assert subset(xs, None) == xs and subset(xs, 200) == xs
    assert subset(xs, 4) == [0, 25, 50, 75]
    assert subset(xs, 4) == subset(xs, 4)


def test_humaneval_single_line_tasks_entry_point():
    assert len(humaneval_single_line_tasks()) == 1033
