"""``diffill bench``: infill latency vs autoregressive decoding, with floors.

Examples::

    diffill bench --quick                          # CI-sized run on the default model
    diffill bench --model qwen2.5-1.5b --device cuda --ctx 1024 --holes 16 32 64 \\
        --steps 1 2 4 8 16 --json out.json --plot out.png
    diffill bench --model path/to/checkpoint --lsp 50   # plus end-to-end LSP latency
    diffill bench --quick --no-ar --no-floors --first 5  # plus time to the first suggestion
    diffill bench --vs-llamacpp --model DIR --threads 2 --repeats 3  # vs llama.cpp (extra)

See :mod:`diffill.evaluation.bench` for what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...lsp_server.commands import add_threads_option, check_threads, configure_threads
from ...model.asks import EngineAsk
from ...model.budget import StepBudget
from ...model.decoder.spec import SamplerConfig
from ...model.engine import Engine
from ...model.engine_options import EngineOptions
from ...model.loader import DTYPES
from ...model.measure import measure_plan
from ...model.plan import describe_plan
from ...model.runtime import resolve_device
from .. import bench
from ..bench import PRESETS, BenchOptions, percentile
from ..heldout import default_heldout_path, heldout_tasks
from ..lsp_client import StdioClient


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="measure infill latency (p50/p95, tokens/s) against autoregressive decoding",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="default",
                   help=f"checkpoint folder, or a preset with random weights: {', '.join(PRESETS)}; "
                        "default: the shipped model (random default shape if not installed)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--ctx", type=int, nargs="+", default=None, help="context lengths (tokens)")
    p.add_argument("--holes", type=int, nargs="+", default=None, help="hole lengths (tokens)")
    p.add_argument("--steps", type=int, nargs="+", default=None, help="denoising step counts")
    p.add_argument("--refresh", type=int, nargs="+", default=None,
                   help="dual-cache refresh periods to compare; 0 = no cache (default: 0 4)")
    p.add_argument("--candidates", type=int, default=None,
                   help="candidate hole lengths per request (1 = the hole only; default 1)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--no-ar", action="store_true", help="skip the autoregressive baseline")
    p.add_argument("--no-floors", action="store_true", help="skip the bandwidth/matmul floors")
    p.add_argument("--attention", default="auto", choices=["auto", "sdpa", "flash", "math"])
    p.add_argument("--graphs", action="store_true",
                   help="engine option: CUDA graphs of the step (with shape buckets)")
    p.add_argument("--select", default="none", choices=["none", "auto", "torch", "triton"],
                   help="engine option: fused select-and-unmask (none = the sampler's torch step)")
    p.add_argument("--kernel-bench", action="store_true",
                   help="also time select-and-unmask (torch vs Triton) at this model's vocabulary")
    p.add_argument("--lsp", type=int, default=0, metavar="N",
                   help="also time N completion requests through `diffill serve` over stdio")
    p.add_argument("--first", type=int, default=0, metavar="N",
                   help="also time the first suggestion from fresh processes, N times each: "
                        "`diffill complete` (start, import, model load, warm-up step, completion) "
                        "and `diffill serve` (initialize, didOpen, completion requests until the "
                        "first non-empty answer); medians")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="write a torch.profiler chrome trace of one infill (first grid point)")
    p.add_argument("--cache-quality", type=int, default=0, metavar="N",
                   help="also measure the dual cache's effect on N held-out line tasks: exact "
                        "match and agreement with the uncached sampler per --refresh value "
                        "(needs a checkpoint with a tokenizer)")
    p.add_argument("--heldout", default=None, metavar="JSONL",
                   help="held-out corpus for --cache-quality (default: $DIFFILL_HELDOUT or the "
                        "corpus build's heldout.jsonl)")
    p.add_argument("--plan", action="store_true",
                   help="also measure the step plan (steps per shape bucket for --budget-ms)")
    p.add_argument("--budget-ms", type=float, default=None,
                   help="latency budget for --plan (default: the device's, 25 ms on a GPU, "
                        "200 ms on a CPU)")
    p.add_argument("--step-variants", action="store_true",
                   help="instead of the grid: one first step of an editor-shaped request "
                        "(--ctx context, --candidates lengths halving from the largest --holes, "
                        "--drafts rows) timed per variant, interleaved: every row's whole "
                        "canvas (exact) vs one context per request (the CPU default)")
    p.add_argument("--drafts", type=int, default=1, metavar="N",
                   help="draft rows for --step-variants (default 1)")
    p.add_argument("--variants", nargs="+", default=["row", "request"],
                   choices=["row", "request", "request+int8"],
                   help="--step-variants to time: row (exact), request (one context per "
                        "request), request+int8 (that with int8 weights, model/quant.py)")
    p.add_argument("--int8-error", type=int, default=0, metavar="LAYERS",
                   help="instead of the grid: int8 weights vs fp32 logits (error, argmax "
                        "agreement) on a random model of --model's shape cut to LAYERS layers")
    p.add_argument("--vs-llamacpp", action="store_true",
                   help="instead of the grid: diffill and llama.cpp side by side on one file "
                        "(cold request, next keystroke, verified draft; evaluation/llamacpp.py) "
                        "with --model DIR converted to GGUF Q8_0; --steps (first value, "
                        "default 4), --holes (first, default 16), --refresh (first, default "
                        "0: no dual cache), --repeats (default 3), "
                        "--threads (default 2 per side); needs pip install 'diffill[llamacpp]'")
    p.add_argument("--gguf", default=None, metavar="FILE",
                   help="--vs-llamacpp: this GGUF instead of converting --model")
    p.add_argument("--json", default=None, metavar="FILE", help="write all results as JSON")
    p.add_argument("--plot", default=None, metavar="FILE", help="write a PNG of latency vs steps")
    p.add_argument("--quick", action="store_true", help="tiny grid for CI smoke runs")
    add_threads_option(p)
    return p


def _options(args: argparse.Namespace):
    if args.quick:
        base = BenchOptions(ctx=(64,), holes=(8,), steps=(1, 2), refresh=(0, 2), repeats=2,
                            warmup=1, floor_copy_mb=16, floor_matmul_n=256)
    else:
        base = BenchOptions()
    for name in ("ctx", "holes", "steps", "refresh"):
        v = getattr(args, name)
        if v:
            setattr(base, name, tuple(v))
    for name in ("candidates", "repeats", "warmup"):
        v = getattr(args, name)
        if v is not None:
            setattr(base, name, v)
    base.ar = not args.no_ar
    base.floors = not args.no_floors
    base.attention = args.attention
    base.graphs = args.graphs
    base.select_impl = None if args.select == "none" else args.select
    return base


def _kernel_shapes(args: argparse.Namespace, vocab: int, opts) -> tuple[tuple[int, int, int], ...]:
    if not args.kernel_bench:
        return ()
    return tuple((b, n, vocab) for b in (1, 3) for n in opts.holes)


def run(args: argparse.Namespace) -> int:
    err = check_threads(args)
    if err:
        print(f"diffill bench: {err}", file=sys.stderr)
        return 2
    device = str(resolve_device(args.device))
    configure_threads(args, device)
    dtype = None
    if args.dtype:
        if args.dtype.lower() not in DTYPES:
            print(f"diffill bench: unknown --dtype {args.dtype!r}", file=sys.stderr)
            return 2
        dtype = DTYPES[args.dtype.lower()]

    def log(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    if args.vs_llamacpp:
        return vs_llamacpp(args, log)
    opts = _options(args)
    if args.int8_error and args.model in PRESETS:  # the shape only: no full model is built
        print(json.dumps(bench.int8_logits_error(PRESETS[args.model], layers=args.int8_error),
                         indent=2))
        return 0
    try:
        bm = bench.load_bench_model(args.model, device, dtype)
    except (ValueError, RuntimeError, MemoryError) as e:
        print(f"diffill bench: {e}", file=sys.stderr)
        return 2
    log(f"model {bm.name} on {bm.device} {bm.dtype}")
    opts.kernel_shapes = _kernel_shapes(args, bm.config.vocab_size, opts)
    if args.int8_error:
        print(json.dumps(bench.int8_logits_error(bm.config, layers=args.int8_error), indent=2))
        return 0
    if args.step_variants:
        models = {}
        if "request+int8" in args.variants:
            models["request+int8"] = bench.int8_copy(bm.model)
        res = bench.step_variants(bm, ctx=opts.ctx[0], hole=max(opts.holes),
                                  candidates=args.candidates or 3, drafts=args.drafts,
                                  repeats=args.repeats or 2,
                                  warmup=1 if args.warmup is None else args.warmup,
                                  variants=[v for v in args.variants if v != "request+int8"],
                                  models=models, log=log)
        print(json.dumps(res, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
        return 0
    result = bench.run_bench(bm, opts, log=log)
    if args.plan:
        budget = StepBudget(bm.device.type, args.budget_ms)  # None: the device's default
        plan = measure_plan(bm.model, bm.config, budget_ms=budget.budget_ms(),
                            ctx_buckets=opts.ctx, hole_buckets=opts.holes,
                            refresh_every=max(opts.refresh), repeats=max(2, opts.repeats // 2),
                            model_name=bm.name)
        result["plan"] = json.loads(plan.to_json())
        log("step plan:\n" + describe_plan(plan))
    if args.profile:
        trace = bench.profile_infill(bm, opts, args.profile)
        result["profile"] = trace
        log(f"profiler trace: {args.profile}")
    if args.cache_quality:
        if bm.lm is None or bm.lm.tokenizer is None:
            log("--cache-quality needs a checkpoint folder with a tokenizer; skipped")
        else:
            result["cache_quality"] = cache_quality(
                bm.lm, args.cache_quality, refresh=sorted({max(1, r) for r in opts.refresh} | {1}),
                heldout=args.heldout, log=log)
    if args.lsp:
        if bm.lm is None and not bm.trained:
            log("LSP end-to-end needs a checkpoint folder with a tokenizer; skipped")
            result["lsp"] = None
        else:
            result["lsp"] = bench_lsp(str(bm.lm.path if bm.lm else args.model), args.lsp,
                                      device=str(bm.device), log=log)
    if args.first:
        if bm.lm is None:
            log("time to first suggestion needs a checkpoint folder with a tokenizer; skipped")
            result["first_suggestion"] = None
        else:
            result["first_suggestion"] = bench_first_suggestion(
                str(bm.lm.path), args.first, device=str(bm.device), threads=args.threads, log=log)
    print(bench.format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        log(f"wrote {args.json}")
    if args.plot:
        bench.plot(result, args.plot)
        log(f"wrote {args.plot}")
    return 0


def vs_llamacpp(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """``--vs-llamacpp``: :func:`diffill.evaluation.llamacpp.run_side_by_side`."""
    from .. import llamacpp  # only for --vs-llamacpp

    try:
        llamacpp.require("llama_cpp")
        if args.gguf is None:
            llamacpp.require("gguf")
    except llamacpp.MissingExtra as e:
        print(f"diffill bench: {e}", file=sys.stderr)
        return 2
    if args.model in PRESETS or args.model == "default" or not Path(args.model).is_dir():
        print("diffill bench: --vs-llamacpp needs --model DIR, a checkpoint folder of the Qwen2 "
              "layout (e.g. python scripts/make_shape_checkpoint.py DIR)", file=sys.stderr)
        return 2
    try:
        res = llamacpp.run_side_by_side(
            args.model, gguf_file=args.gguf, threads=args.threads or 2,
            steps=args.steps[0] if args.steps else 4, hole=args.holes[0] if args.holes else 16,
            refresh=args.refresh[0] if args.refresh else 1,
            repeats=args.repeats or 3, warmup=1 if args.warmup is None else args.warmup, log=log)
    except (ValueError, RuntimeError) as e:
        print(f"diffill bench: {e}", file=sys.stderr)
        return 2
    print(llamacpp.format_table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        log(f"wrote {args.json}")
    return 0


# -- end-to-end LSP latency -----------------------------------------------------------------------


def _bench_document(n: int) -> str:
    funcs = []
    for i in range(n):
        funcs.append(
            f"def function_{i}(values, limit={i + 3}):\n"
            f"    total = 0\n"
            f"    for v in values:\n"
            f"        if v > limit:\n"
            f"            total += v * {i + 1}\n"
            f"    return total\n"
        )
    return "import os\nimport sys\n\n\n" + "\n\n".join(funcs)


def _typed_document(n: int) -> tuple[str, list[tuple[int, int]]]:
    """:func:`first_document` with a new name typed at each cut line's end (``wq0x``, ...),
    and the (row, col) after it: a half-typed word that token healing backs off over and the
    model cannot reproduce, so each request makes a second, plain model call (issue 24)."""
    text, targets = first_document(n)
    lines = text.split("\n")
    for i, (row, _) in enumerate(targets):
        lines[row] += f"wq{i}x"
    return "\n".join(lines), [(row, len(lines[row])) for row, _ in targets]


def _timed_completions(client: StdioClient, uri: str, targets: list[tuple[int, int]],
                       ) -> tuple[list[float], list[int], dict[str, Any]]:
    """Each completion's e2e ms and the model calls it made (``diffill/status``'s
    ``model_calls`` read after it, outside its time), and the last status."""
    e2e: list[float] = []
    calls: list[int] = []
    status = client.request("diffill/status", None) or {}
    for row, col in targets:
        before = status.get("model_calls") or 0
        t = time.perf_counter()
        client.request("textDocument/completion", {"textDocument": {"uri": uri},
                                                   "position": {"line": row, "character": col}})
        e2e.append((time.perf_counter() - t) * 1e3)
        status = client.request("diffill/status", None) or {}
        calls.append((status.get("model_calls") or 0) - before)
    return e2e, calls, status


def _calls_and_budget(e2e: list[float], calls: list[int], budget: float) -> dict[str, Any]:
    return {"model_calls_mean": round(statistics.fmean(calls), 3) if calls else None,
            "model_calls_max": max(calls, default=None), "budget_ms": budget,
            "p95_over_budget": round(percentile(e2e, 95) / budget, 3) if e2e else None}


def bench_lsp(model: str, n: int, *, device: str = "cpu", log=print,
              load_timeout: float = 600.0) -> dict[str, Any]:
    """Spawn ``diffill serve`` on stdio, open a document and time ``n`` completion
    requests (each at a different line, so the typed-ahead cache cannot answer).
    Returns e2e p50/p95 and the server overhead (e2e p50 minus the server's own
    model-time p50 from ``diffill/status``), the model calls each request made (mean, max)
    and p95 over the latency budget the server's requests had (its ``latencyBudgetMs``, else
    the device's default: :class:`~diffill.model.budget.StepBudget`). Then ``n`` requests
    after a half-typed new name (:func:`_typed_document`: two model calls each), reported
    under ``typed``."""
    argv = [sys.executable, "-m", "diffill.cli", "serve", "--model", model,
            "--device", device]
    client = StdioClient(argv, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        client.initialize()
        t0 = time.monotonic()
        client.wait_loaded(load_timeout, poll_s=0.2)
        log(f"LSP server loaded the model in {time.monotonic() - t0:.1f} s")
        text = _bench_document(max(n, 1))
        uri = "file:///bench/example.py"
        client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python",
                                                                "version": 1, "text": text}})
        lines = text.split("\n")
        # the cursor after "total += " in each function: a mid-line hole
        targets = [(i, ln.index("+= ") + 3) for i, ln in enumerate(lines) if "total += " in ln]
        targets = (targets * (n // max(1, len(targets)) + 1))[:n]
        e2e, calls, status = _timed_completions(client, uri, targets)
        typed_text, typed_targets = _typed_document(max(n, 1))
        typed_uri = "file:///bench/typed.py"
        client.notify("textDocument/didOpen", {"textDocument": {
            "uri": typed_uri, "languageId": "python", "version": 1, "text": typed_text}})
        typed, typed_calls, _ = _timed_completions(client, typed_uri, typed_targets[:n])
    finally:
        client.close()
    p50 = percentile(e2e, 50)
    model_p50 = status.get("model_p50_ms")
    budget = StepBudget(device.split(":")[0],
                        (status.get("options") or {}).get("latencyBudgetMs")).budget_ms()
    return {"n": len(e2e), "e2e_p50_ms": round(p50, 3), "e2e_p95_ms": round(percentile(e2e, 95), 3),
            "e2e_mean_ms": round(statistics.fmean(e2e), 3), "server_model_p50_ms": model_p50,
            "server_p50_ms": status.get("p50_ms"),
            "overhead_p50_ms": None if model_p50 is None else round(p50 - model_p50, 3),
            "cache_hits": status.get("cache_hits", 0), "model_requests": status.get("model_requests"),
            **_calls_and_budget(e2e, calls, budget),
            "typed": {"n": len(typed), "e2e_p50_ms": percentile(typed, 50),
                      "e2e_p95_ms": percentile(typed, 95),
                      **_calls_and_budget(typed, typed_calls, budget)}}


# -- time to the first suggestion -------------------------------------------------------------------


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 4) if vals else None


def first_document(n: int = 8) -> tuple[str, list[tuple[int, int]]]:
    """:func:`_bench_document` with every ``total += v * k`` line cut after ``total += ``,
    and the 0-based (row, col) of those line ends: holes where something is missing (a
    cursor before ``v * k`` would have nothing to insert)."""
    lines = _bench_document(n).split("\n")
    targets = []
    for i, ln in enumerate(lines):
        if "total += " in ln:
            lines[i] = ln[:ln.index("+= ") + 3]
            targets.append((i, len(lines[i])))
    return "\n".join(lines), targets


def first_complete(model: str, file: Path, row: int, col: int, *, device: str = "cpu",
                   threads: int | None = None, timeout: float = 300.0,
                   env: dict[str, str] | None = None) -> dict[str, Any]:
    """One fresh ``diffill complete --json`` process: wall time from start to exit and the
    phases it reports (import, model load, warm-up step, completion; a phase an older
    diffill does not report is None). ``env``: the child's environment (default: ours)."""
    argv = [sys.executable, "-m", "diffill.cli", "complete", str(file), "--line",
            str(row + 1), "--col", str(col + 1), "--json", "--model", model, "--device", device]
    if threads is not None:
        argv += ["--threads", str(threads)]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise RuntimeError(f"diffill complete exited {p.returncode}: {p.stderr.strip()[-500:]}")
    d = json.loads(p.stdout)
    warm = (d.get("warmup_ms") or 0.0) / 1e3
    phases = (d.get("import_s") or 0.0) + d["load_s"] + warm + d["complete_ms"] / 1e3
    return {"wall_s": wall, "import_s": d.get("import_s"), "load_s": d["load_s"],
            "warmup_ms": d.get("warmup_ms"), "complete_ms": d["complete_ms"],
            "startup_exit_s": wall - phases, "steps": d.get("steps"),
            "over_budget": d.get("over_budget"), "budget_ms": d.get("latency_budget_ms"),
            "suggested": bool(d["suggestions"])}


