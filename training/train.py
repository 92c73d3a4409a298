"""Train diffill's own masked-diffusion model (CPU or CUDA, one code path).

Loss and batches: :mod:`diffill.training.data` (MDLM/LLaDA ELBO with 1/t weights,
plain windows mixed with FIM canvases shaped like the sampler's).

Two objectives share the transformer (``--objective``):

* ``mdm`` -- masked diffusion, the model diffill serves.
* ``ar`` -- causal next-token pre-training of the same weights, a warm start.
  Measured on the 2-core CPU (d=192, 6 layers, 4k-token batches, lr 3e-3): from
  scratch the diffusion loss sat on the unigram plateau (~7.0 nats on plain
  windows, context unused) for 1,000+ steps, while the causal loss passed the
  unigram entropy (6.55) within 150 steps. So the default model is trained like
  Dream: ``--objective ar --shift-logits`` first, then ``--init-from`` that run
  with ``--shift-logits`` and the diffusion objective (full attention; the
  shifted head keeps "hidden state i predicts token i+1", which the sampler and
  the caches honour for every shift model).

Optimiser: AdamW (decoupled weight decay) on matrices only -- norms, biases and
(by default) the embedding, which is also the tied output head, get no decay.
Schedule: linear warm-up over ``warmup`` steps, then cosine decay to
``min_lr_ratio * lr`` at the end of the run. The run's progress is
``max(tokens / max_tokens, elapsed / max_time)`` over whichever limits are set,
so a time-bounded run still ends its decay on time. Gradients are clipped to
``grad_clip`` (global norm). bf16 autocast on CPU and CUDA (``--no-bf16`` for
fp32); optional ``torch.compile`` of the transformer body.

A run folder holds::

    log.jsonl                  one JSON object per log line (step, tokens, loss, lr, tok/s, ...)
    checkpoints/step-NNNNNNN/  config.json + model.safetensors + tokenizer.json (a loadable
                               diffill checkpoint) + training_state.pt (optimizer, step,
                               tokens, data RNG, elapsed; never shipped)
    latest -> checkpoints/step-NNNNNNN   (symlink, updated atomically)

``--resume DIR`` (a run folder or a checkpoint folder) restores weights,
optimiser, step, token count, elapsed time and the data generator state, so the
schedule and the batch stream continue exactly where they stopped.

The micro model (tests, editor end-to-end checks, CI): :func:`train_micro_model`
or ``python -m diffill.training.train --micro OUT``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from ..model.config import DiffillDialect, ModelConfig
from ..model.runtime import resolve_device
from ..model.transformer import Transformer
from .data import (
    FIM,
    PLAIN,
    Batch,
    BatchMaker,
    BatchStream,
    DataConfig,
    Specials,
    TokenSource,
    heldout_batches,
)

SHIP_LIMIT_BYTES = 60_000_000  # shipped weights stay below this (bf16 when fp32 would not fit)


@dataclass
class TrainConfig:
    # model shape
    d_model: int = 256
    layers: int = 6
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 704
    rope_theta: float = 10000.0
    qk_norm: bool = True
    # Dream-style shifted head: position i predicts token i+1 (what a causal LM's head
    # does). Needed to start the diffusion phase from an autoregressive phase.
    shift_logits: bool = False
    # "mdm": masked diffusion (the model diffill ships); "ar": causal next-token
    # pre-training of the same transformer (a warm start for "mdm" with shift_logits).
    objective: str = "mdm"
    # data
    seq_len: int = 512
    batch_tokens: int = 8192
    fim_ratio: float = 0.6
    p_copy_line: float = 0.0
    hole_buckets: tuple[int, ...] = (4, 8, 16, 32, 64)
    # optimisation
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 200
    weight_decay: float = 0.1
    decay_embeddings: bool = False
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # limits (0 = none)
    max_tokens: int = 0
    max_steps: int = 0
    max_time_min: float = 0.0
    # run
    bf16: bool = True
    compile: bool = False
    seed: int = 0
    threads: int = 0
    device: str = "auto"
    log_every: int = 10
    eval_every_min: float = 5.0
    eval_every_steps: int = 0
    eval_batches: int = 4
    data_workers: int = 0  # >0: batches cut by this many processes (see data.BatchStream)
    save_every_min: float = 10.0
    keep_checkpoints: int = 3
    progress: bool = True
    command: str = ""

    def model_config(self, sp: Specials, vocab_size: int) -> ModelConfig:
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.heads}")
        return ModelConfig(
            family="diffill",
            vocab_size=vocab_size,
            hidden_size=self.d_model,
            intermediate_size=self.ffn,
            num_layers=self.layers,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads,
            head_dim=self.d_model // self.heads,
            rope_theta=self.rope_theta,
            qk_norm=self.qk_norm,
            tie_embeddings=True,
            max_position_embeddings=self.seq_len,
            mask_token_id=sp.mask,
            pad_token_id=sp.pad,
            eos_token_id=sp.eos,
            bos_token_id=sp.bos,
            shift_logits=self.shift_logits,
        )

    def data_config(self) -> DataConfig:
        return DataConfig(seq_len=self.seq_len, fim_ratio=self.fim_ratio,
                          hole_buckets=tuple(self.hole_buckets), p_copy_line=self.p_copy_line)


# --------------------------------------------------------------------------- pieces


def param_groups(model: torch.nn.Module, weight_decay: float, decay_embeddings: bool) -> list[dict]:
    """Decay on matrices of the blocks (and the embedding only if asked); none on
    norms, biases."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_emb = name.startswith("embed_tokens") or name.startswith("lm_head")
        if p.dim() >= 2 and (decay_embeddings or not is_emb):
            decay.append(p)
        else:
            no_decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]




