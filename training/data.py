"""Training batches for the masked-diffusion LM, from pre-tokenised corpus files.

Token files (written by :mod:`diffill.training.bpe`): ``{split}.bin`` = uint16 ids of
all files concatenated, each followed by ``<|eos|>``; ``{split}.idx.npy`` = int64
start offset of every file. They are memory-mapped, never read whole.

Two kinds of example are mixed in every batch (``DataConfig.fim_ratio`` of the
rows are FIM rows, drawn per row):

**Plain** masked diffusion: a window of ``seq_len`` tokens of the stream (files
separated by ``<|eos|>``); every position is a target.

**FIM**, shaped exactly like the sampler's inference canvas::

    [BOS] prefix [MASK]*n suffix [EOS]

A file region around a random position is decoded to text; the *cursor* is put
at the start of a line (column 0 or after the indentation) or, with probability
``p_midline``, in the middle of a line; the *middle* runs from the cursor to the
end of 1..4 lines (its final newline stays in the suffix, as when the user's
cursor sits at the end of the code on a line), or with probability
``p_end_midline`` stops inside the last line (the suffix then starts with the
rest of that line). With probability ``p_empty`` the middle is empty (the cursor
sits at the end of a complete line). Prefix, middle and suffix texts are
encoded *separately*, as the language server does at inference, so token
boundaries at the cursor match inference. The hole has ``n`` slots: with
probability ``p_tight_hole`` the smallest bucket ``>= m`` (``m`` = middle length),
else drawn uniformly among the buckets ``>= m``; the hole holds the middle
followed by ``n - m`` ``<|pad|>`` tokens (that is how the model learns lengths).
Drawing ``n`` uniformly alone made a single-line hole ~70% pad on average, so most
FIM targets were easy pads and the model learned "mostly pad"; the tight draw
keeps the engine's loose candidates (it tries ``max_tokens/4, /2, /1``) in
training while putting most of the FIM loss on the middle itself.
With probability ``p_copy_line`` the cursor line is drawn among the lines whose
stripped text appears again within ``copy_max_lines`` lines (case ``+copy``): code
repeats itself, and about 15% of held-out lines have a verbatim twin inside the
model's window, but few uniformly drawn training lines do, so the model practised
copying from its context too little (the non-neural baseline lives on exactly that).
Prefix (cut on the left) and suffix (cut on the right) share the rest of
``seq_len``. Only the ``n`` hole slots are targets. Rows are right-padded to the
longest row of the batch; ``attention_mask`` marks real positions.

Noise and loss (MDLM / LLaDA ELBO with the linear schedule alpha_t = 1 - t)
--------------------------------------------------------------------------
Each row b draws a noise level ``t_b`` in ``[eps, 1)``; the rows of a batch are
stratified (``t_b = eps + (1 - eps) * frac(u + b / B)`` in a shuffled order,
one uniform ``u`` per batch), which keeps the marginal of each ``t_b`` uniform
and lowers the variance of the batch loss. Each target position is replaced by
``<|mask|>`` independently with probability ``t_b`` (at least one is masked). A row
with ``N_b`` targets uses ``t_b = max(t_b, 1/N_b)``: at least one masked token is
expected, so forcing one never meets a tiny ``t`` (a 4-slot hole at ``t = 0.001`` would
otherwise weigh its one forced token 250x) and every weight stays ``<= 1``. The
loss is::

    loss = 1/B * sum_b  1/(t_b * N_b) * sum_{i in M_b}  -log p_theta(x_{b,i} | x~_b)

with ``M_b`` the masked positions of row b and ``N_b`` the number of target
positions of row b (``seq_len`` for a plain row, ``n`` for a FIM row). Since
``E[|M_b|] = t_b N_b``, each row's term is an unbiased estimate of the mean
per-target-token negative ELBO; the ``1/t`` weight is ``-alpha'_t / (1 - alpha_t)``
of the linear schedule. A batch carries this as ``weights[b, i] = 1/(t_b N_b)``
on masked positions and 0 elsewhere, so ``loss = sum(weights * CE) / B``.

Everything is drawn from one ``numpy.random.Generator``: a stream of batches is
a pure function of the seed, and its state can be saved and restored to resume.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

PLAIN, FIM = 0, 1


@dataclass(frozen=True)
class Specials:
    bos: int
    eos: int
    pad: int
    mask: int

    @classmethod
    def from_tokenizer(cls, tok: HFTokenizer) -> Specials:
        ids = {}
        for name in ("bos", "eos", "pad", "mask"):
            i = tok.token_to_id(f"<|{name}|>")
            if i is None:
                raise ValueError(f"tokenizer lacks the special token <|{name}|>")
            ids[name] = i
        return cls(**ids)


@dataclass(frozen=True)
class DataConfig:
    seq_len: int = 512
    fim_ratio: float = 0.5
    hole_buckets: tuple[int, ...] = (4, 8, 16, 32, 64)
    max_middle_lines: int = 4
    line_count_probs: tuple[float, ...] = (0.5, 0.2, 0.15, 0.15)  # P(1 line), P(2 lines), ...
    p_midline: float = 0.3  # cursor in the middle of a line
    p_after_indent: float = 0.5  # cursor at line start: after the indentation (else column 0)
    p_end_midline: float = 0.1  # middle stops inside its last line
    p_empty: float = 0.05  # empty middle (all pads)
    p_tight_hole: float = 0.5  # hole = smallest bucket >= middle length (else uniform among them)
    p_copy_line: float = 0.0  # FIM cursor line drawn among lines repeated nearby (see module doc)
    copy_min_chars: int = 4  # a repeated line counts when its stripped text has this many chars
    copy_max_lines: int = 30  # ... and its other occurrence is at most this many lines away
    p_short_context: float = 0.2  # use a random smaller context budget
    t_eps: float = 1e-3

    def __post_init__(self) -> None:
        if not 0.0 <= self.fim_ratio <= 1.0:
            raise ValueError(f"fim_ratio must be in [0, 1], got {self.fim_ratio}")
        if self.seq_len < max(self.hole_buckets) + 8:
            raise ValueError(f"seq_len={self.seq_len} too small for hole buckets {self.hole_buckets}")
        if not 0.0 <= self.p_tight_hole <= 1.0:
            raise ValueError(f"p_tight_hole must be in [0, 1], got {self.p_tight_hole}")
        if not 0.0 <= self.p_copy_line <= 1.0:
            raise ValueError(f"p_copy_line must be in [0, 1], got {self.p_copy_line}")
        if len(self.line_count_probs) != self.max_middle_lines:
            raise ValueError("line_count_probs needs one probability per line count")


class TokenSource:
    """One split: ``ids`` uint16[N] (memory-mapped or in memory), ``starts`` int64[F]."""

    def __init__(self, ids: np.ndarray, starts: np.ndarray) -> None:
        self.ids = ids
        self.starts = np.asarray(starts, dtype=np.int64)
        if len(self.ids) == 0 or len(self.starts) == 0:
            raise ValueError("empty token source")
        # end of file f = start of f+1 minus its eos
        self.ends = np.append(self.starts[1:], len(self.ids)) - 1

    @classmethod
    def from_files(cls, tokens_dir: str | Path, split: str) -> TokenSource:
        d = Path(tokens_dir)
        ids = np.memmap(d / f"{split}.bin", dtype=np.uint16, mode="r")
        starts = np.load(d / f"{split}.idx.npy")
        return cls(ids, starts)

    @classmethod
    def from_token_lists(cls, files: list[list[int]], eos: int) -> TokenSource:
        starts, flat = [], []
        for f in files:
            starts.append(len(flat))
            flat.extend(f)
            flat.append(eos)
        return cls(np.asarray(flat, dtype=np.uint16), np.asarray(starts, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.ids)

    def file_of(self, pos: int) -> int:
        return int(np.searchsorted(self.starts, pos, side="right") - 1)


@dataclass
class Batch:
    """input_ids, targets [B, T] int64; attention_mask [B, T] bool; weights [B, T]
    float32 (``1/(t N)`` on masked targets, else 0); kind [B] (0 plain, 1 FIM); t [B]."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    kind: np.ndarray
    t: np.ndarray
    n_real: int = 0  # real (non-padding) tokens in the batch

    def torch(self, device: Any = "cpu") -> dict[str, Any]:
        return {
            "input_ids": torch.from_numpy(self.input_ids).to(device),
            "attention_mask": torch.from_numpy(self.attention_mask).to(device),
            "targets": torch.from_numpy(self.targets).to(device),
            "weights": torch.from_numpy(self.weights).to(device),
            "kind": torch.from_numpy(self.kind).to(device),
        }


