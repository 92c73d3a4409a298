"""``diffill bench --vs-llamacpp``: diffill and llama.cpp side by side on one file.

The same request through both, on the same weights (the checkpoint converted to GGUF
Q8_0 by :func:`convert_to_gguf`; llama.cpp treats a Qwen2-shaped checkpoint as the causal
Qwen2 model it is shaped like -- latency depends on shapes, not on weight values):

* the file: the first 72 lines of the standard library's ``shlex.py`` with the statement
  ``self.pushback = deque()`` emptied -- the hole (the cursor after the line's indentation,
  as after pressing Enter); prefix = everything before it, suffix = the newline and the
  lines after (:func:`shlex_case`, about 640 tokens). The middle is that one line.
* llama.cpp gets Qwen2.5-Coder's FIM prompt (:func:`fim_prompt`) and generates 16 tokens
  greedily (however many of them a trained model would use); diffill fills a 16-slot hole
  through :class:`~diffill.model.engine.Engine` in ``--steps`` steps, with the CPU defaults
  of :func:`~diffill.model.load_model` (int8 weights, one context per request; the dual
  cache off unless ``refresh`` > 1: then steps between refreshes run only the hole).

Scenarios, interleaved (llama.cpp, diffill, llama.cpp, diffill, ...), each side in its own
process (so each has its own threads and its peak RSS is its own):

(a) ``cold``: llama.cpp's prompt cache cleared, the whole prompt evaluated; diffill's
    request from scratch.
(b) ``keystroke``: after the cold request the user types the middle's first 5 characters,
    one at a time, and each keystroke asks for a completion. llama.cpp keeps the KV of the
    longest common token prefix with its previous call (``Llama.generate``; the tokens it
    evaluated are read back from its own perf counters); diffill passes the document to
    ``Engine.infill(EngineAsk(..., context_key=...))``, whose context the engine keeps across keystrokes
    (on a CPU, unless ``DIFFILL_REUSE=off``; reported).
(d), (e) ``serve``: the cold request and the keystrokes again through a fresh
    ``diffill serve`` per repeat (LSP over stdio, ``didChange`` per typed character; its
    default options), against llama.cpp's (a) and (b) of the same run; keystrokes the
    server's typed-ahead cache answers are reported apart.
(c) ``draft``: diffill answered by a verified draft (the true middle's tokens as
    ``drafts``; the weights are random, so ``draft_ratio`` = 0 makes the draft verify as a
    trained model's would for a right draft: one forward). llama.cpp's cost for the same
    middle is its cold request's (prompt eval + 16 tokens): not measured twice.

``llama_cpp`` (the ``llamacpp`` extra) is imported only here, in the llama.cpp worker.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import multiprocessing as mp
import os
import resource
import shlex
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .keystroke import FILE_LINES, Case, bench_keystrokes, shlex_case

EXTRA = 'pip install -e ".[llamacpp]"'  # from the checkout (diffill is not on PyPI)
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")  # Qwen2.5-Coder's FIM tokens
CACHE_DIR = Path("~/.cache/diffill-bench")
GGUF_FORMAT = 1  # bump when the conversion changes: the cache key includes it
#: diffill Engine keywords that would name a document whose context is kept between requests
REUSE_KEYWORDS = ("context_key",)


class MissingExtra(RuntimeError):
    """A package of the ``llamacpp`` extra is not installed."""


def require(module: str) -> Any:
    """Import ``module`` or raise :class:`MissingExtra` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(f"--vs-llamacpp needs the Python package {module!r} ({e}); "
                           f"install the extra: {EXTRA}") from None


# -- the request -------------------------------------------------------------------------------


def fim_prompt(case: Case) -> str:
    """Qwen2.5-Coder's fill-in-the-middle prompt (prefix-suffix-middle order)."""
    pre, suf, mid = FIM
    return f"{pre}{case.prefix}{suf}{case.suffix}{mid}"