def lr_at(step: int, progress: float, tc: TrainConfig) -> float:
    """Linear warm-up over ``tc.warmup`` steps, then cosine from lr to min_lr_ratio*lr
    as ``progress`` goes 0 -> 1 (progress = fraction of the run done)."""
    if tc.warmup > 0 and step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    p = min(max(progress, 0.0), 1.0)
    lo = tc.lr * tc.min_lr_ratio
    return lo + 0.5 * (tc.lr - lo) * (1.0 + math.cos(math.pi * p))


def autocast_ctx(device: torch.device, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def diffusion_loss(
    model: Transformer,
    batch: dict[str, torch.Tensor],
    bf16: bool,
    body: Any = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The weighted masked-token cross-entropy of :mod:`diffill.training.data`.

    batch: input_ids, targets [B, T] long; attention_mask [B, T] bool; weights [B, T]
    float (``1/(t N)`` on masked targets); kind [B]. The LM head runs only at
    masked positions. Returns (loss, per-row loss [B] detached).
    """
    ids, att, tgt, w = batch["input_ids"], batch["attention_mask"], batch["targets"], batch["weights"]
    B = ids.shape[0]
    fwd = body if body is not None else model.forward_hidden
    shift = model.config.shift_logits
    with autocast_ctx(ids.device, bf16):
        hidden, _ = fwd(ids, att)  # [B, T, D]
        if shift:  # slot i is read from the hidden state at i-1 (slot 0 has none: no loss)
            hidden, tgt, w = hidden[:, :-1], tgt[:, 1:], w[:, 1:]
        sel = w > 0  # [B, T]
        logits = model.head(hidden[sel])  # [M, V]
    ce = F.cross_entropy(logits.float(), tgt[sel], reduction="none")  # [M]
    contrib = ce * w[sel]
    loss = contrib.sum() / B
    rows = torch.zeros(B, device=ids.device, dtype=torch.float32)
    rows.index_add_(0, sel.nonzero()[:, 0], contrib.detach().float())
    return loss, {"rows": rows}


def ar_loss(
    model: Transformer,
    batch: dict[str, torch.Tensor],
    bf16: bool,
    body: Any = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Causal next-token cross-entropy over the clean rows (``targets``), the same
    transformer with a causal mask: the warm-start phase. Returns (mean loss over the
    predicted tokens, per-row mean loss [B] detached)."""
    tgt, att = batch["targets"], batch["attention_mask"]
    B = tgt.shape[0]
    fwd = body if body is not None else model.forward_hidden
    key_mask = None if bool(att.all()) else att[:, :-1]
    with autocast_ctx(tgt.device, bf16):
        hidden, _ = fwd(tgt[:, :-1], key_mask, causal=True)
        logits = model.head(hidden)
    valid = att[:, 1:]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1),
                         reduction="none").view(B, -1) * valid
    loss = ce.sum() / valid.sum().clamp(min=1)
    rows = ce.detach().sum(1) / valid.sum(1).clamp(min=1)
    return loss, {"rows": rows}


