"""Held-out sampling from the corpus, repeated middles and the exact-match split."""

from __future__ import annotations

import json

from diffill.evaluation.heldout import (
    heldout_tasks,
    read_documents,
    repeats_in_file,
    sample_tasks,
)
from diffill.evaluation.tasks import (
    InfillTask,
)


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