# -- the checkpoint as GGUF Q8_0 -------------------------------------------------------------------

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
              "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's tensor name for a Hugging Face Qwen2 tensor name."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model, layers, i, rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_NAMES:
        return f"blk.{int(parts[2])}.{_LAYER_NAMES[parts[3]]}"
    raise ValueError(f"unexpected tensor {hf_name!r} for a Qwen2 checkpoint")


def _inputs(folder: Path) -> list[Path]:
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{folder}: no *.safetensors")
    return [folder / "config.json", folder / "tokenizer.json", *weights]


def gguf_cache_path(folder: str | Path, cache_dir: str | Path = CACHE_DIR) -> Path:
    """Where the Q8_0 GGUF of ``folder`` is cached: keyed by the folder's resolved path and
    the size and mtime of its config, tokenizer and weights (and :data:`GGUF_FORMAT`)."""
    folder = Path(folder).expanduser().resolve()
    h = hashlib.sha256(f"{GGUF_FORMAT}:{folder}".encode())
    for p in _inputs(folder):
        st = p.stat()
        h.update(f"|{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return Path(cache_dir).expanduser() / f"{folder.name}-{h.hexdigest()[:16]}.q8_0.gguf"


def gguf_vocab(tokenizer_json: dict[str, Any], vocab_size: int
               ) -> tuple[list[str], list[int], list[str]]:
    """Tokens (by id, padded to ``vocab_size`` with ``[PADi]``), their GGUF token types
    (1 normal, 3 control = special added token, 4 user-defined = other added token,
    5 unused = padding) and the BPE merges as ``"a b"`` strings."""
    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"expected a byte-level BPE tokenizer, got {model.get('type')!r}")
    by_id = {int(i): t for t, i in model["vocab"].items()}
    kinds = {}
    for a in tokenizer_json.get("added_tokens", []):
        by_id[int(a["id"])] = a["content"]
        kinds[int(a["id"])] = 3 if a.get("special") else 4
    if max(by_id) >= vocab_size:
        raise ValueError(f"token id {max(by_id)} >= vocab_size {vocab_size}")
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [kinds.get(i, 1 if i in by_id else 5) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def convert_to_gguf(folder: str | Path, out: str | Path | None = None, *,
                    log: Callable[[str], None] = print) -> Path:
    """The checkpoint in ``folder`` (Qwen2 layout: config.json, tokenizer.json, safetensors)
    as a GGUF file with Q8_0 matrices (norms and biases f32), written with the ``gguf``
    package, offline. ``out`` None: the cache (:func:`gguf_cache_path`), reused when there."""
    gguf = require("gguf")
    import numpy as np  # numpy, torch, safetensors: only when converting
    import torch  # bf16 tensors -> float32 (numpy has no bf16)
    from safetensors import safe_open  # reads the checkpoint's weights

    folder = Path(folder).expanduser().resolve()
    dest = Path(out) if out is not None else gguf_cache_path(folder)
    if out is None and dest.is_file():
        return dest
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("model_type") != "qwen2":
        raise ValueError(f"{folder}: GGUF conversion knows Qwen2 checkpoints only "
                         f"(model_type {cfg.get('model_type')!r})")
    log(f"converting {folder} to GGUF Q8_0: {dest}")
    t0 = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    w = gguf.GGUFWriter(str(tmp), "qwen2")
    w.add_name(folder.name)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_head_count_kv(int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])))
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens, types, merges = gguf_vocab(
        json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")), int(cfg["vocab_size"]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if cfg.get(key) is not None:
            add(int(cfg[key]))
    w.add_pad_token_id(int(cfg.get("pad_token_id") or cfg.get("eos_token_id") or 0))
    w.add_add_bos_token(False)
    for path in _inputs(folder)[2:]:
        with safe_open(str(path), "pt") as f:
            for name in sorted(f.keys()):
                if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                    continue
                x = f.get_tensor(name).to(torch.float32).numpy()
                if x.ndim == 2:
                    w.add_tensor(gguf_name(name), gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                else:
                    w.add_tensor(gguf_name(name), np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(dest)
    log(f"GGUF written in {time.perf_counter() - t0:.0f} s ({dest.stat().st_size / 1e6:.0f} MB)")
    return dest


# -- the two sides, each in a worker process ------------------------------------------------------


def _refresh_words(period: int) -> str:
    """How the diffill side's context was refreshed, in words."""
    if period >= 1 << 20:
        return "context computed at the first step only"
    return "context recomputed every step" if period <= 1 else f"context refreshed every {period} steps"


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


class LlamaSide:
    """llama.cpp through llama-cpp-python: FIM prompt, greedy, ``n_gen`` tokens."""

    name = "llama.cpp"

    def __init__(self, gguf_file: str, threads: int, n_gen: int, n_ctx: int = 2048) -> None:
        self.lc = require("llama_cpp")
        self.n_gen = n_gen
        self.llm = self.lc.Llama(model_path=gguf_file, n_ctx=n_ctx, n_batch=n_ctx,
                                 n_threads=threads, n_threads_batch=threads, verbose=False)

    def info(self) -> dict[str, Any]:
        return {"version": self.lc.__version__, "peak_rss_mb": _peak_rss_mb()}

    def tokens(self, case: Case) -> int:
        return len(self.llm.tokenize(fim_prompt(case).encode(), add_bos=False, special=True))

    def complete(self, case: Case, cold: bool) -> dict[str, Any]:
        toks = self.llm.tokenize(fim_prompt(case).encode(), add_bos=False, special=True)
        if cold:
            self.llm.reset()  # n_tokens = 0: no prefix match, eval drops the whole KV
        self.lc.llama_perf_context_reset(self.llm.ctx)
        out: list[int] = []
        t0 = time.perf_counter()
        for t in self.llm.generate(toks, temp=0.0, top_k=1, reset=True):
            out.append(t)
            if len(out) == self.n_gen:
                break
        ms = (time.perf_counter() - t0) * 1e3
        perf = self.lc.llama_perf_context(self.llm.ctx)
        return {"ms": ms, "prompt_tokens": len(toks), "evaluated": int(perf.n_p_eval),
                "generated": len(out)}


class DiffillSide:
    """diffill's engine on the checkpoint, CPU defaults, a ``hole``-slot hole."""

    name = "diffill"

    def __init__(self, model_dir: str, threads: int, steps: int, hole: int,
                 refresh: int = 1) -> None:
        from ..model import load_model  # the model (torch): in the diffill worker only
        from ..model.asks import EngineAsk  # (same)
        from ..model.decoder.spec import SamplerConfig  # (same)
        from ..model.engine import Engine  # (same)
        from ..model.engine_options import EngineOptions  # (same)
        from ..model.runtime import configure_cpu_threads  # (same)

        configure_cpu_threads(threads, "cpu")
        self.lm = load_model(model_dir)
        self.steps, self.hole = steps, hole
        sc = SamplerConfig(steps=steps, lengths=(hole,))
        opts = EngineOptions(batch=False, refresh_every=max(1, refresh))
        self.engine = Engine(self.lm, sc, options=opts)
        # random weights: draft_ratio 0 verifies the (right) draft, as a trained model would
        self.draft_engine = Engine(self.lm, dataclasses.replace(sc, draft_ratio=0.0), options=opts)
        self.ask = EngineAsk
        self.reuse = reuse_keyword(EngineAsk)

    def info(self) -> dict[str, Any]:
        import torch  # the diffill worker's, already loaded

        # the engine's period (with one context per request: computed at the first step only)
        return {"weights": self.lm.weights, "refresh_every": self.engine.refresh_every,
                "dtype": str(self.lm.dtype).removeprefix("torch."),
                "context": "request" if self.engine.shared_context else "row",
                "reuse": self.reuse, "reuse_on": self.engine.reuse_context,
                "torch_threads": torch.get_num_threads(), "peak_rss_mb": _peak_rss_mb(),
                "engine_stats": {k: v for k, v in self.engine.stats().items()
                                 if "latenc" not in k}}

    def tokens(self, case: Case) -> int:
        tok = self.lm.tokenizer
        return len(tok.encode(case.prefix)) + len(tok.encode(case.suffix))

    def complete(self, case: Case, cold: bool, doc: str | None = None,
                 draft: bool = False) -> dict[str, Any]:
        tok = self.lm.tokenizer
        pre, suf = tok.encode(case.prefix), tok.encode(case.suffix)
        kw: dict[str, Any] = {}
        if draft:
            kw["drafts"] = (tuple(tok.encode(case.middle)),)
        if self.reuse and doc is not None:
            kw[self.reuse] = doc
        eng = self.draft_engine if draft else self.engine
        t0 = time.perf_counter()
        res = eng.infill(self.ask(pre, suf, lengths=(self.hole,), steps=self.steps, **kw))
        ms = (time.perf_counter() - t0) * 1e3
        best = res[0] if res else None
        return {"ms": ms, "prompt_tokens": len(pre) + len(suf),
                "steps": getattr(best, "steps", None),
                "verified": bool(getattr(best, "verified", False))}


def reuse_keyword(fn: Callable[..., Any]) -> str | None:
    """The keyword of ``fn`` (``EngineAsk``) that names a document whose context is
    kept between requests, if it has one (:data:`REUSE_KEYWORDS`)."""
    params = inspect.signature(fn).parameters
    return next((k for k in REUSE_KEYWORDS if k in params), None)


def _serve(conn: Any, side: str, kwargs: dict[str, Any]) -> None:
    """A worker: builds its side, then answers ``(method, kwargs)`` until ``None``."""
    try:
        obj = (LlamaSide if side == "llama.cpp" else DiffillSide)(**kwargs)
        conn.send(("ok", obj.info()))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    try:
        while (msg := conn.recv()) is not None:
            method, kw = msg
            try:
                conn.send(("ok", getattr(obj, method)(**kw)))
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
        conn.send(("ok", obj.info()))
    except (EOFError, OSError):  # the parent went away
        pass


class Worker:
    def __init__(self, side: str, **kwargs: Any) -> None:
        ctx = mp.get_context("spawn")
        self.side = side
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, side, kwargs), daemon=True)
        self.proc.start()
        self.info = self._answer()

    def _answer(self) -> Any:
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.side}: {value}")
        return value

    def __call__(self, method: str, **kw: Any) -> Any:
        self.conn.send((method, kw))
        return self._answer()

    def close(self) -> dict[str, Any]:
        """Stop the worker; its final :meth:`info` ({} if it is gone)."""
        try:
            self.conn.send(None)
            info = self._answer()
        except (EOFError, OSError, RuntimeError):
            info = {}
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.terminate()
        return info


