"""Latency benchmark: diffusion infill vs autoregressive decoding, side by side.

``diffill bench`` (see ``evaluation/commands/bench.py``) measures, in one run on
one device:

* infill latency (p50 / p95 over repeats) and tokens/s over context length x
  hole length x steps, without and with the dual KV cache;
* the same model decoding the same number of tokens autoregressively (causal
  attention, KV cache, one token per forward) -> the AR / diffusion time ratio
  at equal output length;
* the device's floors, measured in the same run: copy bandwidth (bytes read +
  written by a large device-to-device copy) and matmul rate; every step is
  reported against its weight-read floor (bytes of weights / bandwidth) and its
  FLOP floor (FLOPs / matmul rate).

Latency depends on shapes, not on weight values, so the presets are randomly
initialised models with the public configs of Qwen2.5-0.5B / 1.5B / 7B
(Dream / DiffuCoder / Open-dCoder shapes). ``default`` is the shipped model
(``model/default_model``) when it exists, else a random model of the default
training shape (said so in the output).

Everything returned is JSON-able; :func:`format_table` and :func:`plot` render it.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from ..kernels import select_unmask as su
from ..model import attention
from ..model.asks import EngineAsk
from ..model.cache import SharedContext
from ..model.config import ModelConfig
from ..model.decoder.canvas import build_canvas, initial_state
from ..model.decoder.spec import SamplerConfig, SpecialIds, StepSpec
from ..model.decoder.step import denoise_step
from ..model.engine import Engine
from ..model.engine_options import EngineOptions
from ..model.loader import LoadedModel, default_model_path, load_model
from ..model.measure import synthetic_request, time_ms
from ..model.quant import quantize_model
from ..model.transformer import Transformer
from .ar import generate

# -- model presets ---------------------------------------------------------------------------

_QWEN_SPECIALS = dict(mask_token_id=151666, pad_token_id=151643, eos_token_id=151643,
                      bos_token_id=None, shift_logits=True, rope_theta=1_000_000.0,
                      qkv_bias=True, rms_norm_eps=1e-6, max_position_embeddings=32768)

#: Public Qwen2.5 configs (config.json on the Hub) as Dream-style diffusion models.
PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": ModelConfig(family="qwen2", vocab_size=151936, hidden_size=896,
                                intermediate_size=4864, num_layers=24, num_heads=14,
                                num_kv_heads=2, head_dim=64, tie_embeddings=True, **_QWEN_SPECIALS),
    "qwen2.5-1.5b": ModelConfig(family="qwen2", vocab_size=151936, hidden_size=1536,
                                intermediate_size=8960, num_layers=28, num_heads=12,
                                num_kv_heads=2, head_dim=128, tie_embeddings=True, **_QWEN_SPECIALS),
    "qwen2.5-7b": ModelConfig(family="qwen2", vocab_size=152064, hidden_size=3584,
                              intermediate_size=18944, num_layers=28, num_heads=28,
                              num_kv_heads=4, head_dim=128, tie_embeddings=False, **_QWEN_SPECIALS),
    # diffill's default training shape (training/train.py TrainConfig defaults, 8192-token BPE),
    # used when the trained default model is not installed
    "default-shape": ModelConfig(family="diffill", vocab_size=8192, hidden_size=256,
                                 intermediate_size=704, num_layers=6, num_heads=4, num_kv_heads=2,
                                 head_dim=64, qk_norm=True, tie_embeddings=True,
                                 max_position_embeddings=512, mask_token_id=3, pad_token_id=2,
                                 eos_token_id=1, bos_token_id=0),
    # a few-MB model for smoke tests
    "tiny": ModelConfig(family="diffill", vocab_size=512, hidden_size=64, intermediate_size=128,
                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True,
                        tie_embeddings=True, max_position_embeddings=1024, mask_token_id=3,
                        pad_token_id=2, eos_token_id=1, bos_token_id=0),
}


@dataclass
class BenchModel:
    model: Any  # Transformer
    config: ModelConfig
    name: str
    trained: bool  # real weights (a checkpoint) vs random weights of a shape
    device: torch.device
    dtype: torch.dtype
    lm: Any = None  # the LoadedModel when loaded from a folder


def random_model(cfg: ModelConfig, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    """A Transformer with random weights, built directly on ``device``."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = Transformer(cfg)
    return model.to(dtype).eval().requires_grad_(False)


