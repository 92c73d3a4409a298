"""``diffill info``: load a model and describe it.

The report is a list of named sections, each produced by a function of the
loaded model (see :data:`SECTIONS`); later work (e.g. the engine's step plan)
adds a section by appending one function. ``--json`` prints the same sections
as one JSON object keyed by section name.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from ...model.attention import resolved_backend
from ...model.budget import StepBudget
from ...model.loader import LoadedModel, load_model
from ...model.measure import measure_plan
from ...model.plan import describe_plan
from ...model.recipes import describe
from . import add_recipe_option, add_threads_option, check_threads, configure_threads

Section = Callable[[LoadedModel, argparse.Namespace], dict[str, Any]]


def model_section(lm: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    cfg = lm.config
    return {
        "path": str(lm.path),
        "family": cfg.family,
        "architectures": list(cfg.architectures),
        "parameters": lm.num_parameters,
        "vocab_size": cfg.vocab_size,
        "tokenizer_vocab": lm.tokenizer.vocab_size,
        "layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "qk_norm": cfg.qk_norm,
        "qkv_bias": cfg.qkv_bias,
        "tied_embeddings": cfg.tie_embeddings,
        "shift_logits": cfg.shift_logits,
        "decode_block": cfg.decode_block,
        "draft_ratio": cfg.draft_ratio,
        "files": [p.name for p in lm.files],
    }


def runtime_section(lm: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "device": str(lm.device),
        "dtype": str(lm.dtype).removeprefix("torch."),
        "attention_backend": resolved_backend(lm.device, lm.dtype),
    }


def special_tokens_section(lm: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, i in (
        ("mask", lm.config.mask_token_id),
        ("pad", lm.config.pad_token_id),
        ("eos", lm.config.eos_token_id),
        ("bos", lm.config.bos_token_id),
    ):
        out[key] = None if i is None else {"id": i, "token": lm.tokenizer.id_to_token(i)}
    return out


def recipe_section(lm: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    """The family infilling recipe the loader chose (model/recipes.py) and why."""
    r = lm.config.recipe
    return {} if r is None else describe(r, lm.tokenizer.id_to_token)


# An absolute POSIX path inside a string: a "/" that starts a word (or follows "=") and is
# not part of a URL ("https://...") or of a relative path ("a/b", "./a", "~/a").
_ABS_PATH = re.compile(r"(?<![\w/.~:-])/[^\s'\"=,;]+")


def _short_path(path: str, home: str) -> str:
    """How :func:`anonymise_paths` shows one absolute path: ``~/...`` under this user's
    home, otherwise its last two components after ``.../`` (``.../checkpoints/step-0002103``)."""
    if home not in ("", "/") and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")):]
    parts = PurePosixPath(path).parts[1:]
    return "/".join(parts) if len(parts) <= 1 else ".../" + "/".join(parts[-2:])


def anonymise_paths(value: Any, home: str | None = None) -> Any:
    """``value`` (a provenance record: dicts, lists, strings) with every absolute path in
    its strings shortened by :func:`_short_path`.

    A checkpoint's provenance is written on the machine that trained it (its command line,
    the checkpoints it started from): those paths name another machine's folders (and its
    users), mean nothing here, and are not shown. The record on disk is left as it is.
    """
    home = str(Path.home()) if home is None else home
    if isinstance(value, str):
        return _ABS_PATH.sub(lambda m: _short_path(m.group(0), home), value)
    if isinstance(value, dict):
        return {k: anonymise_paths(v, home) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [anonymise_paths(v, home) for v in value]
    return value


def provenance_section(lm: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    """The checkpoint's provenance record, absolute paths shortened (:func:`anonymise_paths`)."""
    return anonymise_paths(dict(lm.provenance))


def step_plan_section(lm: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    """The engine's step plan (steps per shape bucket within the latency budget),
    measured on this device when ``--plan`` is given (it runs the model)."""
    if not getattr(args, "plan", False):
        return {}
    budget = StepBudget(lm.device.type, args.budget_ms)  # None: the device's default
    plan = measure_plan(
        lm.model, lm.config, budget_ms=budget.budget_ms(), model_name=str(lm.path), repeats=3
    )
    return {"table": describe_plan(plan), **msgspec.to_builtins(plan)}


# (name, function); a section returning an empty dict is omitted.
SECTIONS: list[tuple[str, Section]] = [
    ("model", model_section),
    ("runtime", runtime_section),
    ("special_tokens", special_tokens_section),
    ("recipe", recipe_section),
    ("provenance", provenance_section),
    ("step_plan", step_plan_section),
]


def collect(lm: LoadedModel, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    report: dict[str, dict[str, Any]] = {}
    for name, fn in SECTIONS:
        section = fn(lm, args)
        if section:
            report[name] = section
    return report


def _fmt(v: Any) -> str:
    if isinstance(v, dict) and set(v) == {"id", "token"}:
        return f"{v['id']} {v['token']!r}" if v["token"] is not None else str(v["id"])
    if isinstance(v, list):
        return ", ".join(str(x) for x in v) if v else "-"
    if isinstance(v, (dict,)):
        return json.dumps(v, sort_keys=True)
    if v is None:
        return "-"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def render_text(report: dict[str, dict[str, Any]]) -> str:
    lines: list[str] = []
    for name, section in report.items():
        lines.append(f"[{name}]")
        width = max(len(k) for k in section)
        for k, v in section.items():
            lines.append(f"  {k:<{width}}  {_fmt(v)}")
    return "\n".join(lines) + "\n"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "info",
        help="load a model and describe it",
        description="Load a checkpoint folder and print its family, shapes, special tokens, "
        "device, dtype, attention backend and provenance.",
    )
    p.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="checkpoint folder, or the name of a pulled checkpoint (default: the shipped model)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    add_recipe_option(p)
    add_threads_option(p)
    p.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: per device)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--plan",
        action="store_true",
        help="also measure and print the engine's step plan (steps per context x hole "
        "bucket that fit the latency budget); runs the model for a few seconds",
    )
    p.add_argument(
        "--budget-ms", type=float, default=None,
        help="latency budget for --plan (default: the device's, 25 ms on a GPU, 200 ms on a CPU)"
    )
    return p


def run(args: argparse.Namespace) -> int:
    err = check_threads(args)
    if err:
        print(f"diffill info: {err}", file=sys.stderr)
        return 2
    configure_threads(args, args.device)
    try:
        lm = load_model(args.model, device=args.device, dtype=args.dtype, recipe=args.recipe)
    except (ValueError, RuntimeError, MemoryError) as e:
        print(f"diffill info: {e}", file=sys.stderr)
        return 1
    report = collect(lm, args)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=False) + "\n")
    else:
        table = report.get("step_plan", {}).pop("table", None)
        if table is not None:
            report["step_plan"] = {"budget_ms": report["step_plan"]["budget_ms"]}
        sys.stdout.write(render_text(report))
        if table is not None:
            sys.stdout.write(table + "\n")
    return 0
