"""``diffill corpus``: build the training corpus offline (and optionally the tokenizer
and the pre-tokenised arrays). See :mod:`diffill.training.corpus` and :mod:`diffill.training.bpe`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import bpe, corpus


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("corpus", help="build the permissively licensed Python corpus")
    p.add_argument("--out", required=True, help="output folder for train.jsonl / heldout.jsonl")
    p.add_argument("--cache", default="/work/data/sdists", help="sdist cache folder")
    p.add_argument("--heldout", default=None, help="comma-separated held-out packages")
    p.add_argument("--packages-file", default=None, help="file of name==version lines")
    p.add_argument("--installed", default=None,
                   help="comma-separated installed distributions to add ('' for none)")
    p.add_argument("--offline", action="store_true", help="use only sdists already in the cache")
    p.add_argument("--manifest", default=None, help="also write the manifest here")
    p.add_argument("--tokenizer-dir", default=None, help="train the BPE and save tokenizer.json here")
    p.add_argument("--tokens-dir", default=None, help="pre-tokenise both splits here (needs --tokenizer-dir)")
    p.add_argument("--vocab", type=int, default=8192, help="chosen vocabulary size")
    return p


def run(args: argparse.Namespace) -> int:
    heldout = corpus.DEFAULT_HELDOUT if args.heldout is None else [
        h.strip() for h in args.heldout.split(",") if h.strip()]
    installed = corpus.DEFAULT_INSTALLED if args.installed is None else [
        h.strip() for h in args.installed.split(",") if h.strip()]
    manifest = corpus.main(args.out, args.cache, heldout, args.packages_file, args.manifest,
                           download=not args.offline, installed=installed)
    print(json.dumps({"totals": manifest["totals"], "filter_counts": manifest["filter_counts"],
                      "sha256": manifest["sha256"]}, indent=1))
    if args.tokens_dir and not args.tokenizer_dir:
        print("--tokens-dir needs --tokenizer-dir")
        return 2
    if args.tokenizer_dir:
        sizes = tuple(sorted({4096, 8192, 16384, args.vocab}))
        meta = bpe.build(args.out, args.tokenizer_dir, args.tokens_dir or Path(args.out) / "tokens",
                         vocab_sizes=sizes, chosen=args.vocab, manifest_sha256=manifest["sha256"])
        if args.tokens_dir:
            (Path(args.tokens_dir) / "READY").touch()
        print(json.dumps(meta["splits"]))
    return 0
