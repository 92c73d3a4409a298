"""``diffill pull NAME|REPO_ID``: fetch a published checkpoint, check it, record it.

The only diffill command that connects to a model hub. It asks the hub through the
standard ``huggingface_hub`` client (``pip install 'diffill[hub]'``) for the repository's
file list and each file's metadata, and downloads the files itself, so that every wait is
bounded and an interrupted file continues from the bytes already on disk, in the same run
(a cut connection is retried up to 5 times) or the next. Files land in the Hugging Face
cache (``HF_HOME`` / ``HF_HUB_CACHE``, its usual layout: ``blobs/``, ``snapshots/``,
``refs/``; a partial file is ``blobs/<etag>.incomplete``) or, with ``--dir D``, in
``D.partial`` (renamed to ``D`` once checked). The token comes from ``HF_TOKEN`` (or
``huggingface-cli login``; it is not sent on to another host a download redirects to),
and ``HF_ENDPOINT`` points it at another hub.

Timeouts: each metadata call waits at most ``--timeout`` seconds (else
``HF_HUB_ETAG_TIMEOUT``, else 10) for the hub to connect and answer, and a download at most
``--timeout`` (else ``HF_HUB_DOWNLOAD_TIMEOUT``, else 10) seconds for its next bytes -- a
slow download that keeps sending is never cut. Before each wait the command says on stderr
what it waits for; a timeout ends it at once with one line naming the endpoint, what did not
answer and how to raise the limit. Exit status: 0 pulled and checked, 1 the pull failed
(network, hub refusal or timeout, or a checkpoint that does not load; one line on stderr),
2 usage (or ``huggingface_hub`` is not installed).

Only the files diffill reads are fetched: ``config.json``, the tokenizer
(``tokenizer.json``, or the slow layout ``vocab.json`` + ``merges.txt`` +
``added_tokens.json``) with ``tokenizer_config.json`` / ``special_tokens_map.json``, and
the safetensors weights (``model.safetensors``, or the shards the index names) -- no
remote code, no ``.bin`` files. Each file is checked against the size the hub announced
(and its sha256, when the hub's etag is one); the checkpoint is then checked the way the
loader checks it before reading any tensor (config, tokenizer, recipe, every safetensors
header, tensor names and shapes), and only then recorded (:mod:`diffill.model.pulled`), so
``--model NAME`` never picks up a half-written or broken download. A bare ``--model NAME``
means the most recent successful pull of NAME, whatever its revision; ``--model NAME@REV``
(a branch, tag or commit) picks one revision, and a ``--revision`` pull prints that form.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt")
INDEX = "model.safetensors.index.json"
DEFAULT_TIMEOUT_S = 10.0  # huggingface_hub's own default for both waits
RETRIES = 5  # a cut connection is retried this often per file, each time from the bytes on disk
CHUNK = 1 << 20
PROGRESS_S = 30.0  # a progress line on stderr this often during a download
_SHA256 = re.compile(r"[0-9a-f]{64}")


class PullError(RuntimeError):
    """A pull that cannot finish; the message says why and what to do."""


class HubTimeout(PullError):
    """The hub accepted (or did not accept) the connection and did not answer in time."""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "pull",
        help="download a published checkpoint (the only command that goes online)",
        description=(
            "Download a published diffusion code model (file list and metadata through "
            "huggingface_hub, HF_TOKEN, HF_ENDPOINT; cached; an interrupted file continues "
            "where it stopped, in this run or the next), only the files diffill needs, check "
            "it as the loader does, and print the --model value to use. NAME is a short name "
            "(see --list) or a Hugging Face repo id. Exit status: 0 pulled, 1 the pull failed "
            "(network, timeout, hub refusal, a checkpoint that does not load), 2 usage."
        ),
    )
    p.add_argument("name", nargs="?", metavar="NAME|REPO_ID", help="short name or owner/repo")
    p.add_argument("--revision", default=None,
                   help="branch, tag or commit (default: main); use the pull with "
                        "--model NAME@REVISION (a bare NAME is the most recent pull)")
    p.add_argument("--dir", default=None, metavar="D",
                   help="put the checkpoint in folder D instead of the Hugging Face cache")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds to wait for the hub to answer a metadata call, and for the "
                        "next bytes of a download (default: HF_HUB_ETAG_TIMEOUT and "
                        "HF_HUB_DOWNLOAD_TIMEOUT, else 10)")
    p.add_argument("--no-prepare", action="store_true",
                   help="do not prepare the int8 CPU weights after the download (by default, "
                        "on a machine without CUDA, they are quantized and cached now so that "
                        "the first `diffill serve` is ready in seconds)")
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


def timeouts(option: float | None = None) -> tuple[float, float]:
    """(metadata, download) timeouts in seconds: ``--timeout``, else huggingface_hub's own
    ``HF_HUB_ETAG_TIMEOUT`` / ``HF_HUB_DOWNLOAD_TIMEOUT``, else 10."""
    def env(name: str) -> float:
        try:
            v = float(os.environ.get(name, ""))
        except ValueError:
            return DEFAULT_TIMEOUT_S
        return v if v > 0 else DEFAULT_TIMEOUT_S

    if option is not None:
        return option, option
    return env("HF_HUB_ETAG_TIMEOUT"), env("HF_HUB_DOWNLOAD_TIMEOUT")


def _is_timeout(e: BaseException | None) -> bool:
    """A timeout from any layer (socket, urllib, requests, httpx/httpx2), however wrapped."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, TimeoutError) or any("Timeout" in c.__name__ for c in type(e).__mro__):
            return True
        if (isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException)
                and _is_timeout(e.reason)):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


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


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e10 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


