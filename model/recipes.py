"""Family infilling recipes: how each published model wants its canvas.

The forward pass of every supported family is the same few tensors under other names
(:mod:`.weights`); what differs is *how the family's own code builds an infilling
canvas*: which tokens open and close it, which tokens end a middle, which token the
model was trained to write into unused slots, and the mask token. ``config.json``
does not say it reliably (DiffuCoder's config names ``<|endoftext|>`` as BOS, CoDA's
names no BOS/EOS at all), so the facts live here, one row per family and variant,
each row citing where it was read.

A row names tokens by their text (``"<|dlm_pad|>"``) or by a role the checkpoint
itself defines:

* ``@bos`` / ``@eos`` / ``@pad`` / ``@mask``: the token ``tokenizer_config.json`` names
  as ``bos_token`` / ``eos_token`` / ``pad_token`` / ``mask_token``, else the config's
  id, else the tokenizer's well-known names (the ids :class:`~.tokenizer.Tokenizer`
  resolved).

:func:`choose_recipe` picks the row from the checkpoint (``model_type``,
``architectures``, the added tokens its tokenizer carries) and says why;
:func:`resolve_recipe` turns the names into ids (:class:`CanvasRecipe`, kept on
:class:`~.config.ModelConfig` and read by the sampler through
:class:`~.decoder.spec.SpecialIds`). A user may name a row to override the choice.

The canvas a recipe builds for a hole of ``n`` slots::

    start + prefix + [mask] * n + suffix + end

(a ``shift_logits`` model whose ``start`` is empty and whose prefix is empty gets
``lead`` first, so that hole slot 0 has a position ``-1`` to be read from).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec


class RecipeError(ValueError):
    """A recipe that does not fit the checkpoint (unknown name, token not in the vocabulary)."""


class CanvasRecipe(msgspec.Struct, kw_only=True, frozen=True):
    """A recipe resolved to token ids for one checkpoint (what the sampler reads)."""

    name: str
    reason: str
    start: tuple[int, ...]
    end: tuple[int, ...]
    terminators: tuple[int, ...]  # ids that end a middle
    filler: int  # the token written into unused slots (and used for batch padding)
    mask: int
    lead: int | None = None  # first canvas token for a shift model with no start and no prefix
    expand: int | None = None  # DreamOn length control: this slot becomes two masks
    delete: int | None = None  # DreamOn length control: this slot is removed
    cross_file: str = "comment"  # how other files are shown before the prefix (Recipe.cross_file)

    @property
    def length_control(self) -> bool:
        return self.expand is not None and self.delete is not None


@dataclass(frozen=True)
class CheckpointFacts:
    """What the chooser looks at: config.json's identity and the tokenizer's added tokens."""

    model_type: str
    architectures: tuple[str, ...]
    added_tokens: frozenset[str]
    has_mask: bool  # the tokenizer or the config names a mask token


@dataclass(frozen=True)
class Recipe:
    """One row of the table. Token entries: text, a role (``@bos`` ...), or an id."""

    name: str
    family: str  # which checkpoints the row is for (shown by ``diffill info``)
    start: tuple[str | int, ...]
    end: tuple[str | int, ...]
    terminators: tuple[str | int, ...]
    filler: str | int
    mask: str | int = "@mask"
    lead: str | int | None = "@eos"
    expand: str | None = None
    delete: str | None = None
    optional_terminators: tuple[str, ...] = ()  # used when the vocabulary has them
    sources: tuple[str, ...] = ()
    note: str = ""
    cross_file: str = "comment"
    """How other files' text (the context header, ``lsp_server/text/context.py``) is written for
    this family: ``"comment"`` (a commented ``path:`` line before each file) or
    ``"qwen-repo"`` (Qwen2.5-Coder's repository-level pre-training format, for families
    adapted from Qwen2.5-Coder; used when the vocabulary has its tokens, see
    :data:`QWEN_REPO_TOKENS`)."""


QWEN_REPO_TOKENS = ("<|repo_name|>", "<|file_sep|>")
QWEN_REPO_SOURCE = (
    "arXiv 2409.12186 (Qwen2.5-Coder Technical Report) section 3.1.2 and "
    "github.com/QwenLM/Qwen2.5-Coder README (repository-level code completion): "
    "<|repo_name|>name, then <|file_sep|>path + newline + content per file"
)


# --------------------------------------------------------------------------- the table

RECIPES: tuple[Recipe, ...] = (
    Recipe(
        name="dreamon",
        family="DreamOn 7B (Dream-Coder + <|expand|>/<|delete|>)",
        start=("@bos",),
        end=("@eos",),
        terminators=("@eos",),
        optional_terminators=("<|im_end|>",),
        filler="@pad",
        expand="<|expand|>",
        delete="<|delete|>",
        cross_file="qwen-repo",
        sources=(
            QWEN_REPO_SOURCE + " (Dream-Coder, which DreamOn extends, is adapted from Qwen2.5-Coder 7B)",
            "github.com/DreamLM/DreamOn readme.md (process_infilling_prompt: "
            "[tokenizer.bos_token_id] + prefix + [mask]*n + suffix + [tokenizer.eos_token_id])",
            "arXiv 2602.01326 (DreamOn): <|expand|> becomes two masks, <|delete|> is removed",
            "hkunlp.github.io/blog/2025/dream-coder: the two special tokens <|expand|>, <|delete|>",
        ),
        note="expand/delete decoding (model/decoder/dreamon.py) grows or shrinks the hole",
    ),
    Recipe(
        name="diffucoder-instruct",
        family="DiffuCoder 7B Instruct / cpGRPO",
        start=("@bos",),
        end=("@eos",),
        terminators=("<|dlm_pad|>", "@eos"),
        optional_terminators=("<|im_end|>",),
        filler="<|dlm_pad|>",
        cross_file="qwen-repo",
        sources=(
            QWEN_REPO_SOURCE + " (DiffuCoder is adapted from Qwen2.5-Coder 7B, arXiv 2506.20639)",
            "huggingface.co/apple/DiffuCoder-7B-Instruct config.json: pad = eos = bos = 151643, "
            "mask 151666",
            "huggingface.co/apple/DiffuCoder-7B-cpGRPO model card (usage: output split at "
            "'<|dlm_pad|>'); github.com/apple/ml-diffucoder README: fixed-length training, "
            "unused slots filled with <|dlm_pad|>",
        ),
        note="config.json's pad/eos (151643) is not what the model writes after a middle",
    ),
    Recipe(
        name="dream",
        family="Dream 7B, Dream-Coder 7B, DiffuCoder 7B Base (model_type Dream)",
        start=("@bos",),
        end=("@eos",),
        terminators=("@eos", "@pad"),
        optional_terminators=("<|im_end|>",),
        filler="@pad",
        cross_file="qwen-repo",
        sources=(
            QWEN_REPO_SOURCE + " (Dream-Coder and DiffuCoder Base are adapted from Qwen2.5-Coder 7B)",
            "github.com/DreamLM/DreamOn readme.md: the Dream tokenizer's BOS first, EOS last",
            "hkunlp.github.io/blog/2025/dream-coder: [PAD] ends responses (random truncation, "
            "pad penalty)",
        ),
        note="the tokenizer's BOS (<|beginoftext|>), not config.json's bos_token_id",
    ),
    Recipe(
        name="open-dcoder",
        family="Open-dCoder 0.5B (Qwen2.5-Coder shape)",
        start=(),
        end=(),
        terminators=("@eos",),
        optional_terminators=("<|endoftext|>", "<|im_end|>"),
        filler="@eos",
        cross_file="qwen-repo",
        sources=(
            QWEN_REPO_SOURCE + " (Open-dCoder has Qwen2.5-Coder's shape and vocabulary)",
            "github.com/pengzhangzhi/Open-dLLM eval/eval_infill/eval_infill.py: prefix + "
            "[mask_token_id]*m + suffix (Qwen2 tokenizer adds no BOS), no EOS",
        ),
    ),
    Recipe(
        name="coda",
        family="CoDA 1.7B (Qwen3 shape)",
        start=(),
        end=(),
        terminators=("<|endoftext|>",),
        optional_terminators=("<|im_end|>",),
        filler="<|endoftext|>",
        lead="<|endoftext|>",
        sources=(
            "github.com/SalesforceAIResearch/CoDA CoDALanguageModel/modeling_coda.py: pre-training "
            "on plain token streams, no infilling recipe published; config.json has no bos/eos",
        ),
        note="no published FIM recipe: plain prefix/masks/suffix, <|endoftext|> ends a middle "
        "(never tokenizer_config's <|im_end|> at both ends)",
    ),
    Recipe(
        name="llada",
        family="LLaDA 8B Base / Instruct, LLaDA 1.5",
        start=("<|startoftext|>",),
        end=("<|endoftext|>",),
        terminators=("<|endoftext|>",),
        optional_terminators=("<|eot_id|>",),
        filler="<|endoftext|>",
        mask="@mask",
        sources=(
            "github.com/ML-GSAI/LLaDA README/generate.py: mask id 126336, <|startoftext|> BOS "
            "(126080), <|endoftext|> EOS (126081) pads SFT answers; Instruct ends a turn with "
            "<|eot_id|> (126348)",
        ),
    ),
    Recipe(
        name="diffill",
        family="diffill's own models (written by diffill train)",
        start=("@bos",),
        end=("@eos",),
        terminators=("@pad", "@eos"),
        filler="@pad",
        sources=("training/data.py: training canvas [BOS] prefix middle [PAD]* suffix [EOS]",),
    ),
    Recipe(
        name="generic",
        family="any other checkpoint: special tokens from config.json / tokenizer_config.json",
        start=("@bos?",),
        end=("@eos",),
        terminators=("@pad", "@eos"),
        filler="@pad",
        sources=("model/decoder/canvas.py (Canvas): without a family recipe, [BOS] prefix [MASK]*n suffix [EOS]",),
        note="no family recipe known; pass --recipe to use one",
    ),
)

BY_NAME: dict[str, Recipe] = {r.name: r for r in RECIPES}
RECIPE_NAMES: tuple[str, ...] = tuple(BY_NAME)


# --------------------------------------------------------------------------- choosing


def _qwen_vocab(f: CheckpointFacts) -> bool:
    """The tokenizer carries Qwen's special tokens (Qwen2 / Qwen2.5 / Qwen3 vocabularies)."""
    return {"<|endoftext|>", "<|im_end|>"} <= f.added_tokens


