"""Tokenizer wrapper over the ``tokenizers`` library.

Speaks plain ids: ``encode(text) -> list[int]`` never adds special tokens (the
sampler builds the canvas itself) and ``decode(ids)`` drops special tokens.
Special token ids (mask, pad, eos, bos) are resolved once, from the model
config when it names them, else from the tokenizer's own special tokens
(``tokenizer_config.json`` and well-known names).

Two folder layouts load:

* ``tokenizer.json`` (the ``tokenizers`` format), used as is;
* the *slow* byte-level BPE layout that Dream, Dream-Coder, DiffuCoder and DreamOn
  publish (``vocab.json`` + ``merges.txt`` + ``added_tokens.json`` +
  ``tokenizer_config.json``, no ``tokenizer.json``; DreamLM/Dream issues #54, #81):
  :func:`build_slow_bpe` builds the same tokenizer in memory -- Qwen2's NFC
  normaliser, its pre-tokenizer split regex, byte-level mapping and decoder -- and puts
  every added token (``added_tokens.json`` and ``tokenizer_config.json``'s
  ``added_tokens_decoder``) at its own id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

MASK_NAMES = ("<|mask|>", "<|mdm_mask|>", "<mask>", "<M>", "[MASK]")
PAD_NAMES = ("<|pad|>", "<|endoftext|>", "<pad>", "[PAD]", "<|padding|>")
EOS_NAMES = ("<|endoftext|>", "<|eos|>", "</s>", "<|im_end|>", "<eos>")
BOS_NAMES = ("<|bos|>", "<|beginoftext|>", "<s>", "<bos>", "<|startoftext|>")


SLOW_FILES = ("vocab.json", "merges.txt")
"""The files the slow byte-level BPE layout cannot do without (added tokens are optional)."""

QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenizer split pattern (transformers' ``tokenization_qwen2.PRETOKENIZE_REGEX``;
Dream's ``tokenization_dream.py`` uses the same). Single digits, letters with one leading
non-letter, punctuation runs, newline runs."""


class TokenizerError(ValueError):
    pass


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: not valid JSON ({e})") from None


def read_named_tokens(folder: Path) -> dict[str, str]:
    """``tokenizer_config.json``'s ``mask_token`` / ``pad_token`` / ``eos_token`` /
    ``bos_token`` (text), those it names; empty when the file is absent."""
    tc = folder / "tokenizer_config.json"
    if not tc.is_file():
        return {}
    data = _read_json(tc)
    named: dict[str, str] = {}
    if isinstance(data, dict):
        for key in ("mask_token", "pad_token", "eos_token", "bos_token"):
            v = data.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                named[key] = v
    return named


def _added_tokens(folder: Path) -> dict[int, AddedToken]:
    """id -> AddedToken from ``added_tokens.json`` ({text: id}) and ``tokenizer_config.json``'s
    ``added_tokens_decoder`` ({id: {content, special, lstrip, rstrip, ...}}); the two must
    agree where both name an id."""
    out: dict[int, AddedToken] = {}
    at = folder / "added_tokens.json"
    if at.is_file():
        data = _read_json(at)
        if not isinstance(data, dict):
            raise TokenizerError(f"{at}: expected an object {{token: id}}")
        for text, i in data.items():
            if not isinstance(i, int) or isinstance(i, bool) or i < 0:
                raise TokenizerError(f"{at}: token {text!r} has id {i!r}, not a non-negative integer")
            out[i] = AddedToken(text, special=True, normalized=False)
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        data = _read_json(tc)
        dec = data.get("added_tokens_decoder") if isinstance(data, dict) else None
        if isinstance(dec, dict):
            for key, spec in dec.items():
                if not isinstance(spec, dict) or not isinstance(spec.get("content"), str) \
                        or not str(key).isdigit():
                    raise TokenizerError(f"{tc}: added_tokens_decoder[{key!r}] is not a token entry")
                i, text = int(key), spec["content"]
                if i in out and out[i].content != text:
                    raise TokenizerError(
                        f"{tc}: added_tokens_decoder gives id {i} to {text!r}, but "
                        f"added_tokens.json gives it to {out[i].content!r}"
                    )
                out[i] = AddedToken(
                    text,
                    special=bool(spec.get("special", True)),
                    normalized=bool(spec.get("normalized", False)),
                    lstrip=bool(spec.get("lstrip", False)),
                    rstrip=bool(spec.get("rstrip", False)),
                    single_word=bool(spec.get("single_word", False)),
                )
    return out