def reference_loss(model: Transformer, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Slow reference: full logits everywhere, explicit per-row sums (fp32)."""
    logits = model(batch["input_ids"], batch["attention_mask"]).float()  # [B, T, V]
    logp = logits.log_softmax(-1)
    B, T = batch["input_ids"].shape
    shift = 1 if model.config.shift_logits else 0  # slot i read from position i - 1
    total = torch.zeros((), dtype=torch.float32)
    for b in range(B):
        for i in range(shift, T):
            wt = float(batch["weights"][b, i])
            if wt > 0:
                total = total - wt * logp[b, i - shift, batch["targets"][b, i]]
    return total / B


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def hardware_string(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    folder: Path,
    model: Transformer,
    cfg: ModelConfig,
    tokenizer_path: Path,
    provenance: dict[str, Any],
    training_state: dict[str, Any] | None,
) -> None:
    """Write a loadable diffill checkpoint folder (atomically: tmp dir + rename)."""
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    n_bytes = sum(v.numel() * 4 for v in sd.values())
    dtype_name = "float32"
    if n_bytes > SHIP_LIMIT_BYTES:
        sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}
        dtype_name = "bfloat16"
    dialect = DiffillDialect.from_model_config(cfg, provenance)
    dialect = type(dialect)(**{**{f: getattr(dialect, f) for f in dialect.__struct_fields__},
                               "torch_dtype": dtype_name})
    (tmp / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(dialect), indent=2) + b"\n")
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
    if training_state is not None:
        if dtype_name != "float32":
            training_state = {**training_state, "model_fp32": {k: v.detach().cpu().clone()
                                                                for k, v in model.state_dict().items()}}
        torch.save(training_state, tmp / "training_state.pt")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def _update_latest(run_dir: Path, ckpt: Path) -> None:
    link = run_dir / "latest"
    tmp = run_dir / "latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(ckpt.relative_to(run_dir))
    os.replace(tmp, link)


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a run folder (its ``latest``) or a checkpoint folder."""
    p = Path(path)
    if (p / "training_state.pt").is_file():
        return p
    if (p / "latest" / "training_state.pt").is_file():
        return (p / "latest").resolve()
    raise FileNotFoundError(f"{p}: neither a checkpoint folder nor a run folder with latest/")


def find_weights(path: str | Path) -> Path:
    """For ``--init-from``: a checkpoint or run folder (see :func:`find_checkpoint`), or a
    bare model folder with ``config.json`` and ``model.safetensors`` (e.g. the shipped model)."""
    p = Path(path)
    if (p / "config.json").is_file() and (p / "model.safetensors").is_file():
        return p
    try:
        return find_checkpoint(p)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{p}: no config.json + model.safetensors, and not a run folder with latest/"
        ) from None


# --------------------------------------------------------------------------- the trainer