class _NoAuthElsewhere(urllib.request.HTTPRedirectHandler):
    """Follows redirects (the hub sends large files to a CDN) without the token."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_NoAuthElsewhere)


def download(url: str, headers: dict[str, str], part: Path, size: int | None, *,
             read_timeout: float, what: str, endpoint: str,
             say: Callable[[str], None]) -> None:
    """Append to ``part`` the bytes of ``url`` it lacks (``Range``), until it holds ``size``.

    Connecting and each read wait at most ``read_timeout`` seconds: a stall raises
    :class:`HubTimeout` at once (the bytes stay on disk for the next run); a cut connection
    or a short body is retried up to :data:`RETRIES` times, each from the bytes on disk."""
    cuts = 0
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(url)) if urlsplit(url).netloc else endpoint
    while True:
        answered = False
        have = part.stat().st_size if part.exists() else 0
        if size is not None and have > size:  # not this file's bytes: start over
            part.unlink()
            have = 0
        if size is not None and have == size:
            return
        req = urllib.request.Request(url, headers={**headers, "Accept-Encoding": "identity",
                                                   **({"Range": f"bytes={have}-"} if have else {})})
        try:
            with _OPENER.open(req, timeout=read_timeout) as r, part.open("ab") as f:
                answered = True
                if have and r.status != 206:  # the server ignored the Range: all of it again
                    f.truncate(0)
                shown = time.monotonic()
                while chunk := r.read1(CHUNK):
                    f.write(chunk)
                    if time.monotonic() - shown > PROGRESS_S:  # a sign of life on long downloads
                        shown = time.monotonic()
                        say(f"{what}: {_mb(f.tell())} of {_mb(size) if size else '?'} ...")
        except urllib.error.HTTPError as e:
            if e.code == 416 and have:  # more on disk than the file has: start over
                part.unlink()
                continue
            raise
        except Exception as e:
            got = part.stat().st_size if part.exists() else 0
            if _is_timeout(e):
                waited = (f"stopped sending {what} (no bytes for {read_timeout:g} s" if answered
                          else f"did not answer within {read_timeout:g} s (the download of {what}")
                raise HubTimeout(
                    f"{origin} {waited}; {_mb(got)} of {_mb(size) if size else '?'} on disk, the "
                    f"next run continues from there); raise the limit with --timeout S or "
                    f"HF_HUB_DOWNLOAD_TIMEOUT=S") from None
            if not isinstance(e, (OSError, http.client.HTTPException)):
                raise
            cut = f"{type(e).__name__}: {e}".splitlines()[0]
        else:
            got = part.stat().st_size
            if size is None or got == size:
                return
            cut = f"the connection closed at {_mb(got)} of {_mb(size)}"
        cuts += 1
        if cuts > RETRIES:
            raise PullError(f"download failed: {what}, {cuts} tries from {origin}, the last: {cut} "
                            f"({_mb(got)} on disk, the next run continues from there)")
        say(f"{what}: {cut}; continuing at {_mb(got)} (retry {cuts} of {RETRIES})")
        time.sleep(0.5)


def _check_blob(part: Path, size: int | None, etag: str, what: str) -> None:
    if size is not None and part.stat().st_size != size:
        raise PullError(f"{what}: {part.stat().st_size} bytes, the hub announced {size}")
    if _SHA256.fullmatch(etag):  # LFS files: the etag is the content's sha256
        h = hashlib.sha256()
        with part.open("rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if h.hexdigest() != etag:
            part.unlink()
            raise PullError(f"{what}: the download does not match its sha256 ({etag[:12]}...); "
                            f"removed, run the pull again")


def _link(blob: Path, pointer: Path) -> None:
    """``snapshots/<commit>/<file>`` -> ``blobs/<etag>``, the cache's layout (a move where
    the file system has no symlinks)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(pointer.name + ".link")
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(os.path.relpath(blob, pointer.parent))
        os.replace(tmp, pointer)
    except OSError:
        tmp.unlink(missing_ok=True)
        shutil.move(str(blob), str(pointer))