def build_slow_bpe(folder: str | Path) -> _HFTokenizer:
    """The byte-level BPE of a ``vocab.json`` + ``merges.txt`` folder (Qwen2 / Dream layout),
    with every added token at its published id. Raises :class:`TokenizerError` naming the
    file at fault."""
    folder = Path(folder)
    vocab_path, merges_path = folder / SLOW_FILES[0], folder / SLOW_FILES[1]
    vocab = _read_json(vocab_path)
    if not isinstance(vocab, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in vocab.values()
    ):
        raise TokenizerError(f"{vocab_path}: expected an object {{token: id}}")
    merges: list[tuple[str, str]] = []
    try:
        lines = merges_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{merges_path}: cannot be read ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"{merges_path}: line {n} is not a merge 'A B': {line[:60]!r}")
        merges.append((parts[0], parts[1]))
    added = _added_tokens(folder)
    for i, t in added.items():
        if vocab.get(t.content, i) != i:
            raise TokenizerError(
                f"{folder}: added token {t.content!r} has id {i} but vocab.json gives it "
                f"{vocab[t.content]}"
            )
    taken = {v: k for k, v in vocab.items()}
    for i, t in added.items():
        if taken.get(i, t.content) != t.content:
            raise TokenizerError(
                f"{folder}: added token {t.content!r} has id {i}, which vocab.json gives to "
                f"{taken[i]!r}"
            )
    full = dict(vocab)
    full.update({t.content: i for i, t in added.items()})  # each added token at its own id
    try:
        bpe = models.BPE(vocab=full, merges=merges, fuse_unk=False, byte_fallback=False)
    except Exception as e:  # tokenizers reports merges naming unknown tokens
        raise TokenizerError(f"{merges_path}: does not fit {vocab_path.name} ({e})") from None
    tok = _HFTokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [t for _, t in sorted(added.items()) if t.special]
    plain = [t for _, t in sorted(added.items()) if not t.special]
    tok.add_special_tokens(specials)
    tok.add_tokens(plain)
    for i, t in added.items():
        if tok.token_to_id(t.content) != i:  # pragma: no cover - tokenizers reuses vocab ids
            raise TokenizerError(f"{folder}: added token {t.content!r} did not land at id {i}")
    return tok


class Tokenizer:
    def __init__(
        self,
        tok: _HFTokenizer,
        *,
        mask_id: int,
        pad_id: int,
        eos_id: int,
        bos_id: int | None,
        source: str = "tokenizer.json",
    ) -> None:
        self._tok = tok
        self.mask_id = mask_id
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.source = source
        self.named_ids: dict[str, int] = {}  # tokenizer_config.json's bos/eos/pad/mask, as ids
        self.special_ids = frozenset(
            i for i in (mask_id, pad_id, eos_id, bos_id) if i is not None
        ) | frozenset(self._added_special_ids())

    def _added_special_ids(self) -> list[int]:
        """Ids of the tokenizer's added tokens flagged ``special``."""
        try:
            decoder = self._tok.get_added_tokens_decoder()  # {id: AddedToken}
        except AttributeError:  # older tokenizers
            return []
        return [i for i, t in decoder.items() if t.special]

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        *,
        mask_id: int | None = None,
        pad_id: int | None = None,
        eos_id: int | None = None,
        bos_id: int | None = None,
    ) -> Tokenizer:
        """The folder's tokenizer: ``tokenizer.json`` when there is one, else the slow
        byte-level BPE layout (``vocab.json`` + ``merges.txt`` + added tokens, see
        :func:`build_slow_bpe`). Special ids given here (from config.json) win; the others
        come from ``tokenizer_config.json``'s names, then from well-known names."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        named = read_named_tokens(folder)
        if path.is_file():
            try:
                tok = _HFTokenizer.from_file(str(path))
            except Exception as e:
                raise TokenizerError(f"{path}: cannot be read by tokenizers ({e})") from None
            source = str(path)
        else:
            missing = [n for n in SLOW_FILES if not (folder / n).is_file()]
            if len(missing) == len(SLOW_FILES):
                raise TokenizerError(
                    f"{path}: missing file (the checkpoint folder needs tokenizer.json, or the "
                    f"slow-tokenizer files {' + '.join(SLOW_FILES)})"
                )
            if missing:
                raise TokenizerError(
                    f"{folder / missing[0]}: missing file (the folder has no tokenizer.json and "
                    f"the slow-tokenizer layout needs {' + '.join(SLOW_FILES)})"
                )
            tok = build_slow_bpe(folder)
            source = str(folder / SLOW_FILES[0])

        def resolve(given: int | None, key: str, names: tuple[str, ...]) -> int | None:
            if given is not None:
                return given
            cands = ((named[key],) if key in named else ()) + names
            for n in cands:
                i = tok.token_to_id(n)
                if i is not None:
                    return i
            return None

        m = resolve(mask_id, "mask_token", MASK_NAMES)
        if m is None:
            raise TokenizerError(
                f"{source}: no mask token (looked for mask_token_id in config.json and for "
                f"{', '.join(MASK_NAMES)} in the tokenizer); a masked-diffusion model needs one"
            )
        e = resolve(eos_id, "eos_token", EOS_NAMES)
        if e is None:
            raise TokenizerError(f"{source}: no end-of-text token (eos_token_id or one of {EOS_NAMES})")
        p = resolve(pad_id, "pad_token", PAD_NAMES)
        b = resolve(bos_id, "bos_token", BOS_NAMES)
        out = cls(tok, mask_id=m, pad_id=p if p is not None else e, eos_id=e, bos_id=b, source=source)
        # the tokenizer's own special tokens (tokenizer_config.json's names), which a family
        # recipe may prefer over config.json's ids (Dream's BOS, see model/recipes.py)
        out.named_ids = {
            key.removesuffix("_token"): i
            for key, name in named.items()
            if (i := tok.token_to_id(name)) is not None
        }
        return out

    @property
    def added_tokens(self) -> frozenset[str]:
        """The text of every added token (what recipe selection looks for)."""
        return frozenset(t.content for t in self._tok.get_added_tokens_decoder().values())

    # -- use -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        ids = [i for i in ids if i not in self.special_ids]
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    @property
    def backend(self) -> _HFTokenizer:
        return self._tok
