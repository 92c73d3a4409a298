"""Task building, the cursor convention, task/sample files, held-out sampling."""

from __future__ import annotations

import json

import pytest
from diffill.evaluation.heldout import (
    heldout_tasks,
    read_documents,
    repeats_in_file,
    sample_tasks,
)
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


# ----------------------------------------------------------------------------- held-out


def _corpus(tmp_path, n_files=6):
    rows = []
    for f in range(n_files):
        lines = []
        for i in range(30):
            lines.append(f"def f{f}_{i}(x):" if i % 3 == 0 else (f"    y = x + {i}" if i % 3 == 1 else ""))
        rows.append({"package": "pkg", "path": f"m{f}.py", "text": "\n".join(lines) + "\n"})
    rows.append({"package": "pkg", "path": "empty.py", "text": ""})
    p = tmp_path / "heldout.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_heldout_sampling_is_deterministic_and_prefix_stable(tmp_path):
    p = _corpus(tmp_path)
    a_lines, a_spans = heldout_tasks(p, 12, 6, seed=3)
    b_lines, b_spans = heldout_tasks(p, 12, 6, seed=3)
    assert a_lines == b_lines and a_spans == b_spans
    c_lines, c_spans = heldout_tasks(p, 5, 2, seed=3)
    assert c_lines == a_lines[:5] and c_spans == a_spans[:2]
    d_lines, _ = heldout_tasks(p, 12, 0, seed=4)
    assert d_lines != a_lines
    assert len({t.task_id.split("/")[2] for t in a_lines}) == 6  # spread over every non-empty file


def test_heldout_tasks_shape(tmp_path):
    p = _corpus(tmp_path)
    docs = {d.name: "".join(d.lines) for d in read_documents(p)}
    lines = sample_tasks(read_documents(p), 20, span=None, seed=0)
    spans = sample_tasks(read_documents(p), 20, span=(2, 4), seed=0)
    assert len(lines) == 20 and len(spans) == 20
    for t in lines + spans:
        name = t.task_id.split("/", 1)[1].rsplit("/", 1)[0]
        assert t.prompt + t.canonical_solution + t.suffix == docs[name]
        assert t.line_hole and not t.executable
        v = t.editor_view()
        assert v.target == t.canonical_solution[:-1]
        first, last = t.canonical_solution.splitlines()[0], t.canonical_solution.splitlines()[-1]
        assert first.strip() and last.strip()
    assert all(not t.multiline for t in lines)
    assert {t.canonical_solution.count("\n") for t in spans} <= {2, 3, 4}
    assert all(t.multiline for t in spans)


def test_repeated_middles_and_the_exact_match_split():
    from diffill.evaluation.runner import Output, text_metrics
    from diffill.evaluation.tasks import InfillTask

    def task(prompt, middle, suffix):
        return InfillTask(task_id=f"t{len(prompt)}", prompt=prompt, suffix=suffix, canonical_solution=middle)

    rep = task("def f(x):\n    y = 1\n", "        y = 1\n", "    return y\n")  # twin, other indentation
    new = task("def f(x):\n", "    y = 2\n", "    return y\n")
    span = task("a = 1\nb = 2\n", "a = 1\nc = 3\n", "\n")  # one line of the span has no twin
    blank = task("x = 1\n", "\n", "x = 1\n")
    assert [repeats_in_file(t) for t in (rep, new, span, blank)] == [True, False, False, False]

    tasks = [rep, new]
    outs = [Output(rep.task_id, "        y = 1", 0.0, ""), Output(new.task_id, "    y = 3", 0.0, "")]
    flags = [repeats_in_file(t) for t in tasks]
    m = text_metrics(tasks, outs, {"repeated": flags, "fresh": [not f for f in flags]})
    assert m["exact_match"] == 0.5
    assert (m["repeated_tasks"], m["exact_match_repeated"]) == (1, 1.0)
    assert (m["fresh_tasks"], m["exact_match_fresh"]) == (1, 0.0)
    assert "exact_match_repeated" not in text_metrics(tasks, outs)
    empty = text_metrics(tasks, outs, {"none": [False, False]})
    assert empty["none_tasks"] == 0 and empty["exact_match_none"] is None