@dataclass
class TrainResult:
    out_dir: Path
    checkpoint: Path
    steps: int
    tokens: int
    train_loss: float
    val_loss: float | None
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    def __init__(
        self,
        tc: TrainConfig,
        out_dir: str | Path,
        tokenizer_path: str | Path,
        train_src: TokenSource,
        val_src: TokenSource | None,
        *,
        data_cfg: DataConfig | None = None,
        meta: dict[str, Any] | None = None,
        resume: str | Path | None = None,
        init_from: str | Path | None = None,
    ) -> None:
        if tc.objective not in ("mdm", "ar"):
            raise ValueError(f"objective must be 'mdm' or 'ar', got {tc.objective!r}")
        if tc.objective == "ar" and not tc.shift_logits:
            raise ValueError("objective 'ar' trains a shifted head: set shift_logits")
        self.tc = tc
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tokenizer_path = Path(tokenizer_path)
        self.tok = HFTokenizer.from_file(str(self.tokenizer_path))
        self.sp = Specials.from_tokenizer(self.tok)
        self.meta = meta or {}
        if tc.threads:
            torch.set_num_threads(tc.threads)
        self.device = resolve_device(tc.device)
        self.dcfg = data_cfg or tc.data_config()
        self.batch_size = max(1, tc.batch_tokens // self.dcfg.seq_len)
        self.cfg = tc.model_config(self.sp, self.tok.get_vocab_size(with_added_tokens=True))
        torch.manual_seed(tc.seed)
        self.model = Transformer(self.cfg)
        self.model.init_weights(seed=tc.seed)
        self.model.to(self.device)
        self.opt = torch.optim.AdamW(
            param_groups(self.model, tc.weight_decay, tc.decay_embeddings),
            lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=1e-8,
            fused=self.device.type == "cuda" or None,
        )
        self.data = BatchMaker(train_src, self.tok, self.dcfg, self.batch_size, seed=tc.seed)
        self.val = (heldout_batches(val_src, self.tok, self.dcfg, self.batch_size, tc.eval_batches)
                    if val_src is not None and tc.eval_batches > 0 else [])
        self.step = 0
        self.tokens = 0
        self.elapsed = 0.0  # seconds of training, summed over resumed segments
        self.last_loss = float("nan")
        self.last_val: float | None = None
        self.history: list[dict[str, Any]] = []
        self.body = None
        if tc.compile:
            self.body = torch.compile(self.model.forward_hidden, dynamic=True)
        self.loss_fn = ar_loss if tc.objective == "ar" else diffusion_loss
        self.init_info: dict[str, Any] | None = None
        if init_from and resume:
            raise ValueError("give --init-from or --resume, not both")
        if init_from:
            self.init_weights_from(find_weights(init_from))
        if resume:
            self.load_state(find_checkpoint(resume))

    # -- state ------------------------------------------------------------------------------
    def training_state(self) -> dict[str, Any]:
        return {
            "optimizer": self.opt.state_dict(),
            "step": self.step,
            "tokens": self.tokens,
            "elapsed": self.elapsed,
            "data_rng": self.data.state(),
            "torch_rng": torch.get_rng_state(),
            "train_config": asdict(self.tc),
            "last_loss": self.last_loss,
            "last_val": self.last_val,
            "init_info": self.init_info,
        }

    def load_state(self, ckpt: Path) -> None:
        st = torch.load(ckpt / "training_state.pt", map_location="cpu", weights_only=False)
        sd = st.get("model_fp32") or load_file(str(ckpt / "model.safetensors"))
        self.model.load_state_dict({k: v.float() for k, v in sd.items()})
        self.opt.load_state_dict(st["optimizer"])
        self.step, self.tokens, self.elapsed = st["step"], st["tokens"], st["elapsed"]
        self.data.set_state(st["data_rng"])
        torch.set_rng_state(st["torch_rng"])
        self.last_loss, self.last_val = st.get("last_loss", float("nan")), st.get("last_val")
        self.init_info = st.get("init_info")

    def init_weights_from(self, ckpt: Path) -> None:
        """Start from another run's weights (same shape) with a fresh optimiser,
        schedule and step count; its token count carries over into ``tokens_seen``."""
        cfg = json.loads((ckpt / "config.json").read_text())
        for key, want in (("hidden_size", self.cfg.hidden_size), ("num_hidden_layers", self.cfg.num_layers),
                          ("vocab_size", self.cfg.vocab_size)):
            if cfg.get(key) != want:
                raise ValueError(f"{ckpt}: {key}={cfg.get(key)} does not match this run's {want}")
        sd = load_file(str(ckpt / "model.safetensors"))
        self.model.load_state_dict({k: v.float() for k, v in sd.items()})
        prov = cfg.get("provenance") or {}
        self.init_info = {"checkpoint": str(ckpt.resolve()), "objective": prov.get("objective", "mdm"),
                          "tokens_seen": int(prov.get("tokens_seen") or 0),
                          "steps": prov.get("steps"), "val_loss": prov.get("val_loss"),
                          "training_seconds": prov.get("training_seconds"),
                          "init_from": prov.get("init_from")}

    def provenance(self) -> dict[str, Any]:
        tc = self.tc
        prior = self.init_info or {}
        return {
            "corpus_manifest_sha256": self.meta.get("manifest_sha256"),
            "tokenizer_sha256": sha256_file(self.tokenizer_path),
            "parameters": self.model.num_parameters(),
            "tokens_seen": self.tokens + int(prior.get("tokens_seen") or 0),
            "steps": self.step,
            "objective": tc.objective,
            "shift_logits": tc.shift_logits,
            "init_from": prior or None,
            "train_loss": None if math.isnan(self.last_loss) else round(self.last_loss, 4),
            "val_loss": None if self.last_val is None else round(self.last_val, 4),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": tc.command,
            "hardware": hardware_string(self.device),
            "bf16": tc.bf16,
            "seq_len": self.dcfg.seq_len,
            "fim_ratio": self.dcfg.fim_ratio,
            "p_copy_line": self.dcfg.p_copy_line,
            "hole_buckets": list(self.dcfg.hole_buckets),
            "training_seconds": round(self.elapsed + float(prior.get("training_seconds") or 0), 1),
        }

    def save(self) -> Path:
        ckpt = self.out / "checkpoints" / f"step-{self.step:07d}"
        save_checkpoint(ckpt, self.model, self.cfg, self.tokenizer_path, self.provenance(),
                        self.training_state())
        _update_latest(self.out, ckpt)
        olds = sorted(p for p in (self.out / "checkpoints").glob("step-*") if p.is_dir()
                      and not p.name.endswith(".tmp"))
        for p in olds[: max(0, len(olds) - self.tc.keep_checkpoints)]:
            shutil.rmtree(p, ignore_errors=True)
        return ckpt

    # -- steps ------------------------------------------------------------------------------
    def progress(self) -> float:
        fr = []
        if self.tc.max_tokens:
            fr.append(self.tokens / self.tc.max_tokens)
        if self.tc.max_steps:
            fr.append(self.step / self.tc.max_steps)
        if self.tc.max_time_min:
            fr.append(self.elapsed / (60 * self.tc.max_time_min))
        return max(fr) if fr else 0.0

    def done(self) -> bool:
        return bool(
            (self.tc.max_tokens and self.tokens >= self.tc.max_tokens)
            or (self.tc.max_steps and self.step >= self.tc.max_steps)
            or (self.tc.max_time_min and self.elapsed >= 60 * self.tc.max_time_min)
        )

    def train_step(self, batch: Batch) -> float:
        self.model.train()
        lr = lr_at(self.step, self.progress(), self.tc)
        for g in self.opt.param_groups:
            g["lr"] = lr
        tb = batch.torch(self.device)
        loss, _ = self.loss_fn(self.model, tb, self.tc.bf16, self.body)
        loss.backward()
        if self.tc.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += batch.n_real
        self.last_lr = lr
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if not self.val:
            return {}
        self.model.eval()
        tot = {PLAIN: [0.0, 0], FIM: [0.0, 0]}
        all_sum, all_n = 0.0, 0
        for b in self.val:
            tb = b.torch(self.device)
            _, aux = self.loss_fn(self.model, tb, self.tc.bf16, self.body)
            rows = aux["rows"].cpu().numpy()
            for r, k in zip(rows, b.kind, strict=True):
                tot[int(k)][0] += float(r)
                tot[int(k)][1] += 1
            all_sum += float(rows.sum())
            all_n += len(rows)
        out = {"val_loss": all_sum / max(all_n, 1)}
        if tot[PLAIN][1]:
            out["val_plain"] = tot[PLAIN][0] / tot[PLAIN][1]
        if tot[FIM][1]:
            out["val_fim"] = tot[FIM][0] / tot[FIM][1]
        self.last_val = out["val_loss"]
        return out

    def log(self, rec: dict[str, Any]) -> None:
        self.history.append(rec)
        with open(self.out / "log.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    def fit(self) -> TrainResult:
        tc = self.tc
        bar = None
        if tc.progress:
            total = tc.max_tokens or None
            bar = tqdm(total=total, initial=self.tokens, unit="tok", unit_scale=True,
                       dynamic_ncols=True, file=sys.stderr)
        self.log({"event": "start", "step": self.step, "tokens": self.tokens,
                  "parameters": self.model.num_parameters(), "batch_size": self.batch_size,
                  "seq_len": self.dcfg.seq_len, "device": str(self.device),
                  "threads": torch.get_num_threads(), "config": asdict(tc)})
        stream = None
        if tc.data_workers > 0:
            stream = BatchStream(self.data.src, self.tok, self.dcfg, self.batch_size, seed=tc.seed,
                                 start_step=self.step, workers=tc.data_workers)
        try:
            return self._fit_loop(bar, stream)
        finally:
            if stream is not None:
                stream.close()

    def _fit_loop(self, bar: Any, stream: Any) -> TrainResult:
        tc = self.tc
        seg_start = time.time() - self.elapsed
        last_save = last_eval = time.time()
        win_loss, win_n, win_tok, win_t0 = 0.0, 0, 0, time.time()
        while not self.done():
            batch = stream.next_batch() if stream is not None else self.data.next_batch()
            loss = self.train_step(batch)
            self.elapsed = time.time() - seg_start
            self.last_loss = loss if not math.isfinite(self.last_loss) else 0.9 * self.last_loss + 0.1 * loss
            win_loss += loss
            win_n += 1
            win_tok += batch.n_real
            if bar is not None:
                bar.update(batch.n_real)
            now = time.time()
            want_eval = (tc.eval_every_steps and self.step % tc.eval_every_steps == 0) or (
                not tc.eval_every_steps and tc.eval_every_min and now - last_eval >= 60 * tc.eval_every_min)
            if self.step % tc.log_every == 0 or want_eval or self.done():
                rec = {"step": self.step, "tokens": self.tokens, "loss": round(win_loss / win_n, 5),
                       "lr": self.last_lr, "tok_s": round(win_tok / max(now - win_t0, 1e-9), 1),
                       "elapsed": round(self.elapsed, 1)}
                if want_eval:
                    rec.update({k: round(v, 5) for k, v in self.evaluate().items()})
                    last_eval = time.time()
                self.log(rec)
                if bar is not None:
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tok_s']:.0f}",
                                    lr=f"{self.last_lr:.2e}")
                win_loss, win_n, win_tok, win_t0 = 0.0, 0, 0, time.time()
            if tc.save_every_min and now - last_save >= 60 * tc.save_every_min:
                self.save()
                last_save = time.time()
        ev = self.evaluate()
        if ev:
            self.log({"step": self.step, "tokens": self.tokens, "elapsed": round(self.elapsed, 1),
                      **{k: round(v, 5) for k, v in ev.items()}})
        ckpt = self.save()
        self.log({"event": "end", "step": self.step, "tokens": self.tokens, "checkpoint": str(ckpt),
                  "train_loss": self.last_loss, "val_loss": self.last_val,
                  "elapsed": round(self.elapsed, 1)})
        if bar is not None:
            bar.close()
        return TrainResult(self.out, ckpt, self.step, self.tokens, self.last_loss, self.last_val,
                           self.history)


# --------------------------------------------------------------------------- micro model

# Micro model: tuned so that it memorises the micro corpus (exact line recall through
# the sampler, tests/unit/training/test_train_learning.py) in few steps: FIM rows only, 48 rows per
# step (fewer, larger steps memorise faster per second than many small ones), a high
# learning rate (9/10 exact lines at 600, 800 and 1000 steps when tuned).
MICRO_TRAIN = TrainConfig(
    d_model=128, layers=2, heads=4, kv_heads=2, ffn=384, seq_len=96, batch_tokens=4608,
    fim_ratio=1.0, hole_buckets=(4, 8, 16), lr=5e-3, min_lr_ratio=0.3, warmup=30,
    weight_decay=0.0, max_steps=1000, bf16=False, eval_batches=0, save_every_min=0,
    eval_every_min=0, progress=False, log_every=50, keep_checkpoints=1,
)
MICRO_DATA = DataConfig(
    seq_len=96, fim_ratio=1.0, hole_buckets=(4, 8, 16), max_middle_lines=2,
    line_count_probs=(0.7, 0.3), p_midline=0.2, p_end_midline=0.05,
)
MICRO_VOCAB = 512


def micro_files(corpus_text: str) -> list[str]:
    """Split the micro corpus into 'files' at blank-line-separated top-level blocks."""
    blocks, cur = [], []
    for line in corpus_text.splitlines(keepends=True):
        if not line.strip() and cur and not cur[-1].strip():
            continue
        if line and not line[0].isspace() and cur and any(x.strip() for x in cur) \
                and not cur[-1].strip():
            blocks.append("".join(cur).rstrip("\n") + "\n")
            cur = []
        cur.append(line)
    if any(x.strip() for x in cur):
        blocks.append("".join(cur).rstrip("\n") + "\n")
    return blocks


def train_micro_tokenizer(texts: list[str], vocab_size: int = MICRO_VOCAB) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2,
        special_tokens=["<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>", "<|file|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_micro_model(
    out_dir: str | Path,
    corpus_text: str | None = None,
    *,
    steps: int | None = None,
    seed: int = 0,
    threads: int | None = None,
) -> Path:
    """Train the micro model (a few hundred steps, tens of seconds on 2 cores) on
    ``corpus_text`` (default: ``diffill.model.micro_corpus``-style text shipped with the
    tests) and return its checkpoint folder ``out_dir/model`` (config.json,
    model.safetensors, tokenizer.json). Deterministic for a given seed and thread count.
    One thread by default: the model is tiny, and a second busy-waiting OpenMP thread
    on a contended machine costs several times more than it brings."""
    out = Path(out_dir)
    if corpus_text is None:
        corpus_text = default_micro_corpus()
    files = micro_files(corpus_text)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "run").exists():
        shutil.rmtree(out / "run")
    tok = train_micro_tokenizer(files)
    tok_path = out / "tokenizer.json"
    tok.save(str(tok_path))
    eos = tok.token_to_id("<|eos|>")
    src = TokenSource.from_token_lists([tok.encode(f, add_special_tokens=False).ids for f in files], eos)
    tc = TrainConfig(**{**asdict(MICRO_TRAIN), "seed": seed,
                        "max_steps": steps if steps is not None else MICRO_TRAIN.max_steps,
                        "threads": threads or 1,
                        "command": "diffill.training.train.train_micro_model"})
    tr = Trainer(tc, out / "run", tok_path, src, None, data_cfg=MICRO_DATA,
                 meta={"manifest_sha256": None})
    res = tr.fit()
    final = out / "model"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(res.checkpoint, final, ignore=shutil.ignore_patterns("training_state.pt"))
    (out / "micro_corpus.txt").write_text(corpus_text)
    return final