@dataclass
class Row:
    ids: list[int]  # canvas before masking
    target_pos: np.ndarray  # positions that are targets
    kind: int
    hole: tuple[int, int] = (0, 0)  # FIM: [start, end) of the hole in ids
    middle_len: int = 0
    info: dict[str, Any] = field(default_factory=dict)


def _indent_end(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _content_end(line: str) -> int:
    return len(line.rstrip("\r\n"))


def _repeated_lines(lines: list[str], cands: list[int], min_chars: int, max_dist: int) -> list[int]:
    """The candidate line indices whose stripped text (at least ``min_chars`` characters)
    occurs again, stripped, on another line at most ``max_dist`` lines away."""
    where: dict[str, list[int]] = {}
    for k, line in enumerate(lines):
        key = line.strip()
        if len(key) >= min_chars:
            where.setdefault(key, []).append(k)
    out = []
    for i in cands:
        others = where.get(lines[i].strip(), ())
        if any(k != i and abs(k - i) <= max_dist for k in others):
            out.append(i)
    return out


class BatchMaker:
    """Makes batches from a :class:`TokenSource`; all randomness from ``self.rng``."""

    def __init__(
        self,
        source: TokenSource,
        tokenizer: HFTokenizer,
        cfg: DataConfig,
        batch_size: int,
        seed: int = 0,
    ) -> None:
        self.src = source
        self.tok = tokenizer
        self.cfg = cfg
        self.batch_size = batch_size
        self.sp = Specials.from_tokenizer(tokenizer)
        self.rng = np.random.default_rng(seed)

    # -- state for checkpoint/resume -------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return self.rng.bit_generator.state

    def set_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state

    # -- rows -------------------------------------------------------------------------------
    def plain_row(self) -> Row:
        T = self.cfg.seq_len
        n = len(self.src)
        if n <= T:
            ids = [int(x) for x in self.src.ids] + [self.sp.eos] * (T - n)
        else:
            s = int(self.rng.integers(0, n - T + 1))
            ids = self.src.ids[s : s + T].astype(np.int64).tolist()
        return Row(ids=ids, target_pos=np.arange(T), kind=PLAIN)

    def _encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def _pick_span(self, text: str, lo_line: int, hi_line: int, lines: list[str]) -> tuple[int, int, str]:
        """(cursor, middle end) character offsets in ``text`` and the case name."""
        rng, c = self.rng, self.cfg
        offs = np.cumsum([0] + [len(x) for x in lines])
        cands = [i for i in range(lo_line, hi_line) if lines[i].strip()]
        if not cands:
            cands = list(range(lo_line, hi_line))
        copy = ""
        if c.p_copy_line > 0 and rng.random() < c.p_copy_line:
            repeated = _repeated_lines(lines, cands, c.copy_min_chars, c.copy_max_lines)
            if repeated:
                cands, copy = repeated, "+copy"
        i = int(cands[int(rng.integers(len(cands)))])
        line = lines[i]
        ind, cend = _indent_end(line), _content_end(line)
        if rng.random() < c.p_empty:
            a = int(offs[i]) + cend
            return a, a, "empty" + copy
        k = 1 + int(rng.choice(c.max_middle_lines, p=np.asarray(c.line_count_probs)))
        j = min(i + k - 1, hi_line - 1)
        # cursor
        if cend > ind + 1 and rng.random() < c.p_midline:
            col = int(rng.integers(ind + 1, cend))
            case = "midline"
        elif rng.random() < c.p_after_indent:
            col, case = ind, "indent"
        else:
            col, case = 0, "linestart"
        a = int(offs[i]) + col
        # end of the middle: end of line j's content, or inside it
        last = lines[j]
        end_col = _content_end(last)
        lo = (col + 1) if j == i else 1
        if end_col > lo and rng.random() < c.p_end_midline:
            end_col = int(rng.integers(lo, end_col))
            case += "+endmid"
        b = int(offs[j]) + end_col
        return a, max(a, b), case + copy

    def fim_row(self) -> Row:
        c, rng, src = self.cfg, self.rng, self.src
        T = c.seq_len
        n_max = max(c.hole_buckets)
        for _attempt in range(20):
            pos = int(rng.integers(0, len(src)))
            f = src.file_of(pos)
            fs, fe = int(src.starts[f]), int(src.ends[f])
            if fe - fs < 2:
                continue
            pos = min(max(pos, fs), fe - 1)
            w0, w1 = max(fs, pos - T), min(fe, pos + T)
            text = self.tok.decode(src.ids[w0:w1].astype(np.int64).tolist(), skip_special_tokens=False)
            lines = text.splitlines(keepends=True)
            if not lines:
                continue
            lo_line = 1 if (w0 > fs and len(lines) > 1) else 0
            hi_line = len(lines) - 1 if (w1 < fe and len(lines) - 1 > lo_line) else len(lines)
            a, b, case = self._pick_span(text, lo_line, hi_line, lines)
            pre, mid, suf = self._encode(text[:a]), self._encode(text[a:b]), self._encode(text[b:])
            m = len(mid)
            if m > n_max:
                continue
            buckets = [n for n in c.hole_buckets if n >= max(m, 1)]
            if rng.random() < c.p_tight_hole:
                n = int(buckets[0])
            else:
                n = int(buckets[int(rng.integers(len(buckets)))])
            budget = T - n - 2
            if rng.random() < c.p_short_context:
                budget = int(rng.integers(min(16, budget), budget + 1))
            frac = float(rng.uniform(0.5, 0.95))
            P = min(len(pre), max(budget - len(suf), int(round(frac * budget))))
            S = min(len(suf), budget - P)
            pre_k = pre[len(pre) - P :] if P > 0 else []
            ids = [self.sp.bos, *pre_k, *mid, *([self.sp.pad] * (n - m)), *suf[:S], self.sp.eos]
            h0 = 1 + len(pre_k)
            return Row(
                ids=ids,
                target_pos=np.arange(h0, h0 + n),
                kind=FIM,
                hole=(h0, h0 + n),
                middle_len=m,
                info={"case": case},
            )
        # fallback: an empty middle at the end of a random window
        s = int(rng.integers(0, max(1, len(src) - T)))
        pre = [int(x) for x in src.ids[s : s + T // 2] if int(x) != self.sp.eos]
        n = int(c.hole_buckets[0])
        ids = [self.sp.bos, *pre, *([self.sp.pad] * n), self.sp.eos]
        h0 = 1 + len(pre)
        return Row(ids=ids, target_pos=np.arange(h0, h0 + n), kind=FIM, hole=(h0, h0 + n),
                   info={"case": "fallback"})

    # -- batches ----------------------------------------------------------------------------
    def stratified_t(self, B: int) -> np.ndarray:
        eps = self.cfg.t_eps
        u = float(self.rng.random())
        t = eps + (1.0 - eps) * ((u + np.arange(B) / B) % 1.0)
        return self.rng.permutation(t)

    def rows(self) -> list[Row]:
        kinds = self.rng.random(self.batch_size) < self.cfg.fim_ratio
        return [self.fim_row() if k else self.plain_row() for k in kinds]

    def next_batch(self) -> Batch:
        return self.collate(self.rows(), self.stratified_t(self.batch_size))

    def collate(self, rows: list[Row], t: np.ndarray) -> Batch:
        """Mask each row's targets with probability t (at least one) and pad rows."""
        B = len(rows)
        t = np.array(t, dtype=np.float64)
        T = max(len(r.ids) for r in rows)
        inp = np.full((B, T), self.sp.pad, dtype=np.int64)
        tgt = np.full((B, T), self.sp.pad, dtype=np.int64)
        att = np.zeros((B, T), dtype=bool)
        w = np.zeros((B, T), dtype=np.float32)
        kind = np.zeros(B, dtype=np.int64)
        n_real = 0
        for b, r in enumerate(rows):
            L = len(r.ids)
            ids = np.asarray(r.ids, dtype=np.int64)
            inp[b, :L] = ids
            tgt[b, :L] = ids
            att[b, :L] = True
            n_real += L
            kind[b] = r.kind
            N = len(r.target_pos)
            tb = max(float(t[b]), 1.0 / N)  # floor: at least one masked token expected
            t[b] = tb
            m = self.rng.random(N) < tb
            if not m.any():
                m[int(self.rng.integers(N))] = True
            pos = r.target_pos[m]
            inp[b, pos] = self.sp.mask
            w[b, pos] = 1.0 / (tb * N)
        return Batch(inp, att, tgt, w, kind, t.astype(np.float32), n_real)


def heldout_batches(
    source: TokenSource, tokenizer: HFTokenizer, cfg: DataConfig, batch_size: int, n_batches: int,
    seed: int = 1234,
) -> list[Batch]:
    """A fixed list of validation batches (same examples and masks at every evaluation)."""
    bm = BatchMaker(source, tokenizer, cfg, batch_size, seed=seed)
    return [bm.next_batch() for _ in range(n_batches)]


def _worker_main(source: TokenSource, tok_json: str, cfg: DataConfig, batch_size: int, seed: int,
                 queue: Any) -> None:
    """A batch-producing process (see :class:`BatchStream`)."""
    bm = BatchMaker(source, HFTokenizer.from_str(tok_json), cfg, batch_size, seed=seed)
    while True:
        queue.put(bm.next_batch())


class BatchStream:
    """Batches made by ``workers`` processes, for devices that train faster than one
    Python process can cut FIM canvases (an H200 on a 20M model wants millions of
    tokens/s; one process makes ~0.3-0.5M).

    Worker ``i`` runs its own :class:`BatchMaker` seeded from ``(seed, start_step, i)``
    and the stream takes one batch from each worker in turn, so the stream is a pure
    function of ``(seed, start_step, workers)``. A run resumed at step ``s`` gets a
    fresh stream seeded with ``s`` (the exact-resume guarantee holds only in-process,
    ``workers=0``).
    """

    def __init__(self, source: TokenSource, tokenizer: HFTokenizer, cfg: DataConfig,
                 batch_size: int, *, seed: int, start_step: int, workers: int,
                 prefetch: int = 4) -> None:
        if workers < 1:
            raise ValueError("BatchStream needs at least one worker")
        ctx = mp.get_context("fork")
        tok_json = tokenizer.to_str()
        self._queues = [ctx.Queue(maxsize=prefetch) for _ in range(workers)]
        self._procs = []
        for i, q in enumerate(self._queues):
            wseed = int(np.random.SeedSequence([seed, start_step, i]).generate_state(1)[0])
            p = ctx.Process(target=_worker_main, args=(source, tok_json, cfg, batch_size, wseed, q),
                            daemon=True, name=f"diffill-batches-{i}")
            p.start()
            self._procs.append(p)
        self._next = 0

    def next_batch(self, timeout: float = 300.0) -> Batch:
        q = self._queues[self._next]
        self._next = (self._next + 1) % len(self._queues)
        return q.get(timeout=timeout)

    def close(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout=5)
        for q in self._queues:
            q.cancel_join_thread()
            q.close()
        self._procs = []

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
