"""The engine's shape buckets and CUDA graphs: a batch's canvases padded up to bucket sizes
(:func:`bucket_shape`, ``EngineOptions.buckets``) so that shapes repeat, and each bucket's
denoising step captured once as a CUDA graph and replayed (:class:`StepGraphs`,
``EngineOptions.cuda_graphs``, greedy requests), with no host synchronisation inside the step
loop. The engine keeps one :class:`StepGraphs` per padded shape, the decode loop's stepper
for a batch of that shape.
"""

from __future__ import annotations

from typing import Any

import torch

from .cache import ONCE, DualCache
from .decoder.canvas import Canvas, DenoiseState, initial_state
from .decoder.spec import StepSpec
from .decoder.step import DraftRows, denoise_step
from .plan import CTX_BUCKETS, HOLE_BUCKETS, bucket

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket_shape(L: int, T: int, N: int) -> tuple[int, int, int]:
    """A batch's shape [L rows, T columns, N slots] rounded up to its buckets: rows to
    :data:`ROW_BUCKETS`, the hole to :data:`~.plan.HOLE_BUCKETS`, the rest of the canvas to
    :data:`~.plan.CTX_BUCKETS`."""
    Nb = bucket(N, HOLE_BUCKETS)
    return bucket(L, ROW_BUCKETS), bucket(T - N, CTX_BUCKETS) + Nb, Nb


class StepGraphs:
    """CUDA graphs of one denoising step for one padded shape [L, T] with N slots: the
    decode loop's :class:`~diffill.model.decoder.loop.Stepper` under ``cuda_graphs``.

    Static buffers hold the canvas and the loop state; each graph runs a step and
    writes the new state back into them (and decrements ``steps_left``), so a
    replay needs no host work. With the dual cache there are two graphs: the
    refresh step (full forward; its context keys/values stay in graph memory) and
    the cached step reading them. Shapes never change, so a cancelled request's
    rows are frozen (nothing left masked) instead of dropped.

    ``capture=False`` (CPU) runs the same static-buffer step eagerly, which is how
    the tests check this loop without a GPU.
    """

    def __init__(self, model: Any, cv: Canvas, spec: StepSpec, refresh_every: int,
                 pool: Any, *, capture: bool = True) -> None:
        self.model, self.spec, self.pool = model, spec, pool
        self.refresh_every = refresh_every
        self.cv = Canvas(*(t.clone() for t in cv))
        self.state = initial_state(self.cv)
        self.steps_left = torch.ones((cv.ids.shape[0],), dtype=torch.long, device=cv.ids.device)
        self.cache = (DualCache(model, self.cv, shift=spec.shift, refresh_every=ONCE)
                      if refresh_every > 1 else None)
        self.graphs: dict[bool, Any] = {}
        self.capture = capture

    def load(self, cv: Canvas, state: DenoiseState) -> None:
        for dst, src in zip(self.cv, cv, strict=True):
            dst.copy_(src)
        for dst, src in zip(self.state, state, strict=True):
            dst.copy_(src)
        self.steps_left.fill_(self.spec.total_steps)
        if self.cache is not None:
            self.cache.rebind(self.cv)

    # -- Stepper ---------------------------------------------------------------------------
    def step(self, canvas: Canvas, state: DenoiseState, s: int,
             noise: torch.Tensor | None, draft: DraftRows | None = None) -> DenoiseState:
        """Step ``s`` on the static buffers (``canvas`` / ``state`` are what :meth:`load`
        copied in; greedy only, so no noise). A verification step (``draft``) runs eagerly
        on the same buffers: it comes once per batch, and capturing it would double the
        graphs."""
        refresh = self.cache is None or s % self.refresh_every == 0
        if draft is not None or not self.capture:
            self._body(refresh, draft)
        else:
            if not self.graphs:
                self._capture()
            self.graphs[refresh].replay()
        return self.state

    def drop(self, canvas: Canvas, state: DenoiseState,
             keep: list[int]) -> tuple[Canvas, DenoiseState, list[int]]:
        """Freeze the rows not in ``keep`` (nothing left masked); every row stays."""
        kept = set(keep)
        gone = [r for r in range(self.state.masked.shape[0]) if r not in kept]
        if gone:
            self.state.masked[torch.tensor(gone, device=self.state.masked.device)] = False
        return canvas, self.state, list(range(self.state.masked.shape[0]))

    # -- graphs ----------------------------------------------------------------------------
    def _body(self, refresh: bool, draft: DraftRows | None = None) -> None:
        fwd: Any = self.model
        if self.cache is not None:
            self.cache.force_refresh = refresh
            fwd = self.cache
        new = denoise_step(fwd, self.cv, self.state, self.steps_left, self.spec, None, draft)
        for dst, src in zip(self.state, new, strict=True):
            dst.copy_(src)
        self.steps_left.sub_(1)

    def _capture(self) -> None:
        kinds = [True] if self.cache is None else [True, False]
        saved = [t.clone() for t in self.state] + [self.steps_left.clone()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: allocator, cuBLAS and Triton state
            for refresh in kinds:
                for _ in range(2):
                    self._body(refresh)
        torch.cuda.current_stream().wait_stream(side)
        for refresh in kinds:  # the refresh graph first: its kv outputs feed the cached one
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self._body(refresh)
            self.graphs[refresh] = g
        for dst, src in zip([*self.state, self.steps_left], saved, strict=True):
            dst.copy_(src)