def default_micro_corpus() -> str:
    """The committed micro corpus (tests/fixtures/micro_corpus.py in a source checkout)."""
    here = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "micro_corpus.py"
    if not here.is_file():
        raise FileNotFoundError(f"{here}: micro corpus not found (pass corpus_text)")
    return here.read_text()


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--data", help="token folder with {train,heldout}.bin/.idx.npy and meta.json")
    p.add_argument("--tokenizer", help="tokenizer.json (default: the one named in meta.json)")
    p.add_argument("--out", help="run folder (log.jsonl, checkpoints/, latest)")
    p.add_argument("--micro", metavar="OUT", help="train the micro test model into OUT and exit")
    p.add_argument("--d-model", type=int, default=d.d_model)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--ffn", type=int, default=d.ffn)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--batch-tokens", type=int, default=d.batch_tokens)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio)
    p.add_argument("--warmup", type=int, default=d.warmup, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--grad-clip", type=float, default=d.grad_clip)
    p.add_argument("--max-tokens", type=float, default=0, help="stop after this many tokens (e.g. 3e7)")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--max-time-min", type=float, default=0.0)
    p.add_argument("--fim-ratio", type=float, default=d.fim_ratio)
    p.add_argument("--p-copy-line", type=float, default=d.p_copy_line,
                   help="share of FIM rows whose cursor line is repeated nearby (copy practice)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=d.bf16)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--resume", help="run folder or checkpoint folder to continue from")
    p.add_argument("--init-from", help="checkpoint whose weights start this run (fresh optimiser "
                   "and schedule), e.g. the autoregressive warm start")
    p.add_argument("--objective", choices=("mdm", "ar"), default=d.objective,
                   help="mdm: masked diffusion (default); ar: causal next-token warm start")
    p.add_argument("--shift-logits", action=argparse.BooleanOptionalAction, default=d.shift_logits,
                   help="position i predicts token i+1 (required by --objective ar and by "
                   "diffusion runs started from it)")
    p.add_argument("--save-every-min", type=float, default=d.save_every_min)
    p.add_argument("--eval-every-min", type=float, default=d.eval_every_min)
    p.add_argument("--eval-batches", type=int, default=d.eval_batches)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--data-workers", type=int, default=0,
                   help="processes that cut batches (GPU runs; 0 = in-process, exact resume)")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")