def pull(spec: str, revision: str | None = None, dest: str | None = None,
         timeout: float | None = None,
         say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Download, check and record; returns the registry entry. Raises PullError
    (:class:`HubTimeout` when the hub did not answer in time). ``say`` gets the progress
    lines (what is being waited for); default: stderr."""
    import huggingface_hub as hh  # optional dependency (diffill[hub]): only this command
    from huggingface_hub import constants as hh_constants  # as above
    from huggingface_hub.utils import build_hf_headers, get_session  # as above

    from ...model.loader import check_checkpoint  # torch, for the check: not for --list
    from ...model.pulled import published, record_pull  # as above

    if say is None:
        def say(line: str) -> None:
            print(f"diffill pull: {line}", file=sys.stderr, flush=True)

    row = published(spec)
    repo = row.repo_id if row is not None else spec
    if "/" not in repo:
        raise PullError(f"{spec!r} is neither a known short name nor a repo id (owner/name); "
                        f"see diffill pull --list")
    if timeout is not None and not timeout > 0:
        raise PullError(f"--timeout must be > 0 seconds, got {timeout:g}")
    meta_t, read_t = timeouts(timeout)
    endpoint = (os.environ.get("HF_ENDPOINT") or hh_constants.ENDPOINT).rstrip("/")
    target = Path(dest).expanduser().resolve() if dest else None
    partial = target.with_name(target.name + ".partial") if target else None
    if target is not None and target.exists():
        raise PullError(f"{target} already exists; remove it or pick another --dir")
    meta_hint = "raise the limit with --timeout S or HF_HUB_ETAG_TIMEOUT=S"

    def hub_call(what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as e:
            if _is_timeout(e):
                raise HubTimeout(f"{endpoint} did not answer within {meta_t:g} s ({what}); "
                                 f"{meta_hint}") from None
            raise

    try:
        get_session()  # the client's set-up (TLS context, ...) before the wait is timed
        say(f"asking {endpoint} for {repo}@{revision or 'main'} (the file list; waits up to "
            f"{meta_t:g} s) ...")
        info = hub_call(f"the file list of {repo}@{revision or 'main'}",
                        lambda: hh.HfApi(endpoint=endpoint).model_info(
                            repo, revision=revision, timeout=meta_t))
        siblings = [s.rfilename for s in info.siblings or []]
        commit = info.sha
        files = choose_files(siblings)
        storage = Path(hh_constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
        if partial is not None:
            partial.mkdir(parents=True, exist_ok=True)
            mark = partial / ".diffill-commit"
            if mark.is_file() and mark.read_text().strip() != str(commit):
                shutil.rmtree(partial)  # another commit's files: not these
                partial.mkdir(parents=True)
            mark.write_text(str(commit))

        def fetch(name: str) -> Path:
            nonlocal commit
            final = (partial / name) if partial is not None else (
                storage / "snapshots" / str(commit) / name if commit else None)
            if final is not None and final.is_file():
                return final  # fetched by an earlier run
            url = hh.hf_hub_url(repo, name, revision=commit or revision, endpoint=endpoint)
            say(f"fetching {name}: asking {endpoint} for its size and etag (waits up to "
                f"{meta_t:g} s) ...")
            meta = hub_call(f"the metadata of {name}",
                            lambda: hh.get_hf_file_metadata(url, timeout=meta_t))
            if not meta.etag:
                raise PullError(f"{repo}: the hub sent no etag for {name}")
            if commit is None:
                commit = meta.commit_hash
                if commit is None:
                    raise PullError(f"{repo}: the hub names no commit for {revision or 'main'}")
            if partial is not None:
                final, part = partial / name, partial / (name + ".incomplete")
            else:
                final = storage / "snapshots" / commit / name
                part = storage / "blobs" / f"{meta.etag}.incomplete"
            blob = part.with_suffix("") if partial is None else final
            if not blob.is_file():
                part.parent.mkdir(parents=True, exist_ok=True)
                have = part.stat().st_size if part.is_file() else 0
                host = urlsplit(meta.location).netloc or endpoint
                size = f"{_mb(meta.size)}" if meta.size is not None else "size unknown"
                say(f"continuing {name} at {_mb(have)} of {size} from {host} ..." if have else
                    f"downloading {name} ({size}) from {host} (waits up to {read_t:g} s for "
                    f"each read) ...")
                hdrs = build_hf_headers()
                if urlsplit(meta.location).netloc != urlsplit(endpoint).netloc:
                    hdrs.pop("authorization", None)
                    hdrs.pop("Authorization", None)
                download(meta.location, hdrs, part, meta.size, read_timeout=read_t,
                         what=name, endpoint=endpoint, say=say)
                _check_blob(part, meta.size, meta.etag, f"{repo}: {name}")
                os.replace(part, blob)
            if partial is None:
                _link(blob, final)
            return final

        paths = [fetch(f) for f in files]
        if INDEX in files:
            paths += [fetch(s) for s in shards_of(paths[files.index(INDEX)], siblings)]
    except PullError:
        raise
    except Exception as e:  # huggingface_hub / HTTP errors: one clear line
        if isinstance(e, urllib.error.HTTPError):
            raise PullError(_explain_http(e, repo)) from None
        raise PullError(_explain(e, repo, revision)) from None
    if partial is None and commit and revision and revision != commit:
        ref = storage / "refs" / revision  # as the client records a branch or tag
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    folder = paths[0].parent
    say("checking the checkpoint ...")
    try:
        cfg = check_checkpoint(folder)
    except (ValueError, MemoryError) as e:
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        raise PullError(f"{repo}: downloaded, but it does not load: {e}") from None
    if target is not None and partial is not None:
        (partial / ".diffill-commit").unlink(missing_ok=True)
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


def _explain_http(e: urllib.error.HTTPError, repo: str) -> str:
    name = urlsplit(e.url or "").path.rsplit("/", 1)[-1]
    if e.code == 404:
        return f"{repo}: a listed file is missing on the hub ({name}: 404)"
    if e.code in (401, 403):
        return (f"{repo}: the hub refused {name} ({e.code}); a gated or private repository "
                f"needs HF_TOKEN")
    return f"{repo}: download failed ({name}: HTTP {e.code} {e.reason})"


def run(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        print(list_models())
        return 0 if args.list else 2
    if args.timeout is not None and not args.timeout > 0:
        print(f"diffill pull: --timeout must be > 0 seconds, got {args.timeout:g}", file=sys.stderr)
        return 2
    try:
        import huggingface_hub  # noqa: F401  (optional: the one place diffill goes online)
    except ImportError:
        print("diffill pull needs huggingface_hub: pip install 'diffill[hub]'", file=sys.stderr)
        return 2
    from ...model.pulled import published  # torch: not for --list

    try:
        entry = pull(args.name, args.revision, args.dir, timeout=args.timeout)
    except PullError as e:
        print(f"diffill pull: {e}", file=sys.stderr)
        return 1
    row = published(args.name)
    use = entry["path"] if args.dir else (row.name if row is not None else entry["repo_id"])
    if args.revision and not args.dir:
        use += f"@{args.revision}"  # a bare name is the most recent pull, whichever revision
    print(f"diffill pull: {entry['repo_id']} @ {entry['revision']} (commit {entry['commit']}) "
          f"checked, recipe {entry['recipe']}")
    print(f"  folder: {entry['path']}")
    print(f"  use:    --model {use}")
    if row is not None:
        print(f"  memory: {row.bf16_gib:.1f} GiB of weights in bf16; plan for ~{row.gpu_gib:.0f} GiB "
              f"of GPU memory; latencyBudgetMs {row.budget_ms:.0f}")
    if not args.no_prepare:
        print("diffill pull: preparing the CPU weights ...", file=sys.stderr, flush=True)
        try:
            note = prepare_cpu(Path(entry["path"]))
        except Exception as e:  # pulled and checked already: the first start prepares them
            print(f"diffill pull: the int8 CPU weights were not prepared ({e}); the first "
                  f"start on a CPU quantizes them", file=sys.stderr)
        else:
            if note:
                print(f"  cpu:    {note}")
    return 0


def prepare_cpu(folder: Path) -> str | None:
    """Quantize ``folder``'s checkpoint for the CPU now and cache it (:mod:`diffill.model.int8_cache`,
    as the first CPU load would), so that the first ``diffill serve`` reads int8 weights in
    seconds instead of quantizing them: the 0.5B shape's first start took 10-15 s against ~4.5 s
    with the cache (BENCHMARKS.md), a 7B one minutes. Like llama.cpp's conversion to GGUF, done
    once when the model is installed. None (nothing done) where a CUDA device is present (the
    GPU keeps the checkpoint's dtype) or the model stays fp32 on a CPU (small models)."""
    import torch  # the model itself: only after a successful pull

    from ...model.loader import load_model  # torch: as above

    if torch.cuda.is_available():
        return None
    t0 = time.perf_counter()
    lm = load_model(folder, device="cpu")
    if lm.model.weights != "int8":
        return None
    return f"int8 weights prepared and cached in {time.perf_counter() - t0:.1f} s"
