"""User-facing completion options: one msgspec Struct, camelCase on the wire.

Options arrive from ``initializationOptions`` and ``workspace/didChangeConfiguration``
(either at top level or under a ``"diffill"`` key). :func:`merge_options` validates
them one field at a time, so a single bad value is reported by name and only that
field keeps its previous (or default) value; every good field is still applied.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ...model.limits import DEFAULT_MAX_STEPS, RECIPE_NAMES

MultilinePolicy = Literal["auto", "always-single", "always-multi"]
RecipeName = Literal[RECIPE_NAMES]  # type: ignore[valid-type]
"""Family infilling recipes (``diffill.model.limits.RECIPE_NAMES``)."""
BackendName = Literal["local", "openai"]
WeightsName = Literal["auto", "fp32", "int8", "bf16"]
ContextName = Literal["auto", "request", "row"]
"""``local``: the model in this process; ``openai``: an OpenAI-compatible
``/v1/completions`` endpoint (``diffill serve-http``, vLLM, SGLang; :mod:`.remote`)."""


class CompletionOptions(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Everything the user can set. Wire names are camelCase (``modelPath``, ...)."""

    enabled: bool = True
    """Completions on or off (``:DiffillToggle``, ``M-x diffill-toggle``, VS Code's status bar
    item switch it); off, the server answers every request with nothing."""
    backend: BackendName = "local"
    """Where completions come from: ``local`` (the model in the server's process) or
    ``openai`` (an OpenAI-compatible ``/v1/completions`` endpoint, the ``remote*`` options)."""
    model_path: str | None = None
    """Checkpoint folder, or the name of a checkpoint fetched with ``diffill pull``;
    ``None`` = the shipped default model."""
    recipe: RecipeName | None = None
    """Family infilling recipe to use instead of the one chosen from the checkpoint
    (canvas start/end tokens, the tokens that end a middle); ``None`` = chosen by the loader."""
    device: str = "cpu"
    """Torch device string: ``cpu``, ``cuda``, ``cuda:1``, ... (``auto`` = cuda when available)."""
    weights: WeightsName = "auto"
    """How the local model holds its weights: ``fp32``, ``int8`` (per-channel int8 matmuls on a
    CPU: ~1.6-2.5x faster steps of a 0.5B model, half the memory), ``bf16`` (the whole model in
    bfloat16 on a CPU, a bf16 checkpoint mapped, not copied: fast on CPUs with AMX, slow
    without) or ``auto`` (int8 on a CPU for models of 100M parameters or more, the checkpoint's
    own otherwise; ``diffill.model.quant``). ``DIFFILL_WEIGHTS`` sets the same for a process."""
    context: ContextName = "auto"
    """The prefix/suffix keys and values computed once per ``request`` (shared by its candidate
    and draft rows: the longest row is exact, shorter ones an approximation) or once per canvas
    ``row`` (exact); ``auto``: per request on a CPU, per row on a GPU (``diffill.model.cache``).
    ``DIFFILL_CONTEXT`` sets the same for a process."""
    latency_budget_ms: Annotated[float, Meta(gt=0, le=60_000)] | None = None
    """Target model time per request; the local engine's step plan picks the step count to
    fit it. ``None``: the device's default (``diffill.model.limits.DEFAULT_BUDGET_MS``: 25 ms
    on a GPU, 200 ms on a CPU)."""
    steps: Annotated[int, Meta(ge=1, le=512)] | None = None
    """Fixed number of refinement steps; ``None`` = chosen from ``latencyBudgetMs``."""
    max_steps: Annotated[int, Meta(ge=1, le=512)] = DEFAULT_MAX_STEPS
    """Upper bound when the step count is chosen from the latency budget."""
    max_tokens: Annotated[int, Meta(ge=1, le=1024)] = 32
    """Longest middle to generate, in model tokens."""
    context_tokens: Annotated[int, Meta(ge=16, le=131_072)] = 1024
    """Token budget for prefix + suffix (+ extra context)."""
    prefix_fraction: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.75
    """Share of ``contextTokens`` for the prefix; the rest goes to the suffix."""
    multiline: MultilinePolicy = "auto"
    """``auto``: several lines only when the cursor is at the end of its line."""
    num_candidates: Annotated[int, Meta(ge=1, le=16)] = 3
    """Candidates returned for an explicitly invoked completion (cycling)."""
    token_healing: bool = True
    """Mid-word cursor: the model fills from the start of the word, and only candidates that
    reproduce the typed part are kept (a BPE model never saw the half-word as a prefix)."""
    drafts: bool = True
    """Draft and verify: candidate middles copied from the code around the cursor (an
    earlier match of the text before and after it, in this buffer and the other open ones;
    the next line by analogy with a similar earlier line; an earlier suggestion) go into the
    model's batch and are checked in its first step; a verified one answers after that one
    step (``lsp_server/drafting/drafts.py``, ``model/decoder/``). Off: the model alone."""
    syntax_check: bool = True
    """Drop suggestions that add a syntax error where they land when the code there had none
    (opening a block at the end of a body is allowed): Python by ``ast``, the languages with a
    tree-sitter grammar by their tree (``lsp_server/syntax.py``, ``lsp_server/treesitter.py``)."""
    extra_context: bool = False
    """Add a commented header with snippets of other open documents (inside the budget)."""
    extra_context_fraction: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.15
    """Share of the prefix budget that extra context may use (more when the prefix window
    leaves room: near the top of a file; ``lsp_server/context.py``, *Extra context*)."""
    workspace_index: bool = True
    """Index the text files under the workspace folders, in memory (``.gitignore`` honoured;
    vendored, generated and binary files skipped; ``lsp_server/workspace.py``) for the
    workspace drafts and context below. Nothing is written to disk or sent anywhere."""
    workspace_max_files: Annotated[int, Meta(ge=0, le=200_000)] = 10_000
    """Most files the workspace index holds (the rest is left out and counted)."""
    workspace_max_mb: Annotated[int, Meta(ge=1, le=4096)] = 100
    """Most text the workspace index holds, in millions of characters (kept compressed)."""
    workspace_drafts: bool = True
    """Draft sources (prompt lookup, suffix lookup) also search the workspace chunks most
    like the code at the cursor, ranked after the buffer's own matches."""
    workspace_context: bool = False
    """Header: chunks of workspace files most like the code at the cursor (BM25)."""
    definitions_context: bool = False
    """Header: the definitions (signatures, first docstring lines) of the imported names used
    near the cursor, found in the workspace (Python)."""
    recent_context: bool = False
    """Header: regions recently edited or visited in other documents (a ring of 16)."""
    # -- backend "openai" (see lsp_server/remote.py) --
    remote_url: Annotated[str, Meta(pattern=r"^https?://")] = "http://127.0.0.1:8000/v1"
    """Base URL of the OpenAI-compatible endpoint (``.../v1``)."""
    remote_model: str | None = None
    """``model`` field sent to the endpoint (None: the server's default)."""
    api_key_env: Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "DIFFILL_API_KEY"
    """Name of the environment variable holding the API key (the key itself is never a setting)."""
    remote_timeout_ms: Annotated[float, Meta(gt=0, le=600_000)] = 10_000.0
    """Time allowed for one attempt (connect and answer); a whole request, retries and
    back-off included, gets at most three times this (``lsp_server/remote.py``)."""
    remote_retries: Annotated[int, Meta(ge=0, le=10)] = 2
    """Retries after a connection error, a timeout, 408, 429 or 5xx, with exponential back-off."""