def run_from_args(args: argparse.Namespace) -> int:
    if args.micro:
        path = train_micro_model(args.micro, threads=args.threads or None)
        print(path)
        return 0
    if not (args.data and args.out):
        print("diffill train: --data and --out are required (or --micro OUT)", file=sys.stderr)
        return 2
    data = Path(args.data)
    meta = json.loads((data / "meta.json").read_text()) if (data / "meta.json").is_file() else {}
    tok_path = Path(args.tokenizer or meta.get("tokenizer") or data.parent / "tokenizer" / "tokenizer.json")
    tc = TrainConfig(
        d_model=args.d_model, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
        ffn=args.ffn, seq_len=args.seq_len, batch_tokens=args.batch_tokens, fim_ratio=args.fim_ratio,
        p_copy_line=args.p_copy_line,
        lr=args.lr, min_lr_ratio=args.min_lr_ratio, warmup=args.warmup,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, max_tokens=int(args.max_tokens),
        max_steps=args.max_steps, max_time_min=args.max_time_min, bf16=args.bf16,
        compile=args.compile, seed=args.seed, threads=args.threads, device=args.device,
        log_every=args.log_every, eval_every_min=args.eval_every_min,
        eval_batches=args.eval_batches, save_every_min=args.save_every_min,
        progress=not args.no_progress, command=" ".join(sys.argv),
        objective=args.objective, shift_logits=args.shift_logits, data_workers=args.data_workers,
    )
    if not (tc.max_tokens or tc.max_steps or tc.max_time_min):
        print("diffill train: give at least one of --max-tokens/--max-steps/--max-time-min",
              file=sys.stderr)
        return 2
    train_src = TokenSource.from_files(data, "train")
    val_src = TokenSource.from_files(data, "heldout") if (data / "heldout.bin").is_file() else None
    tr = Trainer(tc, args.out, tok_path, train_src, val_src, meta=meta, resume=args.resume,
                 init_from=args.init_from)
    print(f"model: {tr.model.num_parameters() / 1e6:.2f}M parameters, batch {tr.batch_size}x"
          f"{tc.seq_len}, device {tr.device}, threads {torch.get_num_threads()}, bf16 {tc.bf16}",
          file=sys.stderr)
    res = tr.fit()
    print(json.dumps({"checkpoint": str(res.checkpoint), "steps": res.steps, "tokens": res.tokens,
                      "train_loss": res.train_loss, "val_loss": res.val_loss}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diffill.training.train", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