def _is_dream(f: CheckpointFacts) -> bool:
    return f.model_type == "dream" or "DreamModel" in f.architectures


_RULES: tuple[tuple[str, Callable[[CheckpointFacts], bool], str], ...] = (
    ("diffill", lambda f: f.model_type == "diffill", "model_type is diffill"),
    ("dreamon", lambda f: _is_dream(f) and {"<|expand|>", "<|delete|>"} <= f.added_tokens,
     "a Dream checkpoint whose tokenizer carries <|expand|> and <|delete|>"),
    ("diffucoder-instruct", lambda f: _is_dream(f) and "<|dlm_pad|>" in f.added_tokens,
     "a Dream checkpoint whose tokenizer carries <|dlm_pad|> (DiffuCoder Instruct / cpGRPO)"),
    ("dream", _is_dream, "model_type Dream / DreamModel"),
    ("llada", lambda f: (f.model_type.startswith("llada")
                         or any(a.startswith("LLaDA") for a in f.architectures))
     and {"<|startoftext|>", "<|endoftext|>"} <= f.added_tokens,
     "model_type / architecture LLaDA with LLaDA's tokenizer"),
    ("coda", lambda f: "CoDALanguageModel" in f.architectures or f.model_type == "coda"
     or (f.model_type == "qwen3" and f.has_mask and _qwen_vocab(f)),
     "CoDA (CoDALanguageModel, or a Qwen3-vocabulary checkpoint with a mask token)"),
    ("open-dcoder", lambda f: f.model_type == "qwen2" and f.has_mask and _qwen_vocab(f),
     "a Qwen2-vocabulary checkpoint with a mask token (Open-dCoder)"),
)


