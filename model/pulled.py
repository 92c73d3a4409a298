"""Published checkpoints by short name, and the local registry of pulled ones.

``diffill pull NAME`` (:mod:`diffill.lsp_server.commands.pull`, the only code that
ever connects to a model hub) downloads a checkpoint, checks it as the loader does and
then records it here. ``--model NAME`` / ``load_model("NAME")`` resolve through
:func:`resolve_pulled`, which only reads the registry file: nothing in this module
touches the network, and a checkpoint whose pull did not finish and pass its checks is
never recorded, so it is never picked up.

The registry is one JSON file, ``pulled.json``, in :func:`registry_dir`
(``$DIFFILL_HOME``, else ``$XDG_CACHE_HOME/diffill``, else ``~/.cache/diffill``),
rewritten atomically (temporary file + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTRY_FILE = "pulled.json"


@dataclass(frozen=True)
class PublishedModel:
    """A published checkpoint diffill knows by a short name."""

    name: str
    repo_id: str
    params_b: float  # parameters, billions (the model card's figure)
    budget_ms: float  # latency budget we recommend on a current data-centre GPU
    recipe: str  # the family recipe the loader will pick (model/recipes.py)
    note: str = ""

    @property
    def bf16_gib(self) -> float:
        """Weights in bf16 (2 bytes a parameter), GiB."""
        return self.params_b * 1e9 * 2 / 2**30

    @property
    def gpu_gib(self) -> float:
        """Device memory to plan for: the weights plus ~25% for activations, the CUDA
        context and the allocator's slack (a few short canvases at a time)."""
        return self.bf16_gib * 1.25 + 0.5


# Budgets: one denoising step reads every weight once, so a step costs at least
# bytes / bandwidth (H100/H200: 3.3-4.8 TB/s): ~0.3 ms for 0.5B, ~1 ms for 1.7B, ~4 ms
# for 7-8B in bf16. A budget buys ~8 steps at about twice that floor.
PUBLISHED: tuple[PublishedModel, ...] = (
    PublishedModel("open-dcoder-0.5b", "fredzzp/open-dcoder-0.5B", 0.49, 25.0, "open-dcoder",
                   "smallest; HumanEval-Infilling 32.5 fixed length, 77.4 with the true length"),
    PublishedModel("coda-1.7b", "Salesforce/CoDA-v0-Instruct", 1.7, 25.0, "coda",
                   "no published infilling recipe (plain canvas)"),
    PublishedModel("dream-coder-7b", "Dream-org/Dream-Coder-v0-Instruct-7B", 7.62, 60.0, "dream",
                   "HumanEval-Infilling 55.3 (fixed length)"),
    PublishedModel("dream-coder-7b-base", "Dream-org/Dream-Coder-v0-Base-7B", 7.62, 60.0, "dream"),
    PublishedModel("diffucoder-7b", "apple/DiffuCoder-7B-cpGRPO", 7.62, 60.0,
                   "diffucoder-instruct", "HumanEval-Infilling 54.8 (fixed length)"),
    PublishedModel("diffucoder-7b-instruct", "apple/DiffuCoder-7B-Instruct", 7.62, 60.0,
                   "diffucoder-instruct"),
    PublishedModel("diffucoder-7b-base", "apple/DiffuCoder-7B-Base", 7.62, 60.0, "dream"),
    PublishedModel("dreamon-7b", "Dream-org/DreamOn-v0-7B", 7.62, 120.0, "dreamon",
                   "grows/shrinks the hole itself; one token a step, so give it more time"),
    PublishedModel("dream-7b", "Dream-org/Dream-v0-Instruct-7B", 7.62, 60.0, "dream"),
    PublishedModel("dream-7b-base", "Dream-org/Dream-v0-Base-7B", 7.62, 60.0, "dream"),
    PublishedModel("llada-8b", "GSAI-ML/LLaDA-8B-Instruct", 8.02, 60.0, "llada"),
    PublishedModel("llada-8b-base", "GSAI-ML/LLaDA-8B-Base", 8.02, 60.0, "llada"),
)
BY_SHORT_NAME: dict[str, PublishedModel] = {m.name: m for m in PUBLISHED}


def published(name_or_repo: str) -> PublishedModel | None:
    """The table's row for a short name or a repo id (case-insensitive), if any."""
    key = name_or_repo.lower()
    for m in PUBLISHED:
        if key in (m.name, m.repo_id.lower()):
            return m
    return None


def registry_dir() -> Path:
    if os.environ.get("DIFFILL_HOME"):
        return Path(os.environ["DIFFILL_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "diffill"


def _registry_path() -> Path:
    return registry_dir() / REGISTRY_FILE


def read_registry() -> list[dict[str, Any]]:
    """The recorded pulls (newest last); an unreadable registry reads as empty."""
    p = _registry_path()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries or [] if isinstance(e, dict)]


def record_pull(entry: dict[str, Any]) -> Path:
    """Add (or replace, same repo and revision) a finished, checked pull; atomic rewrite."""
    entries = [e for e in read_registry()
               if (e.get("repo_id"), e.get("revision")) != (entry["repo_id"], entry["revision"])]
    entries.append(entry)
    p = _registry_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".pulled-", suffix=".json", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"entries": entries}, f, indent=2)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def resolve_pulled(spec: str) -> Path | None:
    """The folder of a pulled checkpoint named ``spec`` (short name, ``owner/repo`` or
    either with ``@revision``: a branch, tag or commit), newest first; None when nothing of
    that name was pulled or its folder is gone. Reads only the local registry.

    A bare name means the most recent successful pull of that repository, whatever its
    revision (:func:`record_pull` moves a pull of a revision pulled before to the end);
    ``NAME@REV`` the pull of that revision."""
    name, _, revision = spec.partition("@")
    row = published(name)
    repo = row.repo_id if row is not None else name
    for e in reversed(read_registry()):
        same_repo = str(e.get("repo_id", "")).lower() == repo.lower() or e.get("name") == name
        if not same_repo or (revision and revision not in (e.get("revision"), e.get("commit"))):
            continue
        path = Path(str(e.get("path", "")))
        if (path / "config.json").is_file():
            return path
    return None
