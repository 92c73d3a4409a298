"""``diffill bench`` smoke tests on a tiny model (no timings asserted)."""

from __future__ import annotations

import json

import pytest
import torch
from diffill.cli import main
from diffill.evaluation import bench


def test_weight_bytes_counts_each_weight_once():
    for name in ("tiny", "default-shape"):
        cfg = bench.PRESETS[name]
        m = bench.random_model(cfg)
        assert bench.weight_bytes(cfg, torch.float32) == 4 * m.num_parameters()  # tied head
    cfg = bench.PRESETS["tiny"].replace(tie_embeddings=False, qkv_bias=False)
    m = bench.random_model(cfg)
    emb = cfg.vocab_size * cfg.hidden_size
    assert bench.weight_bytes(cfg, torch.bfloat16) == 2 * (m.num_parameters() - emb)


def test_presets_have_the_public_shapes():
    from diffill.model.transformer import Transformer

    with torch.device("meta"):
        n05 = Transformer(bench.PRESETS["qwen2.5-0.5b"]).num_parameters()
        n15 = Transformer(bench.PRESETS["qwen2.5-1.5b"]).num_parameters()
        n7 = Transformer(bench.PRESETS["qwen2.5-7b"]).num_parameters()
    assert 0.49e9 < n05 < 0.50e9  # Qwen2.5-0.5B: 494M
    assert 1.54e9 < n15 < 1.55e9  # Qwen2.5-1.5B: 1.54B
    assert 7.6e9 < n7 < 7.7e9  # Qwen2.5-7B: 7.62B


def test_percentile():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert bench.percentile(xs, 50) == 3.0
    assert bench.percentile(xs, 95) == 5.0
    assert bench.percentile([7.0], 95) == 7.0