def choose_recipe(facts: CheckpointFacts, override: str | None = None) -> tuple[Recipe, str]:
    """The row for a checkpoint and why it was chosen. ``override`` names a row."""
    if override is not None:
        if override not in BY_NAME:
            raise RecipeError(
                f"unknown recipe {override!r}; known recipes: {', '.join(RECIPE_NAMES)}"
            )
        return BY_NAME[override], "chosen by the user (--recipe / the recipe option)"
    for name, test, why in _RULES:
        if test(facts):
            return BY_NAME[name], why
    return BY_NAME["generic"], (
        f"no family rule matches model_type={facts.model_type!r}, "
        f"architectures={list(facts.architectures)!r}"
    )


# --------------------------------------------------------------------------- resolving


def resolve_recipe(
    recipe: Recipe,
    reason: str,
    *,
    token_to_id: Callable[[str], int | None],
    roles: Mapping[str, int | None],
    vocab_size: int,
) -> CanvasRecipe:
    """Token names of ``recipe`` -> ids. ``roles``: ``bos``/``eos``/``pad``/``mask`` ids the
    checkpoint defines (None when it defines none). Raises :class:`RecipeError` naming the
    recipe and the token when a required one is missing."""

    def one(entry: str | int, what: str, *, optional: bool = False) -> int | None:
        if isinstance(entry, int):
            i: int | None = entry
        elif entry.startswith("@"):
            role = entry[1:].rstrip("?")
            optional = optional or entry.endswith("?")
            i = roles.get(role)
        else:
            i = token_to_id(entry)
        if i is None:
            if optional:
                return None
            raise RecipeError(
                f"recipe {recipe.name!r}: {what} {entry!r} is not defined by this checkpoint's "
                f"tokenizer/config; pick another recipe with --recipe ({', '.join(RECIPE_NAMES)})"
            )
        if not 0 <= i < vocab_size:
            raise RecipeError(
                f"recipe {recipe.name!r}: {what} {entry!r} has id {i}, outside the embedding "
                f"table (vocab_size={vocab_size})"
            )
        return i

    def many(entries: Sequence[str | int], what: str) -> tuple[int, ...]:
        out = [one(e, what) for e in entries]
        return tuple(i for i in out if i is not None)

    terms = list(many(recipe.terminators, "terminator"))
    for t in recipe.optional_terminators:
        i = one(t, "terminator", optional=True)
        if i is not None and i not in terms:
            terms.append(i)
    filler = one(recipe.filler, "filler")
    mask = one(recipe.mask, "mask token")
    assert filler is not None and mask is not None
    lead = None if recipe.lead is None else one(recipe.lead, "lead token", optional=True)
    expand = None if recipe.expand is None else one(recipe.expand, "expand token")
    delete = None if recipe.delete is None else one(recipe.delete, "delete token")
    cross_file = recipe.cross_file
    if cross_file == "qwen-repo" and any(token_to_id(t) is None for t in QWEN_REPO_TOKENS):
        cross_file = "comment"  # the vocabulary cannot write the format's separators
    if mask in terms or mask == filler:
        raise RecipeError(f"recipe {recipe.name!r}: the mask token {mask} is also a terminator/filler")
    return CanvasRecipe(
        name=recipe.name,
        reason=reason,
        start=many(recipe.start, "canvas start token"),
        end=many(recipe.end, "canvas end token"),
        terminators=tuple(dict.fromkeys(terms)),
        filler=filler,
        mask=mask,
        lead=lead if lead is not None else filler,
        expand=expand,
        delete=delete,
        cross_file=cross_file,
    )


def describe(recipe: CanvasRecipe, id_to_token: Callable[[int], str | None]) -> dict[str, Any]:
    """The resolved recipe for ``diffill info``: names beside ids, and the row's sources."""

    def show(ids: Sequence[int]) -> list[str]:
        return [f"{i} {id_to_token(i)!r}" if id_to_token(i) is not None else str(i) for i in ids]

    row = BY_NAME.get(recipe.name)
    out: dict[str, Any] = {
        "name": recipe.name,
        "why": recipe.reason,
        "for": row.family if row else "-",
        "canvas": " + ".join([*show(recipe.start), "prefix", "[mask]*n", "suffix",
                              *show(recipe.end)]),
        "terminators": show(recipe.terminators),
        "filler": show([recipe.filler])[0],
        "mask": show([recipe.mask])[0],
        "cross_file": recipe.cross_file,
    }
    if recipe.length_control:
        assert recipe.expand is not None and recipe.delete is not None
        out["length_control"] = f"expand {show([recipe.expand])[0]}, delete {show([recipe.delete])[0]}"
    if row and row.note:
        out["note"] = row.note
    if row:
        out["sources"] = list(row.sources)
    return out