WIRE_NAMES: dict[str, str] = {
    f.encode_name: f.name for f in msgspec.structs.fields(CompletionOptions)
}
"""camelCase wire name -> Python field name."""


def extract_settings(raw: Any) -> dict[str, Any]:
    """Pick diffill's settings out of initializationOptions / didChangeConfiguration
    ``settings``: either ``{"diffill": {...}}`` or the options at top level."""
    if not isinstance(raw, dict):
        return {}
    inner = raw.get("diffill")
    if isinstance(inner, dict):
        return inner
    return {k: v for k, v in raw.items() if k in WIRE_NAMES}


def merge_options(
    previous: CompletionOptions, raw: dict[str, Any]
) -> tuple[CompletionOptions, list[str]]:
    """Apply the settings in ``raw`` (wire names) on top of ``previous``.

    Each field is validated on its own: a bad value leaves that field at its previous
    value and adds an error naming it. Unknown keys are reported too (as errors the
    caller may show as warnings). Returns ``(options, errors)``.
    """
    errors: list[str] = []
    current = msgspec.to_builtins(previous)
    for key, value in raw.items():
        if key not in WIRE_NAMES:
            errors.append(f"diffill: unknown option {key!r} ignored")
            continue
        why = _invalid(current, key, value)
        if why is not None:
            errors.append(f"diffill: invalid value for option {key!r}: {why}; kept {current.get(key)!r}")
            continue
        current = {**current, key: value}
    return msgspec.convert(current, CompletionOptions), errors


FLAG_OVERRIDES = {"modelPath": "--model"}


def flag_errors(raw: dict[str, Any]) -> list[str]:
    """Each invalid value of ``raw`` (wire names) as a command line says it, one per option,
    naming the flag: ``--steps 0: expected `int` >= 1`` (the commands' own errors; an
    editor's settings get :func:`merge_options`'s, which say what was kept)."""
    base = msgspec.to_builtins(CompletionOptions())
    out = []
    for key, value in raw.items():
        flag = FLAG_OVERRIDES.get(key) or "--" + WIRE_NAMES.get(key, key).replace("_", "-")
        why = _invalid(base, key, value)
        if why is not None:
            out.append(f"{flag} {value}: {why[:1].lower()}{why[1:]}")
    return out


def _invalid(current: dict[str, Any], key: str, value: Any) -> str | None:
    """Why ``value`` cannot be option ``key`` on top of ``current`` (wire-named builtins);
    None when it can. The one validation of a single option."""
    try:
        msgspec.convert({**current, key: value}, CompletionOptions)
    except msgspec.ValidationError as e:
        return _short(e, key)
    return None


def _short(e: msgspec.ValidationError, key: str) -> str:
    msg = str(e)
    return msg.replace(f" - at `$.{key}`", "")


def options_from(raw: Any, previous: CompletionOptions | None = None) -> tuple[CompletionOptions, list[str]]:
    """Convenience: extract diffill settings from ``raw`` and merge onto ``previous``."""
    return merge_options(previous or CompletionOptions(), extract_settings(raw))