def test_run_bench_quick_on_tiny(tmp_path):
    bm = bench.load_bench_model("tiny")
    opts = bench.BenchOptions(ctx=(24, 2000), holes=(4,), steps=(1, 2, 8), refresh=(0, 2),
                              repeats=2, warmup=0, floor_copy_mb=1, floor_matmul_n=64)
    res = bench.run_bench(bm, opts)
    grid = [(r["ctx"], r["hole"], r["steps"], r["refresh"]) for r in res["infill"]]
    # ctx 2000 exceeds 1024 positions; 8 steps exceed the 4-token hole; 1 step is never cached
    assert grid == [(24, 4, 1, 0), (24, 4, 2, 0), (24, 4, 2, 2)]
    assert [(a["ctx"], a["hole"]) for a in res["ar"]] == [(24, 4)]
    for r in res["infill"]:
        assert r["p50_ms"] > 0 and r["p95_ms"] >= r["p50_ms"]
        assert r["ar_over_diffusion"] > 0 and r["over_floor"] > 0
        assert r["weight_floor_ms"] > 0 and r["flop_floor_ms"] > 0
    assert res["floors"]["copy_gbps"] > 0 and res["trained_weights"] is False
    json.dumps(res)
    text = bench.format_table(res)
    assert "AR/diff" in text and len(text.splitlines()) == 4 + len(grid)
    png = tmp_path / "lat.png"
    bench.plot(res, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prof = bench.profile_infill(bm, opts, tmp_path / "trace.json")
    assert (tmp_path / "trace.json").stat().st_size > 0 and prof["steps"] == 2
    # the engine's speed options run too (the CUDA-graph loop uncaptured on CPU)
    fast = bench.run_bench(bm, bench.BenchOptions(ctx=(24,), holes=(4,), steps=(2,), refresh=(2,),
                                                  repeats=1, warmup=0, ar=False, floors=False,
                                                  graphs=True, select_impl="torch"))
    assert [(r["graphs"], r["select"]) for r in fast["infill"]] == [(True, "torch")]
    assert "over_floor" not in fast["infill"][0]


def test_cli_bench_quick(tmp_path, capsys):
    out = tmp_path / "b.json"
    png = tmp_path / "b.png"
    rc = main(["bench", "--quick", "--model", "tiny", "--json", str(out), "--plot", str(png),
               "--plan", "--budget-ms", "1000"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["infill"] and res["ar"] and res["plan"]["choices"]
    assert png.stat().st_size > 0
    assert "ctx" in capsys.readouterr().out
    assert main(["bench", "--quick", "--model", str(tmp_path / "missing")]) == 2


@pytest.mark.e2e
@pytest.mark.slow
def test_lsp_end_to_end_latency(tmp_path):
    from diffill.evaluation.commands.bench import bench_lsp
    from support import tiny_config, write_diffill_checkpoint

    folder = tmp_path / "ckpt"
    write_diffill_checkpoint(folder, tiny_config(vocab_size=300))
    res = bench_lsp(str(folder), 3, log=lambda s: None)
    assert res["n"] == 3 and res["model_requests"] == 3 and res["cache_hits"] == 0
    assert res["e2e_p50_ms"] > 0 and res["server_model_p50_ms"] is not None
    assert res["e2e_p95_ms"] >= res["e2e_p50_ms"]
    # at least one model call a request, at most four (token healing's pass and the plain
    # one, each with a rerun without drafts); the CPU's default budget, as diffill serve
    # runs without latencyBudgetMs
    assert 1 <= res["model_calls_mean"] <= res["model_calls_max"] <= 4 and res["budget_ms"] == 200.0
    assert res["p95_over_budget"] == round(res["e2e_p95_ms"] / 200.0, 3)
    typed = res["typed"]
    assert typed["n"] == 3 and 1 <= typed["model_calls_mean"] <= typed["model_calls_max"] <= 4


def test_typed_document_puts_the_cursor_after_a_new_name():
    from diffill.evaluation.commands.bench import _typed_document
    from diffill.lsp_server.completion.completer import partial_word

    text, targets = _typed_document(3)
    lines = text.split("\n")
    assert [lines[r][-7:] for r, _ in targets] == ["+= wq0x", "+= wq1x", "+= wq2x"]
    assert all(c == len(lines[r]) for r, c in targets)  # at the end of its line
    r, c = targets[0]
    offset = sum(len(ln) + 1 for ln in lines[:r]) + c
    assert partial_word(text, offset) == " wq0x"  # token healing backs off over it


def test_cache_quality_on_a_tiny_checkpoint(tmp_path):
    from diffill.evaluation.commands.bench import cache_quality
    from diffill.model.loader import load_model
    from support import tiny_config, write_diffill_checkpoint

    folder = tmp_path / "ckpt"
    write_diffill_checkpoint(folder, tiny_config(vocab_size=300))
    doc = "\n".join(f"w{i} w{i + 1} w{i + 2}" for i in range(4, 40)) + "\n"
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(json.dumps({"package": "p", "path": "a.py", "text": doc}) + "\n")
    res = cache_quality(load_model(folder), 4, refresh=[1, 3], heldout=str(heldout), steps=4,
                        max_tokens=8, log=lambda s: None)
    assert res["tasks"] == 4
    rows = res["by_refresh"]
    assert [r["refresh_every"] for r in rows] == [1, 3]
    assert rows[0]["agreement_with_uncached"] == 1.0
    assert all(0 <= r["exact_match"] <= 1 and 0 <= r["agreement_with_uncached"] <= 1 for r in rows)


def test_first_document_cuts_the_target_lines():
    from diffill.evaluation.commands.bench import first_document

    text, targets = first_document(3)
    lines = text.split("\n")
    assert len(targets) == 3
    for row, col in targets:
        assert lines[row].endswith("total += ") and col == len(lines[row])


@pytest.mark.e2e
@pytest.mark.slow
def test_time_to_first_suggestion(tmp_path, capsys):
    """Fresh `diffill complete` and `diffill serve` processes on a checkpoint that always
    writes "w7" with a fusing decoder ("w7w7...", a Python name the syntax guard keeps):
    both must produce a suggestion, and the phases must add up."""
    from support.constant_checkpoint import word_id, write_constant_checkpoint

    model = write_constant_checkpoint(tmp_path / "w7", word_id(7), fuse=True)
    out = tmp_path / "b.json"
    rc = main(["bench", "--quick", "--no-ar", "--no-floors", "--model", str(model), "--first", "1",
               "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["first_suggestion"]
    c, s = res["complete"], res["serve"]
    assert c["suggested"] == 1 and s["suggested"] == 1
    assert c["wall_s"] > c["import_s"] > 0 and c["load_s"] > 0 and c["complete_ms"] > 0
    assert c["warmup_ms"] > 0 and c["steps"] >= 1 and c["budget_ms"] == 200.0
    assert abs(c["wall_s"] - (c["import_s"] + c["load_s"] + (c["warmup_ms"] + c["complete_ms"]) / 1e3
                              + c["startup_exit_s"])) < 1e-6
    assert 0 < s["initialize_s"] <= s["initialized_s"] <= s["loaded_s"] < s["first_suggestion_s"]
    assert s["first_answer_ms"] > 0 and s["empty_answers_after_load"] == 0
    text = capsys.readouterr().out
    assert "first suggestion (medians of 1 fresh processes" in text and "diffill serve:" in text
