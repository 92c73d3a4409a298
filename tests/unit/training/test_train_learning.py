"""The learning check: the micro model, trained by the real training code on the
micro corpus, fills masked lines of that corpus back in EXACTLY through the real
loader and the real sampler, on the inference canvas ``[BOS] prefix [MASK]*n
suffix [EOS]``. If the loss, the training canvas, the checkpoint format and the
sampler disagree anywhere (special ids, pad placement, logit shift, weight
names), the model cannot do this."""

from __future__ import annotations

from diffill.model.sampler import SamplerConfig, infill
from diffill.training.train import micro_files


def line_cases(corpus: str, count: int = 10) -> list[tuple[str, int, int]]:
    """``count`` (file text, cursor, middle end) cases spread over the corpus: the
    cursor after a line's indentation, the middle the rest of that line."""
    cases = []
    for f in micro_files(corpus):
        off = 0
        for line in f.splitlines(keepends=True):
            body = line.strip()
            if len(body) >= 10 and not body.startswith(('"""', "class ")):
                ind = len(line) - len(line.lstrip())
                cases.append((f, off + ind, off + len(line.rstrip("\n"))))
            off += len(line)
    return [cases[k * len(cases) // count] for k in range(count)]


def test_micro_model_recovers_masked_lines_exactly(micro_model_dir, micro_corpus):
    from diffill.model import load_model

    lm = load_model(micro_model_dir)
    assert lm.config.family == "diffill"
    sc = SamplerConfig(steps=16, lengths=(8, 16))
    results = []
    for text, a, b in line_cases(micro_corpus):
        pre, suf = lm.tokenizer.encode(text[:a]), lm.tokenizer.encode(text[b:])
        best = infill(lm.model, lm.config, pre, suf, sc)[0]
        got = lm.tokenizer.decode(best.ids)
        results.append((text[a:b], got))
    exact = sum(want == got for want, got in results)
    assert exact >= 8, "\n".join(f"{w!r} -> {g!r}" for w, g in results)


def test_micro_model_knows_an_empty_hole_from_a_full_one(micro_model_dir, micro_corpus):
    """A hole between two complete lines whose text is unchanged is filled with pads
    more often than a hole that cut a line in two (length learning through pads)."""
    from diffill.model import load_model

    lm = load_model(micro_model_dir)
    sc = SamplerConfig(steps=8, lengths=(8,))
    empty_ok = 0
    cases = line_cases(micro_corpus)
    for text, _a, b in cases:
        # cursor at the end of a complete line: nothing is missing
        pre, suf = lm.tokenizer.encode(text[:b]), lm.tokenizer.encode(text[b:])
        best = infill(lm.model, lm.config, pre, suf, sc)[0]
        empty_ok += best.ids == []
    assert empty_ok >= len(cases) // 2