# -- the run ---------------------------------------------------------------------------------------


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs), 1), "min_ms": round(min(xs), 1), "n": len(xs)}


def run_side_by_side(model_dir: str, *, gguf_file: str | Path | None = None, threads: int = 2,
                     steps: int = 4, hole: int = 16, refresh: int = 1, repeats: int = 3,
                     keystrokes: int = 5, serve: bool = True,
                     warmup: int = 1, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The benchmark (module doc); returns a JSON-able dict, :func:`format_table` renders it.
    ``serve``: each timed repeat also runs the same cold request and keystrokes through a
    fresh ``diffill serve`` (:func:`diffill.evaluation.keystroke.bench_keystrokes`, its
    default options, ``threads`` threads), compared with llama.cpp's of the same run; a
    keystroke the server's typed-ahead cache answers is counted apart."""
    require("llama_cpp")  # before minutes of conversion
    import torch  # the machine string; the parent has torch loaded (bench command)

    from .bench import machine_string  # torch at import: kept out of the workers' imports

    case = shlex_case()
    if len(case.middle) <= keystrokes:
        raise ValueError("the middle is shorter than the keystrokes typed into it")
    gguf_file = Path(gguf_file) if gguf_file else convert_to_gguf(model_dir, log=log)
    load_before = os.getloadavg()
    log(f"starting the workers ({threads} threads each)")
    ms: dict[tuple[str, str], list[float]] = {}
    detail: dict[tuple[str, str], list[dict[str, Any]]] = {}
    sides: list[Worker] = []
    try:
        sides.append(Worker("llama.cpp", gguf_file=str(gguf_file), threads=threads, n_gen=hole))
        sides.append(diff := Worker("diffill", model_dir=str(model_dir), threads=threads,
                                    steps=steps, hole=hole, refresh=refresh))
        for r in range(warmup + repeats):
            timed = r >= warmup
            doc = f"bench-{r}"

            def call(w: Worker, scenario: str, c: Case, cold: bool, timed: bool = timed,
                     doc: str = doc, **kw: Any) -> None:
                if w is diff and scenario != "draft":  # a new document each repeat: cold
                    kw["doc"] = doc
                res = w("complete", case=c, cold=cold, **kw)
                if timed:
                    ms.setdefault((scenario, w.side), []).append(res["ms"])
                    detail.setdefault((scenario, w.side), []).append(res)

            for w in sides:
                call(w, "cold", case, True)
            for k in range(1, keystrokes + 1):
                for w in sides:
                    call(w, "keystroke", case.typed(k), False)
            call(diff, "draft", case, True, draft=True)
            if serve and timed:
                got = bench_keystrokes(str(model_dir), case.prefix + case.suffix, *case.cursor,
                                       case.middle[:keystrokes], threads=threads,
                                       log=lambda _m: None)
                ms.setdefault(("serve_cold", "diffill"), []).append(got["cold_ms"])
                for k, by_model in zip(got["keystroke_ms"], got["keystroke_by_model"], strict=True):
                    key = "serve_keystroke" if by_model else "serve_cached"
                    ms.setdefault((key, "diffill"), []).append(k)
                ms.setdefault(("serve_ready", "diffill"), []).append(got["ready_s"] * 1e3)
            if timed:
                log(f"repeat {r - warmup + 1}/{repeats}: " + ", ".join(
                    f"{s} {side} {ms[(s, side)][-1]:.0f} ms" for s, side in ms))
    finally:
        infos = {w.side: w.close() for w in sides}
    load_after = os.getloadavg()
    rows = []
    scenarios = ["cold", "keystroke", "draft"]
    scenarios += [s for s in ("serve_cold", "serve_keystroke") if (s, "diffill") in ms]
    for scenario in scenarios:
        # llama.cpp's cost for the same middle: its cold request for a draft, its own
        # cold request / keystrokes for the server's
        lsc = {"draft": "cold", "serve_cold": "cold", "serve_keystroke": "keystroke"}.get(
            scenario, scenario)
        a, b = _stats(ms[(lsc, "llama.cpp")]), _stats(ms[(scenario, "diffill")])
        ld = detail[(lsc, "llama.cpp")]
        own = detail.get((scenario, "diffill"))  # None: measured through the server
        dd = own or detail[(lsc, "diffill")]
        rows.append({
            "scenario": scenario, "llama_cpp": a, "diffill": b,
            "llama_over_diffill_p50": round(a["p50_ms"] / b["p50_ms"], 2),
            "llama_over_diffill_min": round(a["min_ms"] / b["min_ms"], 2),
            "llama_prompt_tokens": round(statistics.median(d["prompt_tokens"] for d in ld)),
            "llama_tokens_evaluated": round(statistics.median(d["evaluated"] for d in ld)),
            "diffill_context_tokens": dd[0]["prompt_tokens"],
            "diffill_steps": [d["steps"] for d in own] if own else None,
            "diffill_verified": sum(d["verified"] for d in own) if own else None,
        })
    return {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_string(torch.device("cpu")),
        "model": str(Path(model_dir).expanduser().resolve()), "gguf": str(gguf_file),
        "gguf_mb": round(Path(gguf_file).stat().st_size / 1e6, 1),
        "threads": threads, "steps": steps, "hole": hole, "refresh_every": max(1, refresh),
        "n_gen": hole, "repeats": repeats,
        "warmup": warmup, "keystrokes": keystrokes,
        "case": {"file": shlex.__file__, "lines": FILE_LINES, "hole_line": case.line,
                 "middle": case.middle},
        "llama_cpp": infos["llama.cpp"],
        "diffill": infos["diffill"],
        "reuse": infos["diffill"]["reuse"],
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in load_after]},
        "rows": rows,
        "serve": None if ("serve_cold", "diffill") not in ms else {
            "ready_ms": _stats(ms[("serve_ready", "diffill")]),
            "cached_keystrokes": len(ms.get(("serve_cached", "diffill"), [])),
            "cached_keystroke_ms": _stats(ms[("serve_cached", "diffill")])
            if ("serve_cached", "diffill") in ms else None},
    }



