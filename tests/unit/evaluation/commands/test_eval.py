"""``diffill eval`` end to end on a tiny checkpoint (model through the Completer, sandbox,
held-out, baseline, frontier plot), and scoring of sample files without a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from diffill.cli import main as cli_main
from diffill.evaluation.frontier import parse_steps
from diffill.evaluation.tasks import (
    InfillTask,
    humaneval_single_line_tasks,
    read_samples,
    subset,
    write_samples,
    write_tasks,
)
from support import FIXTURES


@pytest.fixture()
def heldout_file(tmp_path) -> Path:
    text = (FIXTURES / "micro_corpus.py").read_text()
    rows = [{"package": "micro", "path": "micro_corpus.py", "text": text},
            {"package": "micro", "path": "tiny.py", "text": "def f(x):\n    y = x + 1\n    return y\n"}]
    p = tmp_path / "heldout.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_eval_with_limit_on_a_checkpoint(tmp_path, capsys, model_dir, heldout_file):
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(
        capsys, "eval", "--model", str(model_dir), "--limit", "3", "--steps", "2", "--frontier", "1,2",
        "--heldout", str(heldout_file), "--heldout-lines", "4", "--heldout-spans", "2",
        "--out", str(out), "--json", "--no-progress",
    )
    assert rc == 0, stderr
    data = json.loads(stdout)
    he = data["humaneval"]
    assert he["tasks"] == 3 and he["tasks_total"] == 1033
    assert set(he["systems"]) == {"model", "model+drafts", "empty", "baseline"}
    assert he["systems"]["model"]["steps_mean"] > 0 and "draft_offered" not in he["systems"]["model"]
    assert he["systems"]["model+drafts"]["model_calls_mean"] >= 1
    expected_ids = [t.task_id for t in subset(humaneval_single_line_tasks(), 3)]
    for name, s in he["systems"].items():
        assert s["tasks"] == 3
        assert s["passed"] + s["failed"] + s["timeout"] == 3
        assert s["pass_at_1"] == s["passed"] / 3
        samples = read_samples(out / f"samples_{name}.jsonl")
        assert list(samples) == expected_ids
        assert all(c.endswith("\n") for c in samples.values())  # line holes: insert + newline
    assert he["systems"]["model"]["latency_p50_ms"] > 0
    # the first three evenly spread tasks all need their line: empty completions fail
    assert he["systems"]["empty"]["passed"] == 0

    ho = data["heldout"]
    assert ho["lines"]["tasks"] == 3 and ho["spans"]["tasks"] == 2  # --limit caps both sets
    assert set(ho["lines"]["systems"]) == {"model", "model+drafts", "baseline"}
    for part in (ho["lines"], ho["spans"]):
        for s in part["systems"].values():
            assert 0.0 <= s["edit_similarity"] <= 1.0
            assert s["repeated_tasks"] + s["fresh_tasks"] == part["tasks"]

    assert [p["steps"] for p in data["frontier"]] == [1, 2]
    assert data["frontier"][1]["pass_at_1"] == he["systems"]["model"]["pass_at_1"]  # steps=2 is the main run
    png = out / "frontier.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    assert results["humaneval"] == he and results["sandbox"]["network"]
    details = [json.loads(x) for x in (out / "details_humaneval_model.jsonl").read_text().splitlines()]
    assert [d["task_id"] for d in details] == expected_ids and all("status" in d for d in details)


def test_samples_only_generates_without_executing(tmp_path, capsys, model_dir):
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(
        capsys, "eval", "--model", str(model_dir), "--limit", "2", "--steps", "1", "--samples-only",
        "--no-baseline", "--out", str(out), "--no-progress",
    )
    assert rc == 0, stderr
    assert len(read_samples(out / "samples_model.jsonl")) == 2
    assert (out / "samples_model+drafts.jsonl").is_file()
    results = json.loads((out / "results.json").read_text())
    assert "humaneval" not in results
    assert results["settings"]["model"]["block"] is None  # the scripted checkpoint names no block
    rc, _, stderr = run_cli(
        capsys, "eval", "--model", str(model_dir), "--limit", "2", "--steps", "2", "--samples-only",
        "--no-baseline", "--block", "1", "--no-drafts", "--out", str(out), "--no-progress",
    )
    assert rc == 0, stderr
    assert json.loads((out / "results.json").read_text())["settings"]["drafts"] is False
    assert json.loads((out / "results.json").read_text())["settings"]["model"]["block"] == 1


def test_scoring_canonical_samples(tmp_path, capsys):
    tasks = subset(humaneval_single_line_tasks(), 5)
    samples = tmp_path / "canonical.jsonl"
    write_samples(samples, [(t.task_id, t.canonical_solution) for t in tasks])
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(
        capsys, "eval", "--samples", str(samples), "--limit", "5", "--out", str(out), "--no-progress",
    )
    assert rc == 0, stderr
    data = json.loads((out / "results.json").read_text())
    m = data["humaneval"]["systems"]["model"]
    assert m["pass_at_1"] == 1.0 and m["exact_match"] == 1.0 and m["exact_match_ws"] == 1.0
    assert "pass@1" in stdout and "baseline" in stdout


def test_task_file_with_a_mid_line_hole(tmp_path, capsys):
    test = "def check(candidate):\n    assert candidate(2) == 5\n"
    tasks = [
        InfillTask("t/0", "def f(x):\n    return 2 * x", "\n", " + 1", test, "f"),
        InfillTask("t/1", "def f(x):\n", "", "    return 2 * x + 1\n", test, "f"),
    ]
    tf = tmp_path / "tasks.jsonl"
    write_tasks(tf, tasks)
    sf = tmp_path / "samples.jsonl"
    write_samples(sf, [("t/0", " + 1"), ("t/1", "    return x + 3\n")])
    out = tmp_path / "out"
    rc, _, stderr = run_cli(
        capsys, "eval", "--tasks", str(tf), "--samples", str(sf), "--out", str(out), "--json", "--no-progress",
    )
    assert rc == 0, stderr
    m = json.loads((out / "results.json").read_text())["humaneval"]["systems"]["model"]
    assert m["passed"] == 2 and m["exact_match"] == 0.5  # t/1 passes with a different line


def test_bad_arguments(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "eval", "--tasks", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path))
    assert rc == 2 and "no such file" in err
    with pytest.raises(SystemExit) as e:  # argparse: mutually exclusive options
        cli_main(["eval", "--samples", str(tmp_path / "x"), "--samples-only"])
    assert e.value.code == 2
    rc, _, err = run_cli(capsys, "eval", "--limit", "0", "--out", str(tmp_path))
    assert rc == 2 and "--limit" in err
    rc, _, err = run_cli(capsys, "eval", "--block", "0", "--out", str(tmp_path))
    assert rc == 2 and "--block" in err
    assert parse_steps("8,1,2,2") == [1, 2, 8]
    with pytest.raises(ValueError, match="integer"):
        parse_steps("1,x")


def test_eval_repository_level_set_and_workspace_cost(tmp_path, capsys, model_dir, heldout_file):
    """The repository-level section alone (--no-humaneval): the four model systems and the
    three non-neural ones per set, and the index cost on a small folder."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("def f(x):\n    return x + 1\n")
    rc, stdout, stderr = run_cli(
        capsys, "eval", "--model", str(model_dir), "--steps", "2", "--no-humaneval", "--no-heldout",
        "--heldout", str(heldout_file), "--repo-lines", "3", "--repo-spans", "1",
        "--repo-cost", str(ws), "--repo-cost-files", "10", "--out", str(tmp_path / "out"),
        "--json", "--no-progress",
    )
    assert rc == 0, stderr
    data = json.loads(stdout)
    assert "humaneval" not in data
    systems = {"model+drafts", "+ws.drafts", "+ws.context", "+ws.both", "baseline",
               "drafts-only", "drafts-only+ws"}
    for kind, n in (("lines", 3), ("spans", 1)):
        part = data["repo"][kind]
        assert part["tasks"] == n and set(part["systems"]) == systems
        assert part["systems"]["+ws.drafts"]["gather_p95_ms"] >= 0
    cost = data["repo_cost"]
    assert cost["files"] == 1 and cost["completion_while_building_ms"] > 0
