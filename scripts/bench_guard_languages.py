"""The syntax guard per language on real files: true middles kept, corrupted middles dropped,
agreement with a real parser, and the guard's cost per candidate.

For each language, up to ``--files`` source files found under the roots below (those the
tree-sitter grammar parses with no error and, where a real parser runs here, that it accepts;
ASCII only, 400 B .. 120 KB) get ``--cases`` holes each: a line (the cursor after its
indentation, the middle the rest of the line), a few lines (2-5, from the cursor to the end of
the last), or a span (1-30 characters inside one line). The guard, built on the buffer with
the hole (as the Completer builds it), judges

* (a) the true middle: it should keep it;
* (b) the middle made syntactically wrong by one of: a bracket token dropped, a bracket added
  at the middle's end (not inside a string or comment), a closing token (``}``, ``)``, ``]``,
  ``end``, ``fi``, ``done``) doubled, for Python a continuation line dedented. Where a real
  parser runs, only the corruptions it rejects count; elsewhere, every one.

``judged`` is the share of holes whose code around the cursor has no error (the guard has a
baseline; elsewhere it keeps everything, as for Python). ``agree`` compares, on every
buffer of (a) and (b), the tree-sitter whole-buffer verdict with the real parser's
(Python: tree-sitter-python against ``ast``). Cost: :meth:`SyntaxGuard.keeps` per candidate
on the largest file of the language near 10 KB and near 200 KB (the hole at random lines,
three candidates a request: the rest of the true line and two corruptions, after the user
typed its first 1-3 characters, one request a keystroke, ``--positions`` cursor positions),
and the set-up of each request (:meth:`SyntaxGuard.prepare`: for tree-sitter the incremental
re-parse of the buffer and the search for the segments around the cursor; for Python the cut
around the cursor, the parse of the rest of the buffer where it is new, or whether the user is
typing there; once a request whatever the number of candidates).

    python scripts/bench_guard_languages.py [--langs go,rust] [--files 200] [--cases 2]

Python is judged by the ``ast`` guard (the product's path); its tree-sitter grammar serves only
the agreement column here.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diffill.lsp_server.text import treesitter
from diffill.lsp_server.text.syntax import SyntaxGuard

HOME = Path.home()
ROOT = Path(__file__).resolve().parents[1]
NPM = [HOME / ".cache/diffill-ci", ROOT / "editors/vscode/node_modules", HOME / ".cache/diffill-bench/npm"]
PYLIB = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
CORPORA: dict[str, tuple[tuple[str, ...], list[Path]]] = {
    "python": ((".py",), [PYLIB, ROOT / ".venv/lib"]),
    "javascript": ((".js",), NPM),
    "typescript": ((".ts",), NPM),
    "tsx": ((".tsx",), NPM),
    "go": ((".go",), [Path("/usr/share/go-1.19"), Path("/usr/lib/go-1.19"), Path("/usr/share/gocode")]),
    "rust": ((".rs",), [Path("/usr/share/cargo/registry"), HOME / ".cargo/registry/src"]),
    "java": ((".java",), [HOME / ".cache/diffill-bench/java", Path("/usr/share/java")]),
    "c": ((".c",), [Path("/usr/share/go-1.19"), ROOT / ".venv/lib", HOME / ".cache/diffill-ci", Path("/usr/share/doc")]),
    "cpp": ((".cc", ".cpp"), [HOME / ".cache/diffill-ci", HOME / ".cache/diffill-bench/npm", ROOT / ".venv/lib"]),
    "csharp": ((".cs",), [HOME / ".cache/diffill-bench/npm", Path("/usr/lib/node_modules")]),
    "ruby": ((".rb",), [Path("/usr/lib/ruby"), Path("/usr/share/rubygems-integration")]),
    "php": ((".php",), [Path("/usr/lib/google-cloud-sdk"), Path("/usr/share/php")]),
    "lua": ((".lua",), [ROOT / ".venv/lib"]),
    "bash": ((".sh",), [Path("/usr/lib"), HOME / ".cache/diffill-ci", Path("/usr/share")]),
}
TSC = ROOT / "editors/vscode/node_modules/typescript"
BRACKETS = {"(", ")", "[", "]", "{", "}"}
CLOSING = {")", "]", "}", "end", "fi", "done", "esac"}


# -- real parsers ------------------------------------------------------------------------------


class RealParser:
    """``ok(text)``: whether the language's own parser accepts the text (None: none here)."""

    def __init__(self, lang: str) -> None:
        self.lang = lang
        self.node = None
        self.name = {"python": "ast", "javascript": "tsc", "typescript": "tsc", "tsx": "tsc",
                     "go": "gofmt -e", "php": "php -l", "ruby": "ruby -c", "lua": "luac -p",
                     "bash": "bash -n"}.get(lang)
        if self.name == "tsc" and not TSC.exists():
            self.name = None
        if self.name and self.name.split()[0] not in ("ast", "tsc") and not _which(self.name.split()[0]):
            self.name = None

    def ok(self, text: str) -> bool | None:
        if self.name is None:
            return None
        if self.name == "ast":
            try:
                ast.parse(text)
                return True
            except (SyntaxError, ValueError, RecursionError):
                return False
        if self.name == "tsc":
            return self._tsc(text)
        cmd = {"gofmt -e": ["gofmt", "-e"], "ruby -c": ["ruby", "-c"], "lua": None,
               "luac -p": [_which("luac5.4") or "luac", "-p", "-"], "bash -n": ["bash", "-n"]}.get(self.name)
        if self.name == "php -l":
            with tempfile.NamedTemporaryFile("w", suffix=".php", delete=False) as f:
                f.write(text)
            try:
                return subprocess.run(["php", "-l", f.name], capture_output=True).returncode == 0
            finally:
                os.unlink(f.name)
        return subprocess.run(cmd, input=text.encode(), capture_output=True).returncode == 0

    def _tsc(self, text: str) -> bool:
        if self.node is None:
            kind = {"javascript": "JS", "typescript": "TS", "tsx": "TSX"}[self.lang]
            js = (f"const ts=require({json.dumps(str(TSC))});const rl=require('readline').createInterface"
                  f"({{input:process.stdin}});rl.on('line',l=>{{const t=JSON.parse(l);const sf=ts.createSourceFile"
                  f"('x',t,ts.ScriptTarget.Latest,false,ts.ScriptKind.{kind});"
                  f"process.stdout.write((sf.parseDiagnostics.length?'0':'1')+'\\n');}});")
            self.node = subprocess.Popen(["node", "-e", js], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.node.stdin.write(json.dumps(text) + "\n")
        self.node.stdin.flush()
        return self.node.stdout.readline().strip() == "1"


def _which(name: str) -> str | None:
    for d in os.environ.get("PATH", "").split(":"):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


# -- files and holes ---------------------------------------------------------------------------


def ts_clean(lang: str, text: str) -> bool:
    return not treesitter.parse(lang, text.encode()).root_node.has_error


def corpus(lang: str, n: int, rng: random.Random, real: RealParser) -> list[str]:
    exts, roots = CORPORA[lang]
    paths = sorted({p for r in roots if r.exists() for e in exts for p in r.rglob("*" + e)
                    if p.is_file() and not p.name.endswith(".d.ts") and 400 <= p.stat().st_size <= 120_000})
    rng.shuffle(paths)
    out, seen = [], set()
    for p in paths if n > 0 else ():
        try:
            text = p.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if not text.isascii() or text in seen or "\r" in text:
            continue
        seen.add(text)
        if ts_clean(lang, text) and real.ok(text) is not False:
            out.append(text)
        if len(out) >= n:
            break
    return out[:n]


def holes(text: str, rng: random.Random, k: int) -> list[tuple[str, int, str]]:
    """(kind, cursor, middle) holes in ``text``."""
    lines = text.split("\n")
    starts = [0]
    for ln in lines[:-1]:
        starts.append(starts[-1] + len(ln) + 1)
    code = [i for i, ln in enumerate(lines) if len(ln.strip()) >= 2]
    out = []
    for _ in range(k * 4):
        if len(out) >= k or not code:
            break
        i = rng.choice(code)
        ln = lines[i]
        ind = len(ln) - len(ln.lstrip())
        kind = rng.choice(("line", "lines", "span"))
        if kind == "line":
            c, mid = starts[i] + ind, ln[ind:]
        elif kind == "lines":
            j = min(len(lines) - 1, i + rng.randint(1, 4))
            c = starts[i] + ind
            mid = text[c:starts[j] + len(lines[j])]
        else:
            a = rng.randint(ind, len(ln) - 1)
            b = min(len(ln), a + rng.randint(1, 30))
            c, mid = starts[i] + a, ln[a:b]
        if mid.strip():
            out.append((kind, c, mid))
    return out


def leaves(lang: str, text: str, lo: int, hi: int) -> list[tuple[int, int, str, bool]]:
    """(start, end, type, in string/comment) of the tree's tokens inside ``[lo, hi)`` (ASCII text:
    bytes are characters)."""
    tree = treesitter.parse(lang, text.encode())
    out, stack = [], [tree.root_node]
    while stack:
        n = stack.pop()
        if n.end_byte <= lo or n.start_byte >= hi:
            continue
        if n.child_count == 0:
            if lo <= n.start_byte and n.end_byte <= hi:
                out.append((n.start_byte, n.end_byte, n.type, False))
            continue
        if "string" in n.type or "comment" in n.type or "heredoc" in n.type:
            continue  # brackets inside are text
        stack.extend(n.children)
    return sorted(out)


def inside_text(lang: str, text: str, at: int) -> bool:
    node = treesitter.parse(lang, text.encode()).root_node.descendant_for_byte_range(at, at)
    while node is not None:
        if any(w in node.type for w in ("string", "comment", "heredoc", "template")):
            return True
        node = node.parent
    return False


def corruptions(lang: str, text: str, c: int, mid: str, rng: random.Random) -> list[str]:
    """Wrong middles for the hole at ``c`` (``text`` is the whole true file)."""
    toks = leaves(lang, text, c, c + len(mid))
    br = [(a - c, b - c, t) for a, b, t, _ in toks if t in BRACKETS]
    closing = [(a - c, b - c, t) for a, b, t, _ in toks if t in CLOSING]
    out = []
    if br:
        a, b, _ = rng.choice(br)
        out.append(mid[:a] + mid[b:])
    if not inside_text(lang, text, c + len(mid) - 1):
        out.append(mid + rng.choice("([{)]}"))
    if closing:
        a, b, t = rng.choice(closing)
        sep = "" if t in ")]}" else "\n"
        out.append(mid[:b] + sep + mid[a:b] + mid[b:])
    if lang == "python" and "\n" in mid:
        ls = mid.split("\n")
        deeper = [i for i in range(1, len(ls)) if ls[i].startswith("    ") and ls[i].strip()]
        if deeper:
            i = rng.choice(deeper)
            ls[i] = ls[i][4:]
            out.append("\n".join(ls))
    return [m for m in out if m != mid]


# -- the run -----------------------------------------------------------------------------------


def guard_for(lang: str, holed: str, c: int) -> SyntaxGuard:
    return SyntaxGuard(holed, c, language=lang, path=f"bench.{lang}")


def rates(lang: str, n_files: int, k: int, rng: random.Random) -> dict:
    real = RealParser(lang)
    files = corpus(lang, n_files, rng, real)
    kept = total = dropped = counted = judged = agree = compared = counted_j = dropped_j = 0
    for text in files:
        for _kind, c, mid in holes(text, rng, k):
            holed = text[:c] + text[c + len(mid):]
            g = guard_for(lang, holed, c)
            tg = g.tree_guard
            here = bool(tg.segments(0)) if tg is not None else bool(g.active or g.segment() is not None)
            judged += here
            total += 1
            kept += g.keeps(mid)
            bads = corruptions(lang, text, c, mid, rng)
            for bad in bads[:1] if len(bads) < 2 else rng.sample(bads, 1):
                whole = holed[:c] + bad + holed[c:]
                ok = real.ok(whole)
                if ok is True:
                    continue  # the corruption is valid code after all: not counted
                counted += 1
                d = not g.keeps(bad)
                dropped += d
                if here:
                    counted_j += 1
                    dropped_j += d
                if ok is False:
                    compared += 1
                    agree += not ts_clean(lang, whole)
            if real.name is not None:  # the true middle restores the file: both accept it
                compared += 1
                agree += ts_clean(lang, text)
    return dict(files=len(files), holes=total, keep=kept / max(total, 1), judged=judged / max(total, 1),
                corrupt=counted, drop=dropped / max(counted, 1), drop_j=dropped_j / max(counted_j, 1), real=real.name or "-",
                agree=(agree / compared) if compared else None)


def cost(lang: str, rng: random.Random, target: int, positions: int = 40,
         repeats: int = 3) -> tuple[float, float, float, int] | None:
    """p50/p95 ms of keeps() per candidate (the fastest of ``repeats`` runs of each: the box is
    shared, and a judgement does the same work every time), p95 ms of a request's set-up
    (once: the set-up keeps what it found), file size."""
    exts, roots = CORPORA[lang]
    best = None
    for r in roots:
        if not r.exists():
            continue
        for e in exts:
            for p in r.rglob("*" + e):
                try:
                    sz = p.stat().st_size
                except OSError:
                    continue
                if sz < target * 0.5 or sz > target * 1.6 or p.name.endswith(".d.ts"):
                    continue
                if best is None or abs(sz - target) < abs(best[0] - target):
                    best = (sz, p)
    if best is None:
        return None
    text = best[1].read_text(errors="replace")
    per, reparse = [], []
    lines = [i for i, ch in enumerate(text) if ch == "\n"]
    path = f"/bench/cost.{lang}"
    for _ in range(positions):
        c = rng.choice(lines) + 1
        e = text.find("\n", c)
        e = len(text) if e < 0 else e
        c += len(text[c:e]) - len(text[c:e].lstrip())
        mid = text[c:e]
        if len(mid.strip()) < 4:
            continue
        holed = text[:c] + text[e:]
        SyntaxGuard(holed, c, language=lang, path=path).keeps(mid)  # the cursor moved there: a jump, not timed
        for k in range(1, 4):  # the user types the middle's first characters, one request each
            typed = holed[:c] + mid[:k] + holed[c:]
            rest = mid[k:]
            t0 = time.perf_counter()
            g = SyntaxGuard(typed, c + k, language=lang, path=path)
            g.prepare()  # the request's set-up (tree-sitter: the buffer's incremental re-parse
            # and the segments around the cursor; Python: the cut there, or whether it is typed)
            reparse.append((time.perf_counter() - t0) * 1e3)
            for cand in (rest, rest + "(", rest[:-1] if rest[-1] in ")]};" else rest + "}"):
                best_ms = float("inf")
                for _ in range(repeats):  # the same work each time (nothing per candidate is kept)
                    t0 = time.perf_counter()
                    g.keeps(cand)
                    best_ms = min(best_ms, (time.perf_counter() - t0) * 1e3)
                per.append(best_ms)
    if not per:
        return None
    per.sort()
    reparse.sort()
    return (statistics.median(per), per[int(len(per) * 0.95)], reparse[int(len(reparse) * 0.95)], best[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--langs", default=",".join(CORPORA))
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--cases", type=int, default=2, help="holes per file")
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--positions", type=int, default=40, help="cursor positions a file for the cost")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each judgement timed (the fastest counts)")
    args = ap.parse_args()
    print(f"grammars loaded: {', '.join(treesitter.supported())}")
    print(f"{'language':<11} {'files':>5} {'holes':>5} {'judged':>6} {'keep(a)':>7} {'corrupt':>7} "
          f"{'drop(b)':>7} {'judged':>6} {'real parser':>11} {'agree':>6} | {'10KB p50/p95':>13} {'200KB p50/p95':>14} {'set-up p95 200KB':>17}")
    for lang in args.langs.split(","):
        rng = random.Random(lang)
        r = rates(lang, args.files, args.cases, rng)
        costs = ["", "", ""]
        if not args.no_cost:
            for i, target in enumerate((10_000, 200_000)):
                got = cost(lang, rng, target, args.positions, args.repeats)
                if got:
                    costs[i] = f"{got[0]:.2f}/{got[1]:.2f}"
                    if i == 1:
                        costs[2] = f"{got[2]:.2f} ({got[3] // 1000} KB)"
        agree = "-" if r["agree"] is None else f"{r['agree']:.3f}"
        print(f"{lang:<11} {r['files']:>5} {r['holes']:>5} {r['judged']:>6.2f} {r['keep']:>7.3f} "
              f"{r['corrupt']:>7} {r['drop']:>7.3f} {r['drop_j']:>6.3f} {r['real']:>11} {agree:>6} | {costs[0]:>13} "
              f"{costs[1]:>14} {costs[2]:>17}", flush=True)


if __name__ == "__main__":
    main()
