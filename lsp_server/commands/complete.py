"""``diffill complete FILE --line L --col C``: fill the hole at a position, print it.

Lines and columns are 1-based, like editors show them; the column counts
characters (Unicode code points) and may be one past the last character (the
end of the line). The suggestion is what would be inserted at the cursor.

Without ``--steps`` the step count is chosen to fit the latency budget
(``--latency-budget-ms``, else the device's default, 25 ms on a GPU, 200 ms on a CPU),
by the engine's step plan as in the server (``docs/step-budget.md``): instead of timing
every shape bucket, the local model first runs one refinement step on this request's own
context and hole (``warmup_ms`` in ``--json``), the plan is made from that timing, and
the completion then takes the steps that fit. When it still takes longer than the budget (one step alone is
over it, or token healing needed a second model call), ``--json`` says why in
``budget_note`` and one line on stderr says so too.

Exit status (:data:`EXIT_CODES`): 0 a suggestion was printed, 1 nothing to suggest,
2 usage or bad input, 3 the model could not be loaded, 4 the completion failed.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import sys
import time
from pathlib import Path

import msgspec

from ..backend.backends import BackendError, LocalBackend, load_local_backend
from ..completion.completer import Completer, CompletionAsk, options_from_kwargs
from ..completion.options import WIRE_NAMES, flag_errors
from . import (
    add_device_option,
    add_recipe_option,
    add_threads_option,
    check_threads,
    configure_threads,
)

MAX_FILE_MB_DEFAULT = 16.0

EXIT_OK = 0
EXIT_NO_SUGGESTION = 1
EXIT_USAGE = 2
EXIT_LOAD_FAILED = 3
EXIT_COMPLETION_FAILED = 4
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "a suggestion was printed",
    EXIT_NO_SUGGESTION: "nothing to suggest (the model's answer was empty, or post-processing "
                        "and the syntax guard dropped every candidate)",
    EXIT_USAGE: "usage error or bad input (arguments, file, position, option values)",
    EXIT_LOAD_FAILED: "the model could not be loaded",
    EXIT_COMPLETION_FAILED: "the completion failed (model or backend error)",
}
"""``diffill complete``'s exit status; argparse's usage errors are 2 as well. An uncaught
Python exception would exit 1, so every other failure is caught and reported as 4."""


class InputError(ValueError):
    """A file or position the command cannot use; the message says why."""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "complete",
        help="fill the hole at FILE:LINE:COL and print the suggestion",
        description=(
            "Complete at a position of a file with the diffusion model and print what would be "
            "inserted at the cursor. LINE and COL are 1-based (as editors show them); COL counts "
            "characters (code points) and may be one past the line's last character."
        ),
        epilog="exit status: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()),
    )
    p.add_argument("file", help="source file (UTF-8 text), or - for standard input")
    p.add_argument("--line", type=int, required=True, help="1-based line of the cursor")
    p.add_argument("--col", type=int, required=True,
                   help="1-based column of the cursor: the cursor sits before this character")
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="checkpoint folder or pulled checkpoint name (default: the shipped model)")
    add_device_option(p)
    add_recipe_option(p)
    add_threads_option(p)
    p.add_argument("--max-tokens", type=int, default=None, help="longest middle in tokens (32)")
    p.add_argument("--steps", type=int, default=None,
                   help="refinement steps (default: as many as fit the latency budget)")
    p.add_argument("--latency-budget-ms", type=float, default=None, metavar="MS",
                   help="time for the completion when --steps is not given "
                        "(default: 25 on a GPU, 200 on a CPU)")
    p.add_argument("--n", type=int, default=1, help="number of candidates to print")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="token budget for prefix + suffix (1024)")
    p.add_argument("--multiline", choices=("auto", "always-single", "always-multi"), default=None,
                   help="line policy (auto: several lines only at the end of a line)")
    p.add_argument("--max-file-mb", type=float, default=MAX_FILE_MB_DEFAULT,
                   help=f"refuse larger files ({MAX_FILE_MB_DEFAULT:g} MB)")
    p.add_argument("--no-drafts", dest="drafts", action="store_false", default=None,
                   help="the model alone: no drafts from the file to verify (option drafts)")
    p.add_argument("--language", default=None, metavar="ID",
                   help="LSP language id of the text (python, typescript, ...): decides the "
                        "comment syntax and the syntax guard (default: from FILE's extension; "
                        "python for standard input)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON object: suggestions, scores, token counts, timings, "
                        "budget (the exit status is the same as without --json)")
    return p


def read_source(path: str, max_mb: float) -> str:
    """File (or '-' = stdin) as text; InputError for missing, binary, non-UTF-8 or huge files."""
    if path == "-":
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        p = Path(path)
        if not p.exists():
            raise InputError(f"{path}: no such file")
        if not p.is_file():
            raise InputError(f"{path}: not a regular file")
        size = p.stat().st_size
        if size > max_mb * 1e6:
            raise InputError(f"{path}: {size / 1e6:.1f} MB is larger than --max-file-mb {max_mb:g}")
        data = p.read_bytes()
        name = path
    if len(data) > max_mb * 1e6:
        raise InputError(f"{name}: input larger than --max-file-mb {max_mb:g}")
    if b"\x00" in data[:65536]:
        raise InputError(f"{name}: looks like a binary file (NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: not UTF-8 text (byte {e.start})") from None


def position_offset(text: str, line: int, col: int) -> int:
    """1-based (line, col in code points) -> character offset into text.

    Lines end at ``\\n`` (a ``\\r`` before it belongs to the line ending); col may be
    one past the last character of the line."""
    if line < 1:
        raise InputError(f"--line {line}: lines are 1-based")
    if col < 1:
        raise InputError(f"--col {col}: columns are 1-based")
    starts = [0]
    pos = text.find("\n")
    while pos >= 0 and len(starts) < line:
        starts.append(pos + 1)
        pos = text.find("\n", pos + 1)
    n_lines = text.count("\n") + 1
    if line > len(starts):
        raise InputError(f"--line {line}: the file has {n_lines} line(s)")
    start = starts[line - 1]
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    if end > start and text[end - 1] == "\r" and end < len(text):
        end -= 1
    length = end - start
    if col > length + 1:
        raise InputError(f"--col {col}: line {line} has {length} character(s) (max col {length + 1})")
    return start + col - 1


def run(args: argparse.Namespace) -> int:
    try:
        text = read_source(args.file, args.max_file_mb)
        offset = position_offset(text, args.line, args.col)
    except InputError as e:
        print(f"diffill complete: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.n < 1:
        print("diffill complete: --n must be >= 1", file=sys.stderr)
        return EXIT_USAGE

    err = check_threads(args)
    if err:
        print(f"diffill complete: {err}", file=sys.stderr)
        return EXIT_USAGE
    if _diffill_is_the_program():
        # Exit sooner: the interpreter's last collections walk every object torch created
        # at import (~0.35 s of a 1.5 s run here); atexit runs before them, and frozen
        # objects are skipped (stdout and stderr are still flushed). Not in a host process
        # (tests, scripts calling main([...])): its leak checks would see the frozen objects.
        atexit.unregister(gc.freeze)
        atexit.register(gc.freeze)
    opts: dict[str, object] = {"model_path": args.model, "device": args.device}
    for name in ("max_tokens", "steps", "context_tokens", "multiline", "recipe", "latency_budget_ms",
                 "drafts"):
        v = getattr(args, name)
        if v is not None:
            opts[name] = v
    py_to_wire = {v: k for k, v in WIRE_NAMES.items()}
    bad = flag_errors({py_to_wire[k]: v for k, v in opts.items() if v is not None})
    if bad:
        print("diffill complete: " + "; ".join(bad), file=sys.stderr)
        return EXIT_USAGE
    try:
        options = options_from_kwargs(**opts)
    except ValueError as e:
        print(f"diffill complete: {e}", file=sys.stderr)
        return EXIT_USAGE
    t_import = time.perf_counter()
    configure_threads(args, args.device)  # imports torch
    from ...model import engine  # noqa: F401  (the model code: counted in import_s, not load_s)

    import_s = time.perf_counter() - t_import
    t0 = time.perf_counter()
    try:
        backend = load_local_backend(options.model_path, options.device, max_steps=options.max_steps,
                                     options=options)
    except Exception as e:  # report any load failure in one line
        print(f"diffill complete: cannot load model: {e}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    load_s = time.perf_counter() - t0
    completer = Completer(backend, options)
    path = None if args.file == "-" else args.file
    language = args.language or ("python" if path is None else None)
    ask = CompletionAsk(n=args.n)
    try:
        warmup_ms = None if options.steps is not None else _warm_up_on(completer, text, offset, args.n, path)
        t1 = time.perf_counter()
        res = completer.run(text, offset, ask, path=path, language=language)
        complete_ms = (time.perf_counter() - t1) * 1000.0
    except BackendError as e:
        print(f"diffill complete: {e}", file=sys.stderr)
        return EXIT_COMPLETION_FAILED
    except Exception as e:  # noqa: BLE001 - a crash must not exit 1 (= no suggestion)
        print(f"diffill complete: completion failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_COMPLETION_FAILED
    # the budget and who chose the steps, as the request's step decision says
    budget_ms = res.budget_ms if res.budget_ms is not None else backend.budget_ms()
    calls = res.model_calls
    steps = max((c.steps for c in res.candidates), default=0)
    note = None
    if res.planned and complete_ms > budget_ms:
        note = budget_note(complete_ms, budget_ms, calls=calls, warmup_ms=warmup_ms,
                           max_steps=options.max_steps)
    status = EXIT_OK if res.suggestions else EXIT_NO_SUGGESTION

    if args.json:
        out = {
            "file": args.file,
            "line": args.line,
            "col": args.col,
            "offset": offset,
            "suggestions": [
                {"text": s.text, "score": s.score, "replace_right": s.replace_right, "raw": s.raw,
                 "source": s.source, "verified": s.verified}
                for s in res.suggestions
            ],
            "prefix_tokens": res.context.prefix_tokens,
            "suffix_tokens": res.context.suffix_tokens,
            "model": backend.describe(),
            "import_s": round(import_s, 3),
            "load_s": round(load_s, 3),
            "warmup_ms": None if warmup_ms is None else round(warmup_ms, 1),
            "complete_ms": round(complete_ms, 1),
            "latency_budget_ms": budget_ms,
            "steps": steps,  # the most refinement steps a candidate needed
            "drafts": [{"source": d.source, "text": d.text} for d in res.drafts],
            "model_calls": calls,
            "over_budget": complete_ms > budget_ms,
            "budget_note": note,
            "exit_status": status,
        }
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out)).decode() + "\n")
    else:
        for i, s in enumerate(res.suggestions):
            if len(res.suggestions) > 1:
                print(f"--- {i + 1} (score {s.score:.3f}) ---")
            print(s.text)
    if note:
        print(f"diffill complete: {note}", file=sys.stderr)
    if not res.suggestions:
        print("diffill complete: no suggestion", file=sys.stderr)
    return status


def _diffill_is_the_program() -> bool:
    """Whether this process runs the diffill command line as its program (the ``diffill``
    console script, or ``python -m`` of the CLI module) rather than as a library."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and str(spec.name).startswith("diffill."):
        return True
    return str(getattr(getattr(main, "main", None), "__module__", "")).startswith("diffill.")


def _warm_up_on(completer: Completer, text: str, offset: int, n: int, path: str | None) -> float | None:
    """One refinement step of the local model on this request's own context and hole (the
    answer is discarded): first-call costs are paid, and the engine's step plan is made from
    what one step of this shape costs here, so the completion that follows picks the steps
    that fit the budget. Milliseconds taken; None for a backend that is not the local model."""
    backend = completer.backend
    if not isinstance(backend, LocalBackend):
        return None
    ctx = completer.build(text, offset, path=path)
    return backend.warmup_on(ctx, n=n, max_tokens=completer.options.max_tokens)


def budget_note(complete_ms: float, budget_ms: float, *, calls: int, warmup_ms: float | None,
                max_steps: int) -> str:
    """Why a budgeted completion took longer than its budget, in one line."""
    why = []
    if calls > 1:
        why.append(f"{calls} model calls (token healing found no candidate that continues the "
                   "typed word, so the hole at the cursor was filled again)")
    if warmup_ms is not None and warmup_ms >= budget_ms:
        why.append(f"one step of this request already takes longer (the warm-up step: "
                   f"{warmup_ms:.0f} ms), and at least one step runs")
    elif warmup_ms is not None:
        why.append(f"the warm-up step took {warmup_ms:.0f} ms, so about "
                   f"{max(1, int(budget_ms // max(warmup_ms, 1e-9)))} step(s) fit; the steps after "
                   "it ran slower (a busy machine?)")
    return (f"the completion took {complete_ms:.0f} ms, over the {budget_ms:g} ms latency budget: "
            + "; ".join(why or ["the backend's estimate of a step was too low"])
            + f" (--steps N fixes the step count; at most {max_steps} are chosen)")
