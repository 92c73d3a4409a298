"""Byte-level BPE for the diffill code model, and pre-tokenisation of the corpus.

Tokenizer: ``tokenizers`` BPE with the ByteLevel pre-tokenizer (GPT-2 split
regex, no prefix space) and ByteLevel decoder, so every UTF-8 text round-trips
exactly. The split regex keeps a whitespace run in one pre-token (the newline
plus all but the last space of an indentation, e.g. ``"\\n       "``), so BPE
learns single tokens for common indentation runs. Special tokens come first,
ids 0..4: ``<|bos|>``, ``<|eos|>``, ``<|pad|>``, ``<|mask|>``, ``<|file|>``.

Vocabulary size, measured on the corpus of manifest ``62b195ba...`` (one
training run at 16384 on the 145.7 MB train split; the 4k and 8k tokenizers are
its truncations, which equal shorter runs, see :func:`truncate_bpe`). Bytes per
token, higher is better; "heldout" = boltons, toolz, more-itertools, tabulate
(1.86 MB, never seen in training), "stdlib" = the CPython stdlib files of the
train split (in-sample)::

    vocab    heldout   stdlib
     4096     3.082     3.247
     8192     3.343     3.591    <- chosen
    16384     3.518     3.837

Choice: 8192. The model has ~5-10M parameters and is trained on CPU; with a
tied embedding of width ~256-320 the embedding costs V*D parameters: 4k ->
~1.0-1.3M, 8k -> ~2.1-2.6M, 16k -> ~4.2-5.2M (half the budget). 4k -> 8k gains
8.5% bytes/token on held-out code for ~1.1M parameters; 8k -> 16k gains only
5.2% while taking another ~2.1-2.6M parameters from the transformer blocks
and doubling the cost of the output softmax. Hence 8k. With it the train split
is 41.4M tokens and the held-out split 0.56M (including one ``<|eos|>`` per
file).

Pre-tokenised format (``/work/data/tokens``): ``{split}.bin`` holds the uint16
ids of all files concatenated, each followed by ``<|eos|>``;
``{split}.idx.npy`` holds the int64 start offset of every file (so a loader can
sample windows inside a file and FIM spans at line boundaries);
``meta.json`` records vocabulary size, token counts, special ids and the sha256
of the tokenizer and of the corpus manifest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS: tuple[str, ...] = ("<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>", "<|file|>")
DEFAULT_VOCAB = 8192


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with diffill's pre-tokenizer/decoder."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE on ``texts``; special tokens get ids 0..4."""
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    out = {}
    for s in SPECIAL_TOKENS:
        i = tok.token_to_id(s)
        if i is None:
            raise ValueError(f"tokenizer lacks special token {s}")
        out[s] = i
    return out


def encode_many(tok: Tokenizer, texts: list[str], batch: int = 512) -> Iterator[list[int]]:
    """Ids of each text, no special tokens added (batched through the Rust encoder)."""
    for i in range(0, len(texts), batch):
        for enc in tok.encode_batch(texts[i : i + batch], add_special_tokens=False):
            yield enc.ids


def bytes_per_token(tok: Tokenizer, texts: list[str]) -> float:
    """UTF-8 bytes of ``texts`` divided by the number of tokens they encode to."""
    n_bytes = sum(len(t.encode()) for t in texts)
    n_tok = sum(len(ids) for ids in encode_many(tok, texts))
    return n_bytes / max(n_tok, 1)


def roundtrip_failures(tok: Tokenizer, texts: list[str]) -> list[int]:
    """Indices of texts where ``decode(encode(x)) != x``."""
    bad = []
    for i, ids in enumerate(encode_many(tok, texts)):
        if tok.decode(ids, skip_special_tokens=False) != texts[i]:
            bad.append(i)
    return bad


