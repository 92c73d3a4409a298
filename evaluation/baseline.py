"""A non-neural baseline: *continue by analogy* (the successor of the most similar line,
re-indented; inside a line, the rest of an earlier line with the same start).

The rules live on the server side, :mod:`diffill.lsp_server.drafting.analogy`, where they are also a
draft source (:mod:`diffill.lsp_server.drafting.drafts`); this module re-exports them for the harness.
"""

from __future__ import annotations

from ..lsp_server.drafting.analogy import analogy_completion

__all__ = ["analogy_completion"]
