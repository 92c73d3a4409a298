"""The engine's options: :class:`EngineOptions`, the speed features an
:class:`~diffill.model.engine.Engine` runs with (batching across requests, the dual KV cache,
one context per request, reuse across keystrokes, the fused select-and-unmask, shape buckets
and CUDA graphs; what each does: :mod:`diffill.model.engine`), checked once when built, and
the environment variables that say what their ``'auto'`` means in a process (read by the
engine's properties, ``Engine.shared_context`` and the like).
"""

from __future__ import annotations

from dataclasses import dataclass

REFRESH_CONTEXT_ENV = "DIFFILL_REFRESH_CONTEXT"
"""``step`` / ``request``: what ``EngineOptions(refresh_context='auto')`` means in this process."""

REUSE_ENV = "DIFFILL_REUSE"
"""``on`` / ``off``: what ``EngineOptions(reuse='auto')`` means in this process (unset: on
where a request's context is shared)."""

CONTEXT_ENV = "DIFFILL_CONTEXT"
"""``request`` / ``row``: what ``EngineOptions(context='auto')`` means in this process (for a
side-by-side run of any command; unset: per request on a CPU)."""


@dataclass(frozen=True)
class EngineOptions:
    """Speed features (what each does: :mod:`diffill.model.engine`). The defaults are exact
    and safe everywhere, except ``context='auto'``, which on a CPU shares one context per
    request (an approximation, measured in BENCHMARKS.md, *One context per request*)."""

    batch: bool = True  # group concurrent requests into one forward per step
    batch_window_ms: float = 0.0  # extra wait for company before a batch starts
    max_batch_rows: int = 32  # canvas rows per batch (candidate lengths x requests)
    refresh_every: int = 1  # dual KV cache refresh period; 1 = no cache
    select_impl: str | None = None  # None: sampler torch step; 'auto' | 'triton' | 'torch': fused
    buckets: bool = False  # pad canvases to shape buckets (implied by cuda_graphs)
    cuda_graphs: bool = False  # capture and replay each bucket's step (CUDA, greedy only)
    #: prefix/suffix keys and values once per request ('request': cache.SharedContext) or
    #: once per canvas row ('row', exact); 'auto': per request on a CPU, per row elsewhere
    context: str = "auto"
    #: keep each document's context for its next request ('auto': where the context is
    #: shared, i.e. on a CPU, unless DIFFILL_REUSE=off; :mod:`diffill.model.reuse`), with
    #: at most ``reuse_far`` context tokens recomputed and ``reuse_full_every`` reuses in a row
    reuse: str = "auto"
    #: how often a shared context (one per request) is recomputed: every ``refresh_every``
    #: steps ('step'), or once, at the request's first step ('request'); 'auto': 'request'
    #: (unless DIFFILL_REFRESH_CONTEXT says 'step')
    refresh_context: str = "auto"
    reuse_far: int = 32
    reuse_full_every: int = 8
    reuse_documents: int = 4

    def __post_init__(self) -> None:
        if self.refresh_every < 1:
            raise ValueError(f"EngineOptions.refresh_every must be >= 1, got {self.refresh_every}")
        if self.max_batch_rows < 1:
            raise ValueError(f"EngineOptions.max_batch_rows must be >= 1, got {self.max_batch_rows}")
        if self.batch_window_ms < 0:
            raise ValueError("EngineOptions.batch_window_ms must be >= 0")
        if self.context not in ("auto", "request", "row"):
            raise ValueError(f"EngineOptions.context must be 'auto', 'request' or 'row', "
                             f"got {self.context!r}")
        if self.refresh_context not in ("auto", "step", "request"):
            raise ValueError(f"EngineOptions.refresh_context must be 'auto', 'step' or 'request', "
                             f"got {self.refresh_context!r}")
        if self.reuse not in ("auto", "on", "off"):
            raise ValueError(f"EngineOptions.reuse must be 'auto', 'on' or 'off', got {self.reuse!r}")
        if min(self.reuse_far, self.reuse_full_every, self.reuse_documents) < 0:
            raise ValueError("EngineOptions.reuse_far / reuse_full_every / reuse_documents must be >= 0")
        if self.select_impl not in (None, "auto", "triton", "torch"):
            raise ValueError(f"EngineOptions.select_impl must be None, 'auto', 'triton' or 'torch', "
                             f"got {self.select_impl!r}")
