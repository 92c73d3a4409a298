"""model/loader.py: running out of memory while mapping or reading the weights is
reported as out of memory (MemoryError), not as a truncated or corrupt checkpoint."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from diffill.model import checkpoint_files
from diffill.model.loader import CheckpointError, load_model


@pytest.mark.parametrize("when", ["header", "read"])
def test_enomem_while_mapping_is_a_memory_error(scripted_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                 when: str):
    real = checkpoint_files.safe_open

    def failing(path, framework, **kw):
        if (when == "header") == ("device" not in kw):
            if when == "header":
                raise OSError(errno.ENOMEM, "Cannot allocate memory")
            raise RuntimeError("Error while deserializing: Cannot allocate memory (os error 12)")
        return real(path, framework=framework, **kw)

    monkeypatch.setattr(checkpoint_files, "safe_open", failing)
    with pytest.raises(MemoryError, match="out of memory") as e:
        load_model(str(scripted_model_dir))
    assert "corrupt" not in str(e.value)


def test_a_corrupt_file_is_still_a_checkpoint_error(scripted_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    def corrupt(path, framework, **kw):
        raise RuntimeError("Error while deserializing header: HeaderTooLarge")

    monkeypatch.setattr(checkpoint_files, "safe_open", corrupt)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(str(scripted_model_dir))
