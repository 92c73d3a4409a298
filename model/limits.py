"""The facts the text side shares with the model, torch-free: step counts, the draft count,
the default latency budgets and the recipe names. The language server's options, its CLI
and its draft sources import them from here at ``initialize`` (``import
diffill.model.limits`` imports no torch; a test holds it), so each is written once.

The recipe names are the recipe table's own (:data:`.recipes.RECIPE_NAMES`, read from its
rows); they are listed here so that the text side finds every shared name in one module.
"""

from __future__ import annotations

from .recipes import RECIPE_NAMES

DEFAULT_STEPS = 8
"""Refinement steps of a request that names none and has no step plan to read them from
(``SamplerConfig.steps``; :mod:`.plan` module doc)."""

DEFAULT_MAX_STEPS = 16
"""The most steps the step plan gives a request (``maxSteps`` on the server's side)."""

MAX_DRAFTS = 4
"""Drafts verified per request at most (each takes a row of the batch); the server's draft
sources propose at most this many."""

DEFAULT_BUDGET_MS: dict[str, float] = {"cuda": 25.0, "cpu": 200.0}
"""The latency budget when none is set, by torch device type (docs/step-budget.md)."""

__all__ = ["DEFAULT_BUDGET_MS", "DEFAULT_MAX_STEPS", "DEFAULT_STEPS", "MAX_DRAFTS", "RECIPE_NAMES"]
