"""Byte-level BPE: special tokens, exact round trip, truncation == shorter training,
pre-tokenised file format."""

from __future__ import annotations

import json

import numpy as np
import pytest
from diffill.model.tokenizer import Tokenizer as DiffillTokenizer
from diffill.training import bpe


def _texts() -> list[str]:
    out = []
    for i in range(40):
        out.append(
            f"class Thing{i}:\n"
            f"    def method_{i}(self, value):\n"
            f"        if value > {i}:\n"
            f"            return value * {i}  # twice\n"
            f"        return None\n\n\n"
            f"def helper_{i}(xs):\n    \"\"\"Sum xs.\"\"\"\n    return sum(x for x in xs)\n"
        )
    return out


@pytest.fixture(scope="module")
def tok():
    return bpe.train_bpe(_texts(), vocab_size=600)


def test_special_tokens_first(tok):
    ids = bpe.special_ids(tok)
    assert ids == {"<|bos|>": 0, "<|eos|>": 1, "<|pad|>": 2, "<|mask|>": 3, "<|file|>": 4}
    assert tok.get_vocab_size() <= 600
    # specials are atomic in text too
    assert tok.encode("<|mask|>", add_special_tokens=False).ids == [3]


@pytest.mark.parametrize("text", [
    "def f(x):\n    return x\n",
    "\t\tmixed\ttabs  and   spaces   \n\n\n",
    "unicode: é ß 漢字 🙂 \u200b end",
    "",
    "   leading",
    "trailing   ",
    "\r\nwindows\r\n",
])
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert bpe.roundtrip_failures(tok, [text]) == []


def test_indentation_is_compact(tok):
    # an 8-space indentation run (after a newline) should not cost 8 tokens
    ids = tok.encode("\n        return", add_special_tokens=False).ids
    assert len(ids) <= 3
    assert bpe.bytes_per_token(tok, _texts()) > 2.0


def test_truncate_equals_shorter_training():
    texts = _texts()
    big = bpe.train_bpe(texts, vocab_size=700)
    small = bpe.train_bpe(texts, vocab_size=400)
    cut = bpe.truncate_bpe(big, 400)
    assert cut.get_vocab() == small.get_vocab()
    for t in texts[:5]:
        assert cut.encode(t).ids == small.encode(t).ids


def test_pretokenize_format(tok, tmp_path):
    texts = ["a = 1\n", "def g():\n    pass\n", "x"]
    n_tok, n_files = bpe.pretokenize(tok, texts, tmp_path / "split")
    ids, starts = bpe.load_tokens(tmp_path / "split")
    assert n_files == 3 and len(ids) == n_tok and ids.dtype == np.uint16
    assert starts.dtype == np.int64 and starts[0] == 0
    ends = [*starts[1:].tolist(), len(ids)]
    for text, s, e in zip(texts, starts.tolist(), ends, strict=True):
        assert ids[e - 1] == 1  # <|eos|> closes every file
        assert tok.decode(ids[s : e - 1].tolist()) == text


def test_loads_with_project_tokenizer(tok, tmp_path):
    tok.save(str(tmp_path / "tokenizer.json"))
    t = DiffillTokenizer.from_folder(tmp_path)
    assert (t.bos_id, t.eos_id, t.pad_id, t.mask_id) == (0, 1, 2, 3)
    ids = t.encode("def f():\n    return 1\n")
    assert t.decode(ids) == "def f():\n    return 1\n"
    assert json.loads((tmp_path / "tokenizer.json").read_text())["decoder"]["type"] == "ByteLevel"