def load_bench_model(spec: str | None, device: str | torch.device = "cpu",
                     dtype: torch.dtype | None = None) -> BenchModel:
    """``None``/'default' -> the shipped model, else a random model of the default shape;
    a preset name -> random weights of that shape; anything else -> a checkpoint folder."""
    dev = torch.device(device)
    dt = dtype if dtype is not None else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if spec in (None, "default"):
        if (default_model_path() / "config.json").is_file():
            spec = str(default_model_path())
        else:
            cfg = PRESETS["default-shape"]
            return BenchModel(random_model(cfg, dev, dt), cfg, "default-shape (random weights; "
                              "trained default model not installed)", False, dev, dt)
    if spec in PRESETS:
        cfg = PRESETS[spec]
        return BenchModel(random_model(cfg, dev, dt), cfg, f"{spec} (random weights)", False, dev, dt)
    lm = load_model(spec, device=dev, dtype=dtype)
    return BenchModel(lm.model, lm.config, str(lm.path), True, lm.device, lm.dtype, lm)


# -- floors -----------------------------------------------------------------------------------


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_ms(fn: Callable[[], Any], dev: torch.device, repeats: int, warmup: int = 1) -> float:
    return statistics.median(timed(fn, dev, repeats, warmup))


def measure_floors(device: torch.device | str, dtype: torch.dtype, *, copy_mb: int = 1024,
                   matmul_n: int = 8192, repeats: int = 10) -> dict[str, float]:
    """Copy bandwidth (GB/s, bytes read + written) and matmul rate (TFLOP/s) on random data."""
    dev = torch.device(device)
    n_el = copy_mb * 2**20 // 4
    src, dst = torch.rand(n_el, device=dev), torch.empty(n_el, device=dev)
    copy_ms = _median_ms(lambda: dst.copy_(src), dev, repeats)
    copy_gbps = 2 * n_el * 4 / (copy_ms * 1e-3) / 1e9
    mm_dtype = dtype if dev.type == "cuda" else torch.float32
    a = torch.randn(matmul_n, matmul_n, device=dev).to(mm_dtype)
    b = torch.randn(matmul_n, matmul_n, device=dev).to(mm_dtype)
    mm_ms = _median_ms(lambda: a @ b, dev, repeats)
    tflops = 2 * matmul_n**3 / (mm_ms * 1e-3) / 1e12
    return {"copy_gbps": float(f"{copy_gbps:.4g}"), "matmul_tflops": float(f"{tflops:.4g}"),
            "matmul_dtype": str(mm_dtype).removeprefix("torch."), "copy_mb": copy_mb,
            "matmul_n": matmul_n}


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of weights one forward reads: every layer, the final norm and the LM head
    (the input embedding is a row gather, except that a tied head reads the table)."""
    d, f, L, V, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size,
                      cfg.head_dim)
    attn = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    attn += (cfg.num_heads + 2 * cfg.num_kv_heads) * hd if cfg.qkv_bias else 0
    attn += 2 * hd if cfg.qk_norm else 0
    per_layer = attn + 3 * d * f + 2 * d
    n = L * per_layer + d + V * d
    return n * torch.finfo(dtype).bits // 8


def step_flops(cfg: ModelConfig, rows: int, q_tokens: int, k_tokens: int, head_rows: int) -> float:
    """FLOPs of one forward: ``rows`` x ``q_tokens`` queries over ``k_tokens`` keys,
    LM head on ``head_rows`` positions per row."""
    d, f, L, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.head_dim
    lin = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * f
    attn = 4 * q_tokens * k_tokens * cfg.num_heads * hd
    return rows * (L * (2 * lin * q_tokens + attn) + 2 * d * cfg.vocab_size * head_rows)


# -- timing helpers -----------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(ms, 50), 4), "p95_ms": round(percentile(ms, 95), 4),
            "mean_ms": round(statistics.fmean(ms), 4), "n": len(ms)}


def timed(fn: Callable[[], Any], dev: torch.device, repeats: int, warmup: int) -> list[float]:
    return time_ms(fn, dev, warmup=warmup, repeats=repeats)


def request_for(cfg: ModelConfig, ctx: int, seed: int = 0) -> tuple[list[int], list[int]]:
    return synthetic_request(cfg, ctx, seed)


# -- the benchmark ------------------------------------------------------------------------------


@dataclass
class BenchOptions:
    ctx: tuple[int, ...] = (256, 1024)
    holes: tuple[int, ...] = (16, 32)
    steps: tuple[int, ...] = (1, 2, 4, 8, 16)
    refresh: tuple[int, ...] = (0, 4)  # 0 = no cache; r > 0 = dual cache refreshed every r steps
    candidates: int = 1  # candidate lengths per request (1: the hole only, equal output to AR)
    repeats: int = 10
    warmup: int = 2
    ar: bool = True
    floors: bool = True
    floor_copy_mb: int = 1024
    floor_matmul_n: int = 8192
    attention: str = "auto"  # attention backend (model/attention.py)
    graphs: bool = False  # engine: CUDA graphs of the step (+ shape buckets)
    select_impl: str | None = None  # engine: None (torch step) | auto | torch | triton
    kernel_shapes: tuple[tuple[int, int, int], ...] = ()  # [B, N, V] select-and-unmask timings
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _lengths(hole: int, candidates: int) -> tuple[int, ...]:
    out = []
    for i in range(candidates):
        n = max(1, hole >> i)
        if n not in out:
            out.append(n)
    return tuple(out)


def make_engine(bm: BenchModel, opts: BenchOptions, refresh: int) -> Any:
    """A single-request engine (no batching wait) with this run's speed options."""
    lm = bm.lm or LoadedModel(model=bm.model, tokenizer=None, config=bm.config,
                              path=Path(bm.name), provenance={}, device=bm.device, dtype=bm.dtype)
    eo = EngineOptions(batch=False, refresh_every=max(1, refresh), select_impl=opts.select_impl,
                       cuda_graphs=opts.graphs, buckets=opts.graphs)
    return Engine(lm, SamplerConfig(), options=eo)


