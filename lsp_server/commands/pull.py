"""``diffill pull NAME|REPO_ID``: fetch a published checkpoint, check it, record it.

The only diffill command that connects to a model hub. It uses the standard
``huggingface_hub`` client (``pip install 'diffill[hub]'``): downloads are cached
(``HF_HOME`` / ``HF_HUB_CACHE``) and resumable (an interrupted file continues where it
stopped, in the same run or the next), the token comes from ``HF_TOKEN`` (or
``huggingface-cli login``), and ``HF_ENDPOINT`` points it at another hub.

Only the files diffill reads are fetched: ``config.json``, the tokenizer
(``tokenizer.json``, or the slow layout ``vocab.json`` + ``merges.txt`` +
``added_tokens.json``) with ``tokenizer_config.json`` / ``special_tokens_map.json``, and
the safetensors weights (``model.safetensors``, or the shards the index names) -- no
remote code, no ``.bin`` files. The checkpoint is then checked the way the loader checks
it before reading any tensor (config, tokenizer, recipe, every safetensors header,
tensor names and shapes), and only then recorded (:mod:`diffill.model.pulled`), so
``--model NAME`` never picks up a half-written or broken download; with ``--dir D`` the
files are written to ``D.partial`` and renamed to ``D`` once checked.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt")
INDEX = "model.safetensors.index.json"


class PullError(RuntimeError):
    """A pull that cannot finish; the message says why and what to do."""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "pull",
        help="download a published checkpoint (the only command that goes online)",
        description=(
            "Download a published diffusion code model with huggingface_hub (cached, "
            "resumable, HF_TOKEN), only the files diffill needs, check it as the loader does, "
            "and print the --model value to use. NAME is a short name (see --list) or a "
            "Hugging Face repo id."
        ),
    )
    p.add_argument("name", nargs="?", metavar="NAME|REPO_ID", help="short name or owner/repo")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument("--dir", default=None, metavar="D",
                   help="put the checkpoint in folder D instead of the Hugging Face cache")
    p.add_argument("--list", action="store_true",
                   help="list the short names with memory and latency budget, and exit")
    return p


def list_models() -> str:
    from ...model.pulled import PUBLISHED  # diffill.model imports torch: not for --list

    rows = [f"{'name':<24} {'repository':<38} {'bf16 weights':>12} {'plan GPU':>9} {'budget':>7}"]
    for m in PUBLISHED:
        rows.append(f"{m.name:<24} {m.repo_id:<38} {m.bf16_gib:>9.1f} GiB {m.gpu_gib:>5.0f} GiB "
                    f"{m.budget_ms:>5.0f}ms")
    return "\n".join(rows)


def choose_files(siblings: list[str]) -> list[str]:
    """The files of a repository diffill needs (the index's shards come later)."""
    have = set(siblings)
    if "config.json" not in have:
        raise PullError("the repository has no config.json")
    if "tokenizer.json" not in have and not {"vocab.json", "merges.txt"} <= have:
        raise PullError("the repository has no tokenizer.json, nor vocab.json + merges.txt")
    files = ["config.json", *[f for f in TOKENIZER_FILES if f in have]]
    if INDEX in have:
        files.append(INDEX)
    elif "model.safetensors" in have:
        files.append("model.safetensors")
    else:
        other = sorted(f for f in have if f.endswith((".bin", ".pt", ".pth", ".gguf")))
        hint = f" (it has {', '.join(other[:3])}: diffill loads safetensors only)" if other else ""
        raise PullError(f"the repository has no model.safetensors or {INDEX}{hint}")
    return files


def shards_of(index_path: Path, siblings: list[str]) -> list[str]:
    try:
        wm = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PullError(f"{INDEX} is not a valid index ({e})") from None
    shards = sorted(set(wm.values()))
    missing = [s for s in shards if s not in siblings]
    if missing:
        raise PullError(f"{INDEX} names {', '.join(missing[:3])}, which the repository lacks")
    return shards


def _explain(e: BaseException, repo: str, revision: str | None) -> str:
    """A one-line message for a hub error."""
    from huggingface_hub import errors  # optional dependency (diffill[hub])

    if isinstance(e, errors.RevisionNotFoundError):
        return f"{repo}: revision {revision!r} not found"
    if isinstance(e, errors.GatedRepoError):
        return f"{repo}: the repository is gated; accept its terms on the hub and set HF_TOKEN"
    if isinstance(e, errors.RepositoryNotFoundError):
        return (f"{repo}: repository not found (check the name; a private repository needs "
                f"HF_TOKEN)")
    if isinstance(e, errors.EntryNotFoundError):
        return f"{repo}: a listed file is missing on the hub ({e})".splitlines()[0]
    if isinstance(e, errors.LocalEntryNotFoundError):
        return (f"{repo}: the hub could not be reached and the file is not cached "
                f"({str(e).splitlines()[0]})")
    return f"{repo}: download failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def pull(spec: str, revision: str | None = None, dest: str | None = None) -> dict[str, Any]:
    """Download, check and record; returns the registry entry. Raises PullError."""
    import huggingface_hub as hh  # optional dependency (diffill[hub]): only this command

    from ...model.loader import check_checkpoint  # torch, for the check: not for --list
    from ...model.pulled import published, record_pull  # as above

    row = published(spec)
    repo = row.repo_id if row is not None else spec
    if "/" not in repo:
        raise PullError(f"{spec!r} is neither a known short name nor a repo id (owner/name); "
                        f"see diffill pull --list")
    api = hh.HfApi()
    try:
        info = api.model_info(repo, revision=revision)
        siblings = [s.rfilename for s in info.siblings or []]
        commit = info.sha
        files = choose_files(siblings)
        target = Path(dest).expanduser().resolve() if dest else None
        partial = target.with_name(target.name + ".partial") if target else None
        if target is not None and target.exists():
            raise PullError(f"{target} already exists; remove it or pick another --dir")

        def fetch(name: str) -> Path:
            return Path(hh.hf_hub_download(repo, name, revision=commit or revision,
                                           local_dir=partial))

        paths = [fetch(f) for f in files]
        if INDEX in files:
            paths += [fetch(s) for s in shards_of(paths[files.index(INDEX)], siblings)]
    except PullError:
        raise
    except Exception as e:  # huggingface_hub / httpx errors: one clear line
        raise PullError(_explain(e, repo, revision)) from None
    folder = paths[0].parent
    try:
        cfg = check_checkpoint(folder)
    except (ValueError, MemoryError) as e:
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        raise PullError(f"{repo}: downloaded, but it does not load: {e}") from None
    if target is not None and partial is not None:
        partial.rename(target)
        folder = target
    entry = {
        "name": row.name if row is not None else None,
        "repo_id": repo,
        "revision": revision or "main",
        "commit": commit,
        "path": str(folder),
        "files": sorted(p.name for p in folder.iterdir() if p.is_file()),
        "recipe": cfg.recipe.name if cfg.recipe is not None else None,
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    record_pull(entry)
    return entry


def run(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        print(list_models())
        return 0 if args.list else 2
    try:
        import huggingface_hub  # noqa: F401  (optional: the one place diffill goes online)
    except ImportError:
        print("diffill pull needs huggingface_hub: pip install 'diffill[hub]'", file=sys.stderr)
        return 2
    from ...model.pulled import published  # torch: not for --list

    try:
        entry = pull(args.name, args.revision, args.dir)
    except PullError as e:
        print(f"diffill pull: {e}", file=sys.stderr)
        return 1
    row = published(args.name)
    use = entry["path"] if args.dir else (row.name if row is not None else entry["repo_id"])
    print(f"diffill pull: {entry['repo_id']} @ {entry['revision']} (commit {entry['commit']}) "
          f"checked, recipe {entry['recipe']}")
    print(f"  folder: {entry['path']}")
    print(f"  use:    --model {use}")
    if row is not None:
        print(f"  memory: {row.bf16_gib:.1f} GiB of weights in bf16; plan for ~{row.gpu_gib:.0f} GiB "
              f"of GPU memory; latencyBudgetMs {row.budget_ms:.0f}")
    return 0
