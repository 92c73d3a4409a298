"""The learning check: the micro model, trained by the real training code on the
micro corpus, fills masked lines of that corpus back in EXACTLY through the real
loader and the real sampler, on the inference canvas ``[BOS] prefix [MASK]*n
suffix [EOS]``. If the loss, the training canvas, the checkpoint format and the
sampler disagree anywhere (special ids, pad placement, logit shift, weight
names), the model cannot do this.

This is the one place where tests look at what a model trained at test time writes.
What it learns differs between machines (the floating point of the CPU's kernels, the
thread count), so the thresholds sit well below the spread measured over those settings
with ``python tests/support/learning_spread.py`` (2026-12-01, 2-core Xeon with AVX-512,
torch 2.13.0+cpu; ATEN_CPU_CAPABILITY emulates the kernels of other x86-64 CPUs)::

    kernels   threads  seed   exact lines  empty holes   (of 10 each)
    avx512    1        0      9            9             (twice: before and after a merge)
    avx512    1        1      10           9
    avx512    1        2      8            10
    avx512    2        0      6            10
    avx2      1        0      10           8
    avx2      2        0      9            8
    default   1        0      10           10
    default   1        1      10           10
    default   1        2      9            10
    default   2        0      9            9

Worst seen: 6 exact (also what another machine of this kind got, issue 14), 8 empty. An
untrained model, or a pipeline that disagrees with itself anywhere, restores none.
Every other test runs the scripted checkpoint (``scripted_model_dir``), whose answers
are certain."""

from __future__ import annotations

from diffill.model.decoder.loop import infill
from diffill.model.decoder.spec import SamplerConfig
from diffill.training.train import micro_files

CASES = 10
MIN_EXACT = 3  # worst measured 6 (module doc)
MIN_EMPTY = 5  # worst measured 8


def line_cases(corpus: str, count: int = CASES) -> list[tuple[str, int, int]]:
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


def restored_lines(lm, corpus: str) -> list[tuple[str, str]]:
    """(wanted, written) for each masked line."""
    sc = SamplerConfig(steps=16, lengths=(8, 16))
    results = []
    for text, a, b in line_cases(corpus):
        pre, suf = lm.tokenizer.encode(text[:a]), lm.tokenizer.encode(text[b:])
        best = infill(lm.model, lm.config, pre, suf, sc)[0]
        results.append((text[a:b], lm.tokenizer.decode(best.ids)))
    return results


def exact_line_count(lm, corpus: str) -> int:
    return sum(want == got for want, got in restored_lines(lm, corpus))


def empty_hole_count(lm, corpus: str) -> int:
    """Holes at the end of a complete line (nothing is missing) filled with pads only."""
    sc = SamplerConfig(steps=8, lengths=(8,))
    empty = 0
    for text, _a, b in line_cases(corpus):
        pre, suf = lm.tokenizer.encode(text[:b]), lm.tokenizer.encode(text[b:])
        empty += infill(lm.model, lm.config, pre, suf, sc)[0].ids == []
    return empty


def test_micro_model_recovers_masked_lines_exactly(micro_model_dir, micro_corpus):
    from diffill.model import load_model

    lm = load_model(micro_model_dir)
    assert lm.config.family == "diffill"
    results = restored_lines(lm, micro_corpus)
    exact = sum(want == got for want, got in results)
    assert exact >= MIN_EXACT, "\n".join(f"{w!r} -> {g!r}" for w, g in results)


def test_micro_model_knows_an_empty_hole_from_a_full_one(micro_model_dir, micro_corpus):
    """A hole between two complete lines whose text is unchanged is filled with pads
    more often than a hole that cut a line in two (length learning through pads)."""
    from diffill.model import load_model

    lm = load_model(micro_model_dir)
    assert empty_hole_count(lm, micro_corpus) >= MIN_EMPTY
