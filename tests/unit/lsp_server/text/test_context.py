"""Context windows: real token counts, line-boundary cuts, bounded work on huge documents."""

from __future__ import annotations

import random

import pytest
from diffill.lsp_server.text.context import (
    CHARS_PER_TOKEN_BOUND,
    Snippet,
    build_context,
    comment_prefix,
    split_budget,
)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CODE = '''import os
import sys


def load(path: str) -> list[str]:
    """Read lines from a file."""
    with open(path) as fh:
        return [line.rstrip("\\n") for line in fh]


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, word: str) -> None:
        self.counts[word] = self.counts.get(word, 0) + 1

    def top(self, n: int = 10) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:n]


def main(argv: list[str]) -> int:
    c = Counter()
    for path in argv[1:]:
        for line in load(path):
            for word in line.split():
                c.add(word)
    for word, n in c.top():
        print(f"{word}\\t{n}")
    return 0
'''


@pytest.fixture(scope="module")
def encode_batch():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CODE] * 4, trainer)

    def enc(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    return enc


def ntok(enc, text: str) -> int:
    return len(enc([text])[0])


def doc_and_offset(lines: int = 400, seed: int = 0) -> tuple[str, int]:
    text = CODE * (lines // CODE.count("\n") + 1)
    rng = random.Random(seed)
    offset = rng.randrange(len(text) // 3, 2 * len(text) // 3)
    return text, offset


@pytest.mark.parametrize("budget,frac", [(64, 0.75), (200, 0.75), (300, 0.5), (100, 1.0)])
def test_token_budget_respected_with_real_tokens(encode_batch, budget, frac):
    text, offset = doc_and_offset()
    ctx = build_context(text, offset, encode_batch, budget=budget, prefix_fraction=frac)
    pb, sb = split_budget(budget, frac)
    assert ctx.prefix_ids == encode_batch([ctx.prefix])[0]
    assert ctx.suffix_ids == encode_batch([ctx.suffix])[0]
    assert ctx.prefix_tokens <= pb and ctx.suffix_tokens <= sb
    assert text[ctx.prefix_start:offset] == ctx.prefix
    assert text[offset:ctx.suffix_end] == ctx.suffix


def test_default_split_is_75_25():
    assert split_budget(1000, 0.75) == (750, 250)
    assert split_budget(0, 0.75) == (0, 0)


@pytest.mark.parametrize("seed", range(5))
def test_cuts_on_line_boundaries_and_windows_are_maximal(encode_batch, seed):
    text, offset = doc_and_offset(seed=seed)
    budget = 160
    ctx = build_context(text, offset, encode_batch, budget=budget)
    pb, sb = split_budget(budget, 0.75)
    # prefix starts at a line start, suffix ends at a line end
    assert ctx.prefix_start == 0 or text[ctx.prefix_start - 1] == "\n"
    assert ctx.suffix_end == len(text) or text[ctx.suffix_end - 1] == "\n"
    # one more whole line would not fit
    if ctx.prefix_start > 0:
        prev_start = text.rfind("\n", 0, ctx.prefix_start - 1) + 1
        assert ntok(encode_batch, text[prev_start:offset]) > pb
    if ctx.suffix_end < len(text):
        nxt = text.find("\n", ctx.suffix_end)
        nxt = len(text) if nxt < 0 else nxt + 1
        assert ntok(encode_batch, text[offset:nxt]) > sb


def test_cursor_line_itself_cut_when_over_budget(encode_batch):
    long_line = "x = [" + ", ".join(str(i) for i in range(2000)) + "]"
    text = "def f():\n    " + long_line + "\n    return x\n"
    offset = text.index("1000,")
    ctx = build_context(text, offset, encode_batch, budget=40)
    assert 0 < ctx.prefix_tokens <= 30 and 0 < ctx.suffix_tokens <= 10
    assert "\n" not in ctx.prefix and "\n" not in ctx.suffix  # mid-line, on the cursor line
    assert text[ctx.prefix_start:offset] == ctx.prefix


def test_short_document_taken_whole(encode_batch):
    text = "a = 1\nb = 2\n"
    ctx = build_context(text, 6, encode_batch, budget=1000)
    assert (ctx.prefix, ctx.suffix) == ("a = 1\n", "b = 2\n")
    assert (ctx.line_prefix, ctx.line_suffix, ctx.after_line) == ("", "b = 2", "")


def test_cursor_line_fields(encode_batch):
    text = "def f(x):\n    return g(x, )\n    # end\n"
    offset = text.index(", )") + 2
    ctx = build_context(text, offset, encode_batch, budget=100)
    assert ctx.line_prefix == "    return g(x, "
    assert ctx.line_suffix == ")"
    assert ctx.after_line == "    # end\n"
    assert not ctx.at_line_end


def test_characters_outside_the_bmp(encode_batch):
    text = "s = '😀😀'\nt = 1\n"
    offset = text.index("'\n") + 1
    ctx = build_context(text, offset, encode_batch, budget=100)
    assert ctx.prefix == "s = '😀😀'" and ctx.line_prefix == "s = '😀😀'"


def test_huge_document_work_is_bounded(encode_batch):
    text, _ = doc_and_offset(lines=200_000)  # ~5 MB
    offset = len(text) // 2
    seen = {"chars": 0, "calls": 0}

    def counting(texts: list[str]) -> list[list[int]]:
        seen["chars"] += sum(len(t) for t in texts)
        seen["calls"] += 1
        return encode_batch(texts)

    budget = 256
    ctx = build_context(text, offset, counting, budget=budget)
    assert ctx.prefix_tokens > 0 and ctx.suffix_tokens > 0
    # only a window of budget * CHARS_PER_TOKEN_BOUND chars per side is ever tokenised
    # (a logarithmic number of times): the work does not grow with the document
    window = budget * CHARS_PER_TOKEN_BOUND
    assert seen["chars"] <= 32 * window
    assert seen["calls"] <= 64
    assert len(text) > 500 * window


def test_extra_context_header_inside_budget(encode_batch):
    text, offset = doc_and_offset()
    snippets = [Snippet("util.py", "def helper(x):\n    return x * 2\n", "python"),
                Snippet("big.py", CODE * 10, "python")]
    budget = 400
    ctx = build_context(text, offset, encode_batch, budget=budget, language="python", path="main.py",
                        snippets=snippets, extra_fraction=0.3)
    pb, _ = split_budget(budget, 0.75)
    assert ctx.prefix.startswith("# path: util.py\ndef helper(x):")
    assert "# path: main.py\n" in ctx.prefix
    assert ctx.extra_paths == ["util.py"]  # big.py does not fit its share
    assert ctx.prefix_tokens <= pb and 0 < ctx.header_tokens <= int(pb * 0.3)
    assert ctx.prefix[ctx.header_chars:] == text[ctx.prefix_start:offset]


def test_extra_context_comment_syntax():
    assert comment_prefix("rust") == "//"
    assert comment_prefix(None, "a/b.lua") == "--"
    assert comment_prefix("unknown-language") == "#"


def test_offset_outside_text_rejected(encode_batch):
    with pytest.raises(ValueError, match="outside"):
        build_context("abc", 4, encode_batch)


# --- the extra-context policy (module doc, *Extra context*) -----------------------------------


HELPER = Snippet("util.py", "def helper(x):\n    return x * 2\n", "python", "definition")
OTHER = Snippet("other.py", "def other(y):\n    return y - 1\n", "python", "workspace")


def test_extras_take_the_room_a_short_prefix_leaves(encode_batch):
    text = "def main():\n    x = 1\n    "
    big = Snippet("big.py", CODE * 3, "python", "workspace")
    ctx = build_context(text, len(text), encode_batch, budget=400, language="python",
                        path="main.py", snippets=[big], extra_fraction=0.1)
    pb, _ = split_budget(400, 0.75)
    assert ctx.prefix[ctx.header_chars:] == text  # the whole prefix, untouched
    assert int(pb * 0.1) < ctx.header_tokens and ctx.prefix_tokens <= pb
    assert ctx.prefix.startswith("# path: big.py\nimport os\n")  # its first lines that fit


def test_extras_never_crowd_out_the_prefix(encode_batch):
    text, offset = doc_and_offset()
    big = Snippet("big.py", CODE * 3, "python", "workspace")
    ctx = build_context(text, offset, encode_batch, budget=400, language="python", path="m.py",
                        snippets=[HELPER, big], extra_fraction=0.2)
    pb, _ = split_budget(400, 0.75)
    body = ctx.prefix[ctx.header_chars:]
    assert 0 < ctx.header_tokens <= int(pb * 0.2)
    assert ntok(encode_batch, body) >= pb - int(pb * 0.2) - 2  # joined-text merges: a token or two
    assert body == text[ctx.prefix_start:offset]


def test_most_relevant_snippet_is_written_nearest_the_code(encode_batch):
    text = "x = 1\n"
    ctx = build_context(text, len(text), encode_batch, budget=400, language="python",
                        path="main.py", snippets=[HELPER, OTHER])
    assert ctx.extra_paths == ["util.py", "other.py"]
    assert ctx.prefix == ("# path: other.py\n" + OTHER.text + "# path: util.py\n" + HELPER.text
                          + "# path: main.py\n" + text)


def test_snippets_already_in_the_buffer_or_repeated_are_left_out(encode_batch):
    text = "def helper(x):\n    return x * 2\n\n\nvalue = "
    dup = Snippet("again.py", OTHER.text, "python")
    ctx = build_context(text, len(text), encode_batch, budget=400, language="python",
                        path="main.py", snippets=[HELPER, OTHER, dup])
    assert ctx.extra_paths == ["other.py"]


def test_qwen_repository_format(encode_batch):
    text = "x = 1\n"
    ctx = build_context(text, len(text), encode_batch, budget=400, path="pkg/main.py",
                        snippets=[HELPER, OTHER], header_format="qwen-repo", repo="demo")
    assert ctx.prefix == ("<|repo_name|>demo\n<|file_sep|>other.py\n" + OTHER.text
                          + "<|file_sep|>util.py\n" + HELPER.text + "<|file_sep|>pkg/main.py\n"
                          + text)
    assert ctx.prefix[ctx.header_chars:] == text
