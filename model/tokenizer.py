"""Tokenizer wrapper over the ``tokenizers`` library.

Speaks plain ids: ``encode(text) -> list[int]`` never adds special tokens (the
sampler builds the canvas itself) and ``decode(ids)`` drops special tokens.
Special token ids (mask, pad, eos, bos) are resolved once, from the model
config when it names them, else from the tokenizer's own special tokens
(``tokenizer_config.json`` and well-known names).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

MASK_NAMES = ("<|mask|>", "<|mdm_mask|>", "<mask>", "<M>", "[MASK]")
PAD_NAMES = ("<|pad|>", "<|endoftext|>", "<pad>", "[PAD]", "<|padding|>")
EOS_NAMES = ("<|endoftext|>", "<|eos|>", "</s>", "<|im_end|>", "<eos>")
BOS_NAMES = ("<|bos|>", "<|beginoftext|>", "<s>", "<bos>", "<|startoftext|>")


class TokenizerError(ValueError):
    pass


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
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{path}: missing file (the checkpoint folder needs tokenizer.json)")
        try:
            tok = _HFTokenizer.from_file(str(path))
        except Exception as e:
            raise TokenizerError(f"{path}: cannot be read by tokenizers ({e})") from None
        named: dict[str, str] = {}
        tc = folder / "tokenizer_config.json"
        if tc.is_file():
            try:
                data = json.loads(tc.read_text())
                for key in ("mask_token", "pad_token", "eos_token", "bos_token"):
                    v = data.get(key)
                    if isinstance(v, dict):
                        v = v.get("content")
                    if isinstance(v, str):
                        named[key] = v
            except (ValueError, OSError):
                pass

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
                f"{path}: no mask token (looked for mask_token_id in config.json and for "
                f"{', '.join(MASK_NAMES)} in the tokenizer); a masked-diffusion model needs one"
            )
        if m >= tok.get_vocab_size(with_added_tokens=True) and tok.id_to_token(m) is None:
            # LLaDA's mask id lies inside the embedding but may not be in tokenizer.json
            pass
        e = resolve(eos_id, "eos_token", EOS_NAMES)
        if e is None:
            raise TokenizerError(f"{path}: no end-of-text token (eos_token_id or one of {EOS_NAMES})")
        p = resolve(pad_id, "pad_token", PAD_NAMES)
        b = resolve(bos_id, "bos_token", BOS_NAMES)
        return cls(tok, mask_id=m, pad_id=p if p is not None else e, eos_id=e, bos_id=b, source=str(path))

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