def run_bench(bm: BenchModel, opts: BenchOptions,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the grid; returns a JSON-able dict (see module doc)."""
    log = log or (lambda s: None)
    model, cfg, dev = bm.model, bm.config, bm.device
    limit = cfg.max_position_embeddings
    result: dict[str, Any] = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_string(dev),
        "model": bm.name, "trained_weights": bm.trained,
        "config": {k: getattr(cfg, k) for k in ("family", "vocab_size", "hidden_size",
                                                 "intermediate_size", "num_layers", "num_heads",
                                                 "num_kv_heads", "head_dim", "shift_logits")},
        "params": sum(p.numel() for p in model.parameters()),
        "device": str(dev), "dtype": str(bm.dtype).removeprefix("torch."),
        "options": asdict(opts), "torch": torch.__version__,
        "attention_backend": None, "infill": [], "ar": [], "floors": None,
    }
    old_backend = attention.get_backend()
    try:
        attention.set_backend(opts.attention)
    except RuntimeError as e:  # flash requested but not importable
        result["error"] = str(e)
        log(str(e))
        return result
    engines = {r: make_engine(bm, opts, r) for r in opts.refresh}
    result["attention_backend"] = attention.resolved_backend(dev, bm.dtype)
    try:
        if opts.floors:
            log("measuring floors (copy bandwidth, matmul rate)")
            result["floors"] = measure_floors(dev, bm.dtype, copy_mb=opts.floor_copy_mb,
                                              matmul_n=opts.floor_matmul_n)
        if opts.kernel_shapes:
            log("timing select-and-unmask: torch reference vs Triton")
            result["select_kernel"] = bench_select_kernel(dev, opts.kernel_shapes, bm.dtype)
        wbytes = weight_bytes(cfg, bm.dtype)
        result["weight_bytes"] = wbytes
        for ctx in opts.ctx:
            for hole in opts.holes:
                if ctx + hole > limit:
                    log(f"skip ctx {ctx} + hole {hole} > max_position_embeddings {limit}")
                    continue
                prefix, suffix = request_for(cfg, ctx)
                lengths = _lengths(hole, opts.candidates)
                if opts.ar:
                    prompt = prefix + suffix
                    ms = timed(lambda p=prompt, h=hole: generate(model, p, h, sync=False), dev,
                               max(1, opts.repeats // 2), 1)
                    row = {"ctx": ctx, "hole": hole, **_summary(ms)}
                    row["tokens_per_s"] = round(hole / (row["p50_ms"] / 1e3), 2)
                    result["ar"].append(row)
                    log(f"AR ctx {ctx} n {hole}: p50 {row['p50_ms']:.2f} ms")
                for steps in opts.steps:
                    if steps > hole:
                        continue
                    for r in opts.refresh:
                        if r > 0 and steps == 1:
                            continue  # one step is one full forward either way

                        def fn(eng=engines[r], steps=steps, prefix=prefix, suffix=suffix,
                               lengths=lengths) -> None:
                            eng.infill(EngineAsk(prefix, suffix, lengths=lengths, steps=steps))

                        ms = timed(fn, dev, opts.repeats, max(1, opts.warmup))
                        row = {"ctx": ctx, "hole": hole, "steps": steps, "refresh": r,
                               "rows": len(lengths), "graphs": opts.graphs,
                               "select": opts.select_impl, **_summary(ms)}
                        row["tokens_per_s"] = round(hole / (row["p50_ms"] / 1e3), 2)
                        row["step_ms"] = round(row["p50_ms"] / steps, 4)
                        _add_floors(row, cfg, result, ctx, hole, steps, r, len(lengths))
                        result["infill"].append(row)
                        log(f"infill ctx {ctx} hole {hole} steps {steps} "
                            f"{'cache r=' + str(r) if r else 'no cache'}: p50 {row['p50_ms']:.2f} ms")
        _add_ratios(result)
    finally:
        attention.set_backend(old_backend)
    return result


def _add_floors(row: dict[str, Any], cfg: ModelConfig, result: dict[str, Any], ctx: int,
                hole: int, steps: int, refresh: int, rows: int) -> None:
    fl = result.get("floors")
    if not fl:
        return
    T = ctx + hole
    n_full = steps if refresh == 0 else math.ceil(steps / refresh)
    nb = hole + (1 if cfg.shift_logits else 0)
    flops = (n_full * step_flops(cfg, rows, T, T, hole)
             + (steps - n_full) * step_flops(cfg, rows, nb, T, hole))
    bytes_ = steps * result["weight_bytes"]
    t_bytes = bytes_ / (fl["copy_gbps"] * 1e9) * 1e3
    t_flops = flops / (fl["matmul_tflops"] * 1e12) * 1e3
    row["weight_floor_ms"] = round(t_bytes, 4)
    row["flop_floor_ms"] = round(t_flops, 4)
    row["over_floor"] = round(row["p50_ms"] / max(t_bytes, t_flops), 2)


def _add_ratios(result: dict[str, Any]) -> None:
    ar = {(r["ctx"], r["hole"]): r for r in result["ar"]}
    for row in result["infill"]:
        a = ar.get((row["ctx"], row["hole"]))
        if a:
            row["ar_p50_ms"] = a["p50_ms"]
            row["ar_over_diffusion"] = round(a["p50_ms"] / row["p50_ms"], 3)


def machine_string(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


# -- rendering --------------------------------------------------------------------------------


def format_table(result: dict[str, Any]) -> str:
    lines = [f"diffill bench: {result['model']} on {result['machine']} ({result['device']}, "
             f"{result['dtype']}, attention {result['attention_backend']})"]
    fl = result.get("floors")
    if fl:
        lines.append(f"floors: copy {fl['copy_gbps']:.1f} GB/s, matmul {fl['matmul_tflops']:.4g} "
                     f"TFLOP/s ({fl['matmul_dtype']}); weights {result['weight_bytes'] / 1e6:.1f} MB "
                     "read per step")
    opt = result.get("options", {})
    lines.append(f"engine: select {opt.get('select_impl')}, CUDA graphs {opt.get('graphs')}")
    if result.get("error"):
        lines.append(f"error: {result['error']}")
    lines.append(f"{'ctx':>5} {'hole':>4} {'steps':>5} {'cache':>5} {'p50 ms':>9} {'p95 ms':>9} "
                 f"{'tok/s':>9} {'AR p50':>9} {'AR/diff':>7} {'xfloor':>6}")
    for r in result["infill"]:
        cache = f"r={r['refresh']}" if r["refresh"] else "-"
        lines.append(
            f"{r['ctx']:>5} {r['hole']:>4} {r['steps']:>5} {cache:>5} {r['p50_ms']:>9.2f} "
            f"{r['p95_ms']:>9.2f} {r['tokens_per_s']:>9.1f} {r.get('ar_p50_ms', float('nan')):>9.2f} "
            f"{r.get('ar_over_diffusion', float('nan')):>7.2f} {r.get('over_floor', float('nan')):>6.1f}"
        )
    for k in result.get("select_kernel") or []:
        lines.append(f"select-and-unmask [{k['B']}, {k['N']}, {k['V']}] {k['dtype']}: torch "
                     f"{k['torch_ms']:.3f} ms" + (f", triton {k['triton_ms']:.3f} ms "
                                                   f"({k['speedup']:.1f}x)" if "triton_ms" in k else ""))
    for key, title in (("lsp", "LSP end to end"),):
        if result.get(key):
            s = result[key]
            lines.append(f"{title}: p50 {s['e2e_p50_ms']:.2f} ms, p95 {s['e2e_p95_ms']:.2f} ms, "
                         f"server overhead p50 {s.get('overhead_p50_ms', float('nan')):.2f} ms "
                         f"({s['n']} requests)")
            for what, r in (("", s), (" after a half-typed new name", s.get("typed"))):
                if r and r.get("budget_ms") and r.get("n"):
                    lines.append(
                        f"{title}{what}: p50 {r['e2e_p50_ms']:.2f} ms, model calls per request "
                        f"mean {r['model_calls_mean']:.2f} max {r['model_calls_max']}, p95 / budget "
                        f"{r['e2e_p95_ms']:.0f} / {r['budget_ms']:g} ms = {r['p95_over_budget']:.2f}")
    fs = result.get("first_suggestion")
    if fs:
        c, s = fs["complete"], fs["serve"]
        la = fs.get("load_average", {})
        lines.append(
            f"first suggestion (medians of {fs['n']} fresh processes, load average "
            f"{la.get('before', ['?'])[0]} -> {la.get('after', ['?'])[0]}):")
        lines.append(
            f"  diffill complete: {c['wall_s']:.2f} s start to exit = import {c['import_s']:.2f} s"
            f" + model load {c['load_s']:.3f} s + warm-up step {c['warmup_ms'] or 0:.0f} ms"
            f" + completion {c['complete_ms']:.0f} ms (longest candidate {c['steps']:g} steps, budget "
            f"{c['budget_ms']:g} ms, over it {c['over_budget']}/{fs['n']}) + start/exit "
            f"{c['startup_exit_s']:.2f} s; a suggestion {c['suggested']}/{fs['n']}")
        def sec(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f} s"

        lines.append(
            f"  diffill serve: initialize answered {sec(s['initialize_s'])}, model loaded "
            f"{sec(s['loaded_s'])} ({sec(s.get('loaded_after_import_s'))} after the import), "
            f"first answer of the loaded model {s.get('first_answer_ms') or float('nan'):.0f} ms, "
            f"first suggestion {sec(s['first_suggestion_s'])} after start "
            f"({sec(s.get('after_import_s'))} after the import; "
            f"{s['empty_answers_after_load']:g} empty answers after the load); a suggestion "
            f"{s.get('suggested', 0)}/{fs['n']}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str | Path) -> None:
    """PNG: p50 latency vs steps, one line per (ctx, hole, cache), AR as dashed levels."""
    import matplotlib  # optional dependency (diffill[plot]), only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    fig, ax = plt.subplots(figsize=(8, 5))
    groups: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for r in result["infill"]:
        groups.setdefault((r["ctx"], r["hole"], r["refresh"]), []).append(r)
    for (ctx, hole, ref), rows in sorted(groups.items()):
        rows.sort(key=lambda r: r["steps"])
        ax.plot([r["steps"] for r in rows], [r["p50_ms"] for r in rows], marker="o",
                linestyle="-" if ref == 0 else ":",
                label=f"ctx {ctx}, hole {hole}" + (f", cache r={ref}" if ref else ""))
    for a in result["ar"]:
        ax.axhline(a["p50_ms"], linestyle="--", linewidth=0.8, color="gray")
        ax.annotate(f"AR ctx {a['ctx']} n {a['hole']}", (1, a["p50_ms"]), fontsize=7, color="gray")
    ax.set_xlabel("denoising steps")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{result['model']}\n{result['machine']}, {result['dtype']}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def profile_infill(bm: BenchModel, opts: BenchOptions, path: str | Path, *,
                   refresh: int | None = None) -> dict[str, Any]:
    """torch.profiler chrome trace of one infill at the first grid point with the most steps."""
    ctx, hole = opts.ctx[0], opts.holes[0]
    steps = max([s for s in opts.steps if s <= hole] or [1])
    r = max(opts.refresh) if refresh is None else refresh
    prefix, suffix = request_for(bm.config, ctx)
    eng = make_engine(bm, opts, r)
    lengths = _lengths(hole, opts.candidates)

    def once() -> None:
        eng.infill(EngineAsk(prefix, suffix, lengths=lengths, steps=steps))

    once()
    _sync(bm.device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bm.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        once()
        _sync(bm.device)
    prof.export_chrome_trace(str(path))
    sort = "cuda_time_total" if bm.device.type == "cuda" else "cpu_time_total"
    return {"path": str(path), "ctx": ctx, "hole": hole, "steps": steps, "refresh": r,
            "top": prof.key_averages().table(sort_by=sort, row_limit=20)}


def bench_select_kernel(device: torch.device | str, shapes: Sequence[tuple[int, int, int]],
                        dtype: torch.dtype = torch.bfloat16, repeats: int = 20
                        ) -> list[dict[str, Any]]:
    """Select-and-unmask: the torch reference vs the Triton kernels on [B, N, V] logits.

    Each row also gives the bytes floor (the logits read once / copy bandwidth is
    left to the reader: ``logits_mb``). Triton rows are absent where it cannot run.
    """
    dev = torch.device(device)
    out = []
    for B, N, V in shapes:
        g = torch.Generator(device=dev).manual_seed(B * 7 + N)
        logits = (torch.randn(B, N, V, device=dev, generator=g) * 4).to(dtype)
        canvas = torch.randint(0, V, (B, N + 8), device=dev, generator=g)
        cols = torch.arange(N, device=dev).expand(B, N).contiguous()
        masked0 = torch.ones(B, N, dtype=torch.bool, device=dev)
        k = torch.full((B,), max(1, N // 8), device=dev)
        row: dict[str, Any] = {"B": B, "N": N, "V": V, "dtype": str(dtype).removeprefix("torch."),
                               "logits_mb": round(logits.numel() * logits.element_size() / 1e6, 3)}
        impls = ["torch"] + (["triton"] if su.triton_usable(dev) else [])
        for impl in impls:
            def fn(impl=impl, args=(logits, canvas, cols, masked0, k, V)) -> None:
                lg, cv, cl, m0, kk, v = args
                su.select_unmask(lg, cv, cl, m0.clone(), kk, 0.9, "confidence", ban=v - 1, impl=impl)

            row[f"{impl}_ms"] = round(statistics.median(timed(fn, dev, repeats, 3)), 4)
        if "triton_ms" in row:
            row["speedup"] = round(row["torch_ms"] / row["triton_ms"], 2)
        out.append(row)
    return out


# -- one step, variants side by side ------------------------------------------------------------


def step_variants(bm: BenchModel, *, ctx: int = 256, hole: int = 32, candidates: int = 3,
                  drafts: int = 1, repeats: int = 2, warmup: int = 1,
                  variants: Sequence[str] = ("row", "request"),
                  models: dict[str, Any] | None = None,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One refinement step of one request (``ctx`` context tokens, ``candidates`` lengths
    halving down from ``hole``, plus ``drafts`` rows of the longest length, all masked: the
    first step of an editor's request), timed per variant, the variants interleaved
    (ABAB...) so that a busy machine weighs on all alike. Variants: ``row`` (every row's
    whole canvas: the exact path), ``request`` (one context per request,
    :class:`~diffill.model.cache.SharedContext`); ``models`` adds ``name -> model`` (e.g. the
    int8 weights) run with the shared context. Per variant: fastest and median ms; ratios
    against the first variant's fastest."""
    log = log or (lambda s: None)
    cfg, dev = bm.config, bm.device
    lengths = list(_lengths(hole, candidates))[::-1] + [hole] * drafts
    pre, suf = request_for(cfg, ctx)
    cv = build_canvas(cfg, pre, suf, lengths, dev)
    sp = SpecialIds.from_config(cfg)
    spec = StepSpec(sp.mask, sp.pad, sp.terminators, cfg.shift_logits, vocab=cfg.vocab_size)
    runs: dict[str, Callable[[], Any]] = {}
    for v in variants:
        if v == "row":
            runs[v] = lambda: denoise_step(bm.model, cv, initial_state(cv), 2, spec)
        elif v == "request":
            runs[v] = lambda: denoise_step(SharedContext(bm.model, cv, shift=cfg.shift_logits,
                                                         refresh_every=1),
                                           cv, initial_state(cv), 2, spec)
        else:
            raise ValueError(f"unknown step variant {v!r}")
    for name, m in (models or {}).items():
        runs[name] = lambda m=m: denoise_step(SharedContext(m, cv, shift=cfg.shift_logits,
                                                            refresh_every=1),
                                              cv, initial_state(cv), 2, spec)
    ms: dict[str, list[float]] = {k: [] for k in runs}
    with torch.inference_mode():
        for _ in range(warmup):  # untimed
            for fn in runs.values():
                fn()
        for _ in range(repeats):
            for k, fn in runs.items():
                ms[k].append(timed(fn, dev, 1, 0)[0])
                log(f"step {k}: {ms[k][-1]:.0f} ms")
    first = next(iter(runs))
    out = {"ctx": ctx, "hole": hole, "lengths": lengths, "rows": len(lengths),
           "repeats": repeats, "warmup": warmup, "threads": torch.get_num_threads(), "load_average": [round(x, 2) for x in os.getloadavg()],
           "variants": {}}
    for k, xs in ms.items():
        out["variants"][k] = {"min_ms": round(min(xs), 1), "median_ms": round(statistics.median(xs), 1),
                              "speedup_vs_" + first: round(min(ms[first]) / min(xs), 2)}
    return out


def int8_copy(model: Any) -> Any:
    """A copy of ``model`` with int8 weights (:func:`~diffill.model.quant.quantize_model`)."""
    return quantize_model(copy.deepcopy(model))


def int8_logits_error(cfg: ModelConfig, *, layers: int = 2, rows: int = 3, tokens: int = 288,
                      head_rows: int = 32, seed: int = 0) -> dict[str, Any]:
    """int8 weights against fp32 on a random model of ``cfg``'s shape cut to ``layers``
    layers: the logits of the last ``head_rows`` positions of ``rows`` random canvases of
    ``tokens`` tokens -- max and mean |error| relative to max |logit|, argmax agreement."""
    small = cfg.replace(num_layers=layers)
    model = random_model(small, seed=seed)
    q = int8_copy(model)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, small.vocab_size, (rows, tokens), generator=g)
    with torch.inference_mode():
        ref = model.head(model.forward_hidden(ids)[0][:, -head_rows:])
        got = q.head(q.forward_hidden(ids)[0][:, -head_rows:])
    scale = float(ref.abs().max())
    return {"layers": layers, "rows": rows, "tokens": tokens, "head_rows": head_rows,
            "max_rel_error": round(float((got - ref).abs().max()) / scale, 5),
            "mean_rel_error": round(float((got - ref).abs().mean()) / scale, 6),
            "argmax_agreement": round(float((got.argmax(-1) == ref.argmax(-1)).float().mean()), 4),
            "top5_overlap": round(float(
                (got.topk(5, -1).indices[..., :, None] == ref.topk(5, -1).indices[..., None, :])
                .any(-1).float().mean()), 4)}