_TITLES = {"cold": "(a) cold request", "keystroke": "(b) next keystroke",
           "draft": "(c) verified draft", "serve_cold": "(d) serve: cold",
           "serve_keystroke": "(e) serve: keystroke"}


def format_table(res: dict[str, Any]) -> str:
    d, lc = res["diffill"], res["llama_cpp"]
    st = d.get("engine_stats") or {}
    if not res["reuse"]:
        reuse = "no per-document context reuse in the engine: each keystroke from scratch"
    else:
        reuse = (f"keystrokes pass EngineAsk({res['reuse']}=doc), reuse "
                 f"{'on' if d.get('reuse_on') else 'off'}: contexts reused "
                 f"{st.get('context_reused', '?')}, computed {st.get('context_computed', '?')} "
                 "(warm-up included)")
    la = res["load_average"]
    lines = [
        f"diffill vs llama.cpp {lc.get('version')}: {res['model']} on {res['machine']}, "
        f"{res['threads']} threads each; load average {la['before'][0]} -> {la['after'][0]}",
        f"request: {res['case']['file']} lines 1-{res['case']['lines']}, hole at line "
        f"{res['case']['hole_line']} ({res['case']['middle']!r}); "
        f"{res['rows'][0]['llama_prompt_tokens']} FIM prompt tokens, "
        f"{res['rows'][0]['diffill_context_tokens']} context tokens",
        f"llama.cpp: GGUF Q8_0 {res['gguf_mb']:.0f} MB, greedy, {res['n_gen']} tokens, "
        f"peak RSS {lc['peak_rss_mb']:.0f} MB",
        f"diffill: {res['hole']}-slot hole, {res['steps']} steps, {_refresh_words(d.get('refresh_every', 1))}, "
        f"{d.get('weights')} weights, "
        f"context per {d.get('context')}, peak RSS {d['peak_rss_mb']:.0f} MB; {reuse}",
        f"{res['repeats']} repeats after {res['warmup']} warm-up, interleaved; keystroke = "
        f"{res['keystrokes']} typed characters per repeat; (c) llama.cpp = its cold request",
        f"{'':<22} {'llama.cpp p50':>13} {'min':>7} {'evald':>6} {'diffill p50':>11} "
        f"{'min':>7} {'llama/diffill p50':>17} {'min':>5}",
    ]
    for r in res["rows"]:
        a, b = r["llama_cpp"], r["diffill"]
        lines.append(
            f"{_TITLES[r['scenario']]:<22} {a['p50_ms']:>10.0f} ms {a['min_ms']:>7.0f} "
            f"{r['llama_tokens_evaluated']:>6} {b['p50_ms']:>8.0f} ms {b['min_ms']:>7.0f} "
            f"{r['llama_over_diffill_p50']:>17.2f} {r['llama_over_diffill_min']:>5.2f}")
    sv = res.get("serve")
    if sv:
        cached = (f"; {sv['cached_keystrokes']} keystrokes answered by its typed-ahead cache, "
                  f"p50 {sv['cached_keystroke_ms']['p50_ms']:.0f} ms" if sv["cached_keystrokes"] else "")
        lines.append(f"(d)/(e) through a fresh `diffill serve` per repeat (ready p50 "
                     f"{sv['ready_ms']['p50_ms'] / 1e3:.1f} s), (e) over the keystrokes that reached "
                     f"the model{cached}; llama.cpp's figures are its own (a)/(b)")
    return "\n".join(lines)
