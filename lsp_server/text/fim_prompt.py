"""Fill-in-the-middle prompts written in a model family's special tokens, split back into
prefix and suffix, for OpenAI-compatible clients that send the hole inside ``prompt``
rather than as ``prompt`` + ``suffix``:

* Zed's ``open_ai_compatible_api`` edit-prediction provider renders the hole in the
  tokens of its ``prompt_format`` (``qwen``, ``star_coder``, ``code_llama``,
  ``deepseek_coder``, ``codestral``, ``code_gemma``);
* Continue's autocomplete with an ``openai`` provider on the legacy completions route
  renders the template of the model's family (for a name it does not know, StarCoder's
  ``<fim_prefix>``... one).

diffill's model is not one of those families: it reads the prefix and suffix, so the
server takes them out of the markers and fills the hole as for ``prompt`` + ``suffix``.
A prompt is split only when it holds one complete template of one format, ending at the
middle marker (trailing whitespace allowed); anything else is taken as plain text. Text in
front of the prefix marker (a repository header, other files) stays in front of the
prefix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FimFormat:
    name: str
    first: str  # the marker the template opens with
    second: str  # the marker between the two parts
    middle: str  # the marker the prompt ends with (the hole)
    suffix_first: bool = False  # codestral: [SUFFIX] suffix [PREFIX] prefix
    pad: bool = False  # code_llama: one space after <PRE> and before <SUF> / <MID>


FORMATS: tuple[FimFormat, ...] = (
    FimFormat("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # also code_gemma
    FimFormat("star_coder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    FimFormat("deepseek_coder", "<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
              "<\uff5cfim\u2581end\uff5c>"),
    FimFormat("code_llama", "<PRE>", "<SUF>", "<MID>", pad=True),
    FimFormat("codestral", "[SUFFIX]", "[PREFIX]", "", suffix_first=True),
)


@dataclass(frozen=True)
class SplitPrompt:
    prefix: str
    suffix: str
    format: str


def split_fim_prompt(prompt: str) -> SplitPrompt | None:
    """The prefix and suffix of a prompt written in one of :data:`FORMATS` (None: plain)."""
    for f in FORMATS:
        split = _split(prompt, f)
        if split is not None:
            return split
    return None


def _split(prompt: str, f: FimFormat) -> SplitPrompt | None:
    if prompt.count(f.first) != 1 or prompt.count(f.second) != 1:
        return None
    head, _, rest = prompt.partition(f.first)
    one, _, two = rest.partition(f.second)
    if f.middle:
        body = two.rstrip()
        if prompt.count(f.middle) != 1 or not body.endswith(f.middle):
            return None
        two = body[: -len(f.middle)]
    if f.suffix_first:  # [SUFFIX] suffix [PREFIX] prefix   (the hole after the prefix)
        suffix, prefix = one, two
    else:
        prefix, suffix = one, two
    if f.pad:  # "<PRE> " prefix " <SUF>" suffix " <MID>"
        prefix = prefix.removeprefix(" ").removesuffix(" ")
        suffix = suffix.removesuffix(" ")
    return SplitPrompt(prefix=head + prefix, suffix=suffix, format=f.name)


__all__ = ["FORMATS", "FimFormat", "SplitPrompt", "split_fim_prompt"]
