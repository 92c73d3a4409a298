"""The resident inference engine (v0).

One :class:`Engine` holds a loaded model for the lifetime of the process and
serves infill requests from any thread; a lock serialises them (one forward at a
time on the device). v0 runs each request on its own through
:func:`diffill.model.sampler.infill`; the structure leaves room for what comes
next -- shape buckets, a step budget measured at start-up, batching several
requests, prefix/suffix KV reuse, CUDA graphs -- behind the ``_run`` seam,
which receives a list of requests and returns one result list per request.

Candidate hole lengths. When the caller gives none, ``max_tokens`` is turned
into ``(max_tokens // 4, max_tokens // 2, max_tokens)`` (values < 1 dropped,
duplicates removed). Because pads inside the hole are trimmed, a candidate
length is only an upper bound on the middle; three geometrically spaced bounds
cover a short completion (a few tokens), a line and a small block at a batch of
three rows, and the sampler ranks them by the model's own score. The hole never
exceeds ``max_tokens``, so neither does the middle.

Context trimming is the caller's job: the engine truncates nothing and raises
``ValueError`` when the longest canvas exceeds ``cfg.max_position_embeddings``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .sampler import (
    Infill,
    InfillCancelled,
    SamplerConfig,
    candidate_lengths,
    canvas_length,
    infill,
)

if TYPE_CHECKING:  # the loader imports torch-heavy modules; only the type is needed here
    from .loader import LoadedModel


def default_lengths(max_tokens: int) -> tuple[int, ...]:
    """Candidate hole lengths for a token budget (see module doc)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    return tuple(
        candidate_lengths([n for n in (max_tokens // 4, max_tokens // 2, max_tokens) if n >= 1])
    )


@dataclass
class InfillRequest:
    """One request as the engine sees it (the unit a batching engine will group)."""

    prefix_ids: list[int]
    suffix_ids: list[int]
    sampler: SamplerConfig
    cancel: Callable[[], bool] | None = None


class Engine:
    """Resident, thread-safe infill engine over a :class:`LoadedModel`."""

    def __init__(
        self, lm: LoadedModel, sampler: SamplerConfig | None = None, *, history: int = 64
    ) -> None:
        self.lm = lm
        self.sampler = sampler if sampler is not None else SamplerConfig()
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=history)
        self._requests = 0
        self._completed = 0
        self._cancelled = 0
        self._failed = 0
        model = self.model
        if hasattr(model, "eval"):
            model.eval()

    # -- properties ----------------------------------------------------------------------
    @property
    def model(self) -> Any:
        return self.lm.model

    @property
    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    @property
    def config(self) -> Any:
        return self.lm.config

    @property
    def device(self) -> torch.device:
        dev = getattr(self.lm, "device", None)
        if dev is not None:
            return torch.device(dev)
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        dt = getattr(self.lm, "dtype", None)
        if isinstance(dt, torch.dtype):
            return dt
        for p in self.model.parameters():
            return p.dtype
        return torch.float32

    # -- requests ------------------------------------------------------------------------
    def make_request(
        self,
        prefix_ids: list[int],
        suffix_ids: list[int],
        *,
        max_tokens: int = 32,
        lengths: tuple[int, ...] | None = None,
        steps: int | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> InfillRequest:
        """Validate and resolve defaults; raises ValueError for a bad request."""
        lens = (
            tuple(candidate_lengths(lengths))
            if lengths is not None
            else default_lengths(max_tokens)
        )
        changes: dict[str, Any] = {"lengths": lens}
        if steps is not None:
            changes["steps"] = int(steps)
        sc = dataclasses.replace(self.sampler, **changes)
        cfg = self.config
        total = canvas_length(cfg, len(prefix_ids), len(suffix_ids), max(lens))
        if total > cfg.max_position_embeddings:
            raise ValueError(
                f"canvas of {total} tokens (prefix {len(prefix_ids)}, hole {max(lens)}, suffix "
                f"{len(suffix_ids)}) exceeds max_position_embeddings={cfg.max_position_embeddings}; "
                "trim the context"
            )
        return InfillRequest(list(prefix_ids), list(suffix_ids), sc, cancel)

    def infill(
        self,
        prefix_ids: list[int],
        suffix_ids: list[int],
        *,
        max_tokens: int = 32,
        lengths: tuple[int, ...] | None = None,
        steps: int | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> list[Infill]:
        """Fill the hole; candidates best first (see :mod:`diffill.model.sampler`).

        ``lengths`` (candidate hole lengths) overrides the ones derived from
        ``max_tokens``; ``steps`` overrides the engine's default step count.

        Raises ValueError (bad request, canvas too long) or
        :class:`~diffill.model.sampler.InfillCancelled`.
        """
        req = self.make_request(
            prefix_ids,
            suffix_ids,
            max_tokens=max_tokens,
            lengths=lengths,
            steps=steps,
            cancel=cancel,
        )
        return self.submit(req)

    def submit(self, req: InfillRequest) -> list[Infill]:
        with self._stats_lock:
            self._requests += 1
        outcome = "failed"
        t0 = time.perf_counter()
        try:
            with self._lock:
                if req.cancel is not None and req.cancel():
                    raise InfillCancelled("infill cancelled before it started")
                result = self._run([req])[0]
            outcome = "completed"
            return result
        except InfillCancelled:
            outcome = "cancelled"
            raise
        finally:
            dt = time.perf_counter() - t0
            with self._stats_lock:
                if outcome == "completed":
                    self._completed += 1
                    self._latencies.append(dt)
                elif outcome == "cancelled":
                    self._cancelled += 1
                else:
                    self._failed += 1

    def _run(self, batch: list[InfillRequest]) -> list[list[Infill]]:
        """Run requests (called with the lock held). v0: one sampler call each."""
        return [
            infill(self.model, self.config, r.prefix_ids, r.suffix_ids, r.sampler, r.cancel)
            for r in batch
        ]

    # -- stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Request counts and latencies (seconds) of recent completed requests."""
        with self._stats_lock:
            lat = list(self._latencies)
            return {
                "requests": self._requests,
                "completed": self._completed,
                "cancelled": self._cancelled,
                "failed": self._failed,
                "last_latency_s": lat[-1] if lat else None,
                "recent_latencies_s": lat,
                "mean_latency_s": sum(lat) / len(lat) if lat else None,
            }