def read_jsonl(path: str | Path, package: str | None = None) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if package is None or rec["package"] == package:
                out.append(rec)
    return out


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def pretokenize(tok: Tokenizer, texts: list[str], out_prefix: str | Path) -> tuple[int, int]:
    """Write ``{prefix}.bin`` (uint16 ids, each file followed by eos) and
    ``{prefix}.idx.npy`` (int64[F] start offsets). Returns (tokens incl. eos, files)."""
    eos = tok.token_to_id("<|eos|>")
    if tok.get_vocab_size() > 65535:
        raise ValueError("vocabulary does not fit uint16")
    starts = np.zeros(len(texts), dtype=np.int64)
    pos = 0
    out_prefix = Path(out_prefix)
    with open(out_prefix.with_name(out_prefix.name + ".bin.tmp"), "wb") as f:
        for i, ids in enumerate(encode_many(tok, texts)):
            starts[i] = pos
            arr = np.asarray([*ids, eos], dtype=np.uint16)
            f.write(arr.tobytes())
            pos += len(arr)
    out_prefix.with_name(out_prefix.name + ".bin.tmp").replace(out_prefix.with_name(out_prefix.name + ".bin"))
    np.save(out_prefix.with_name(out_prefix.name + ".idx.npy"), starts)
    return pos, len(texts)


def load_tokens(prefix: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(ids uint16[N] memory-mapped, starts int64[F])`` written by :func:`pretokenize`."""
    prefix = Path(prefix)
    ids = np.memmap(prefix.with_name(prefix.name + ".bin"), dtype=np.uint16, mode="r")
    starts = np.load(prefix.with_name(prefix.name + ".idx.npy"))
    return ids, starts


def truncate_bpe(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """The tokenizer a shorter BPE training run would produce: BPE merges are learned
    greedily in order, so the first merges of a larger run are those of a smaller one.
    Keeps the tokens with id < ``vocab_size`` and the merges that produce them."""
    data = json.loads(tok.to_str())
    model = data["model"]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < vocab_size}
    kept = []
    for m in model["merges"]:
        pair = m.split(" ", 1) if isinstance(m, str) else m
        if model["vocab"].get("".join(pair), vocab_size) < vocab_size:
            kept.append(m)
    model["merges"] = kept
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < vocab_size]
    return Tokenizer.from_str(json.dumps(data))


def build(corpus_dir: str | Path, tokenizer_dir: str | Path, tokens_dir: str | Path,
          vocab_sizes: tuple[int, ...] = (4096, 8192, 16384), chosen: int = DEFAULT_VOCAB,
          manifest_sha256: str | None = None, log=print) -> dict:
    """Train once at the largest vocabulary, derive the smaller ones by truncation,
    measure bytes/token, save the chosen tokenizer and pre-tokenise both splits."""
    corpus_dir, tokenizer_dir, tokens_dir = Path(corpus_dir), Path(tokenizer_dir), Path(tokens_dir)
    train = read_jsonl(corpus_dir / "train.jsonl")
    heldout = read_jsonl(corpus_dir / "heldout.jsonl")
    train_texts = [r["text"] for r in train]
    held_texts = [r["text"] for r in heldout]
    std_texts = [r["text"] for r in train if r["package"] == "cpython-stdlib"]
    log(f"training BPE {max(vocab_sizes)} on {len(train_texts)} files")
    big = train_bpe(train_texts, max(vocab_sizes))
    table = {}
    toks = {}
    for v in sorted(vocab_sizes):
        t = big if v == max(vocab_sizes) else truncate_bpe(big, v)
        toks[v] = t
        table[v] = {"heldout": round(bytes_per_token(t, held_texts), 3),
                    "stdlib": round(bytes_per_token(t, std_texts), 3)}
        log(f"vocab {v}: bytes/token heldout {table[v]['heldout']} stdlib {table[v]['stdlib']}")
    tok = toks[chosen]
    bad = roundtrip_failures(tok, held_texts)
    if bad:
        raise RuntimeError(f"round trip failed on {len(bad)} held-out files")
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(tokenizer_dir / "tokenizer.json"))
    tokens_dir.mkdir(parents=True, exist_ok=True)
    meta: dict = {"vocab_size": tok.get_vocab_size(), "special_ids": special_ids(tok),
                  "tokenizer": str(tokenizer_dir / "tokenizer.json"),
                  "tokenizer_sha256": sha256_file(tokenizer_dir / "tokenizer.json"),
                  "manifest_sha256": manifest_sha256, "bytes_per_token": table,
                  "format": {"bin": "uint16 ids, each file followed by <|eos|>",
                             "idx": "int64 start offset of each file"},
                  "splits": {}}
    for name, texts in (("heldout", held_texts), ("train", train_texts)):
        n_tok, n_files = pretokenize(tok, texts, tokens_dir / name)
        meta["splits"][name] = {"files": n_files, "tokens": n_tok,
                                "bytes": sum(len(t.encode()) for t in texts)}
        log(f"{name}: {n_files} files, {n_tok} tokens")
    (tokens_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta
