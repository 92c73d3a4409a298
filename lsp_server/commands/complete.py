"""``diffill complete FILE --line L --col C``: fill the hole at a position, print it.

Lines and columns are 1-based, like editors show them; the column counts
characters (Unicode code points) and may be one past the last character (the
end of the line). The suggestion is what would be inserted at the cursor.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec

from ..backends import BackendError, load_local_backend
from ..completer import Completer, options_from_kwargs
from . import add_threads_option, check_threads, configure_threads

MAX_FILE_MB_DEFAULT = 16.0


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
    )
    p.add_argument("file", help="source file (UTF-8 text), or - for standard input")
    p.add_argument("--line", type=int, required=True, help="1-based line of the cursor")
    p.add_argument("--col", type=int, required=True,
                   help="1-based column of the cursor: the cursor sits before this character")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="checkpoint folder (default: the shipped default model)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, auto")
    add_threads_option(p)
    p.add_argument("--max-tokens", type=int, default=None, help="longest middle in tokens (32)")
    p.add_argument("--steps", type=int, default=None,
                   help="refinement steps (default: the engine's default)")
    p.add_argument("--n", type=int, default=1, help="number of candidates to print")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="token budget for prefix + suffix (1024)")
    p.add_argument("--multiline", choices=("auto", "always-single", "always-multi"), default=None,
                   help="line policy (auto: several lines only at the end of a line)")
    p.add_argument("--max-file-mb", type=float, default=MAX_FILE_MB_DEFAULT,
                   help=f"refuse larger files ({MAX_FILE_MB_DEFAULT:g} MB)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON object: suggestions, scores, token counts, timings")
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
        return 2
    if args.n < 1:
        print("diffill complete: --n must be >= 1", file=sys.stderr)
        return 2

    err = check_threads(args)
    if err:
        print(f"diffill complete: {err}", file=sys.stderr)
        return 2
    configure_threads(args, args.device)
    opts: dict[str, object] = {"model_path": args.model, "device": args.device}
    for name in ("max_tokens", "steps", "context_tokens", "multiline"):
        v = getattr(args, name)
        if v is not None:
            opts[name] = v
    try:
        options = options_from_kwargs(**opts)
    except ValueError as e:
        print(f"diffill complete: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        backend = load_local_backend(options.model_path, options.device, max_steps=options.max_steps,
                                     options=options)
    except Exception as e:  # report any load failure in one line
        print(f"diffill complete: cannot load model: {e}", file=sys.stderr)
        return 1
    load_s = time.perf_counter() - t0
    completer = Completer(backend, options)
    t1 = time.perf_counter()
    try:
        res = completer.run(text, offset, n=args.n, path=None if args.file == "-" else args.file)
    except BackendError as e:
        print(f"diffill complete: {e}", file=sys.stderr)
        return 1
    complete_ms = (time.perf_counter() - t1) * 1000.0

    if args.json:
        out = {
            "file": args.file,
            "line": args.line,
            "col": args.col,
            "offset": offset,
            "suggestions": [
                {"text": s.text, "score": s.score, "replace_right": s.replace_right, "raw": s.raw}
                for s in res.suggestions
            ],
            "prefix_tokens": res.context.prefix_tokens,
            "suffix_tokens": res.context.suffix_tokens,
            "model": backend.describe(),
            "load_s": round(load_s, 3),
            "complete_ms": round(complete_ms, 1),
        }
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out)).decode() + "\n")
        return 0
    if not res.suggestions:
        print("diffill complete: no suggestion", file=sys.stderr)
        return 0
    for i, s in enumerate(res.suggestions):
        if len(res.suggestions) > 1:
            print(f"--- {i + 1} (score {s.score:.3f}) ---")
        print(s.text)
    return 0