def first_serve(model: str, targets: list[tuple[int, int]], text: str, *, device: str = "cpu",
                threads: int | None = None, timeout: float = 300.0, poll_s: float = 0.02,
                max_after_load: int = 32, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One fresh ``diffill serve`` on stdio, as an editor drives it: ``initialize``,
    ``initialized``, ``didOpen``, then completion requests (cycling over ``targets``) until
    the first non-empty answer (``first_suggestion_s`` None when ``max_after_load`` answers
    of the loaded model were all empty). Seconds from the process start to each point."""
    argv = [sys.executable, "-m", "diffill.cli", "serve", "--model", model,
            "--device", device]
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    if threads is not None:
        env["DIFFILL_THREADS"] = str(threads)
    t0 = time.perf_counter()
    client = StdioClient(argv, env=env)
    out: dict[str, Any] = {}
    try:
        client.request("initialize", {"processId": os.getpid(), "rootUri": None,
                                      "capabilities": {"general": {"positionEncodings": ["utf-16"]}}},
                       timeout=timeout)
        out["initialize_s"] = time.perf_counter() - t0
        client.notify("initialized", {})
        out["initialized_s"] = time.perf_counter() - t0
        uri = "file:///bench/first.py"
        client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python",
                                                                "version": 1, "text": text}})
        loaded_s: float | None = None
        empty_after_load = 0
        i = 0
        while True:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"no suggestion within {timeout:g} s")
            if loaded_s is None:
                status = client.request("diffill/status", None, timeout=timeout) or {}
                if status.get("error"):
                    raise RuntimeError(f"server could not load the model: {status['error']}")
                if status.get("loaded"):
                    loaded_s = time.perf_counter() - t0
            row, col = targets[i % len(targets)]
            i += 1
            t_req = time.perf_counter()
            res = client.request("textDocument/completion",
                                 {"textDocument": {"uri": uri}, "position": {"line": row, "character": col}},
                                 timeout=timeout) or {}
            items = res.get("items", []) if isinstance(res, dict) else res
            if loaded_s is None and items:
                loaded_s = t_req - t0  # the load ended while this request waited for its turn
            if loaded_s is not None and "first_answer_ms" not in out:
                out["first_answer_ms"] = (time.perf_counter() - t_req) * 1e3
            if items:
                out["first_suggestion_s"] = time.perf_counter() - t0
                break
            if loaded_s is None:
                time.sleep(poll_s)
                continue
            empty_after_load += 1
            if empty_after_load >= max_after_load:
                out["first_suggestion_s"] = None
                break
        status = client.request("diffill/status", None, timeout=timeout) or {}
    finally:
        client.close()
    out["loaded_s"] = loaded_s
    out["requests"] = i
    out["empty_answers_after_load"] = empty_after_load
    out["model_p50_ms"] = status.get("model_p50_ms")
    return out


def bench_first_suggestion(model: str, n: int, *, device: str = "cpu", threads: int | None = None,
                           log: Callable[[str], None] = print,
                           timeout: float = 300.0) -> dict[str, Any]:
    """Time to the first suggestion from fresh processes, ``n`` runs of each, medians:

    * ``complete``: ``diffill complete --json`` on a file (the cursor after ``total += ``):
      wall time start -> exit and the phases the command reports (import of torch and the
      model code, model load, the warm-up step, the completion itself); ``startup_exit_s``
      is the rest (interpreter start, argument parsing, output, exit).
    * ``serve``: ``diffill serve`` on stdio: seconds from the process start to the
      ``initialize`` answer, to the model being loaded (``diffill/status``, polled every
      20 ms) and to the first non-empty completion. ``after_import_s`` is the first
      suggestion's time after ``initialized`` less the import time measured by the
      ``complete`` runs (the server loads the same modules on its worker thread after
      ``initialized``): model load, warm-up and the first completions.
    """
    text, targets = first_document()
    load_avg_before = os.getloadavg()
    runs_c: list[dict[str, Any]] = []
    runs_s: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="diffill-first-") as tmp:
        src = Path(tmp) / "first.py"
        src.write_text(text)
        for k in range(n):  # interleaved, so a busy spell of the machine hits both alike
            r = first_complete(model, src, *targets[0], device=device, threads=threads,
                               timeout=timeout)
            runs_c.append(r)
            log(f"first suggestion, diffill complete #{k + 1}: {r['wall_s']:.2f} s (import "
                f"{r['import_s']:.2f}, load {r['load_s']:.3f}, warm-up {r['warmup_ms'] or 0:.0f} ms, "
                f"completion {r['complete_ms']:.0f} ms, {r['steps']} steps)")
            s = first_serve(model, targets, text, device=device, threads=threads, timeout=timeout)
            runs_s.append(s)
            first = s["first_suggestion_s"]
            log(f"first suggestion, diffill serve #{k + 1}: "
                + (f"{first:.2f} s after start" if first is not None else
                   f"none in {s['empty_answers_after_load']} answers")
                + f" (initialize {s['initialize_s']:.2f} s, loaded {s['loaded_s'] or 0:.2f} s, "
                f"{s['empty_answers_after_load']} empty answers after the load)")
    import_s = _median([r["import_s"] for r in runs_c])
    complete = {k: _median([r.get(k) for r in runs_c]) for k in
                ("wall_s", "import_s", "load_s", "warmup_ms", "complete_ms", "startup_exit_s", "steps")}
    complete["suggested"] = sum(r["suggested"] for r in runs_c)
    complete["over_budget"] = sum(bool(r["over_budget"]) for r in runs_c)
    complete["budget_ms"] = runs_c[0]["budget_ms"] if runs_c else None
    serve = {k: _median([r.get(k) for r in runs_s]) for k in
             ("initialize_s", "initialized_s", "loaded_s", "first_suggestion_s", "first_answer_ms",
              "requests", "empty_answers_after_load", "model_p50_ms")}
    after = [r["first_suggestion_s"] - r["initialized_s"] - import_s for r in runs_s
             if import_s is not None and r["first_suggestion_s"] is not None]
    serve["after_import_s"] = _median(after)
    serve["suggested"] = sum(r["first_suggestion_s"] is not None for r in runs_s)
    loaded_after = [r["loaded_s"] - r["initialized_s"] - import_s for r in runs_s
                    if import_s is not None and r["loaded_s"] is not None]
    serve["loaded_after_import_s"] = _median(loaded_after)
    return {"n": n, "device": device, "model": model, "complete": complete, "serve": serve,
            "runs": {"complete": runs_c, "serve": runs_s},
            "load_average": {"before": [round(x, 2) for x in load_avg_before],
                             "after": [round(x, 2) for x in os.getloadavg()]}}


# -- dual-cache quality on held-out code ------------------------------------------------------------


def cache_quality(lm: Any, n: int, *, refresh: list[int], heldout: str | None = None,
                  steps: int = 8, max_tokens: int = 32, ctx_tokens: int = 384,
                  log=print) -> dict[str, Any]:
    """Held-out single-line tasks filled by the engine with the dual cache refreshed every
    r steps (r = 1: no cache). Per r: exact match against the hidden line (whitespace at
    the ends ignored) and agreement with r = 1 (identical middle). Context: the last
    ``ctx_tokens`` prefix tokens and the first ``ctx_tokens // 2`` suffix tokens."""
    path = heldout or default_heldout_path()
    if path is None:
        raise ValueError("no held-out corpus: pass --heldout or set DIFFILL_HELDOUT")
    tasks, _ = heldout_tasks(path, n, 0, seed=0)
    tok = lm.tokenizer
    limit = lm.config.max_position_embeddings
    reqs = []
    for t in tasks:
        pre, suf = tok.encode_batch([t.prompt, t.suffix])
        budget = max(0, limit - max_tokens - 2)
        keep_suf = min(len(suf), ctx_tokens // 2, budget // 3)
        keep_pre = min(len(pre), ctx_tokens, budget - keep_suf)
        reqs.append((pre[len(pre) - keep_pre:], suf[:keep_suf], t.canonical_solution))
    out: dict[str, Any] = {"heldout": str(path), "tasks": len(reqs), "steps": steps,
                           "max_tokens": max_tokens, "by_refresh": []}
    base: list[list[int]] = []
    for r in refresh:
        eng = Engine(lm, SamplerConfig(steps=steps),
                     options=EngineOptions(batch=False, refresh_every=r, context="row"))
        em = agree = 0
        t0 = time.perf_counter()
        mids = []
        for i, (pre, suf, target) in enumerate(reqs):
            res = eng.infill(EngineAsk(pre, suf, max_tokens=max_tokens))
            ids = res[0].ids if res else []
            mids.append(ids)
            em += tok.decode(ids).strip() == target.strip()
            if base:
                agree += ids == base[i]
        if not base:
            base = mids
            agree = len(reqs)
        row = {"refresh_every": r, "exact_match": round(em / max(1, len(reqs)), 4),
               "agreement_with_uncached": round(agree / max(1, len(reqs)), 4),
               "seconds": round(time.perf_counter() - t0, 2)}
        out["by_refresh"].append(row)
        log(f"cache quality r={r}: EM {row['exact_match']:.3f}, agreement "
            f"{row['agreement_with_uncached']:.3f} ({row['seconds']} s)")
    return out
