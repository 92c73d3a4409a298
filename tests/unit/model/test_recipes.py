"""The recipe table: every row cites a source, the chooser's rules, resolution errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from diffill.model.recipes import (
    RECIPES,
    CheckpointFacts,
    RecipeError,
    choose_recipe,
    resolve_recipe,
)

QWEN = frozenset({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})


def facts(model_type="", arch=(), added=frozenset(), mask=True):
    return CheckpointFacts(model_type, tuple(arch), frozenset(added), mask)


def test_every_row_cites_where_it_was_read():
    assert all(r.sources for r in RECIPES)
    assert len({r.name for r in RECIPES}) == len(RECIPES)


@pytest.mark.parametrize("f,name", [
    (facts("dream", ["DreamModel"], QWEN | {"<|mask|>"}), "dream"),
    (facts("dream", ["DreamModel"], QWEN | {"<|dlm_pad|>"}), "diffucoder-instruct"),
    (facts("dream", ["DreamModel"], QWEN | {"<|expand|>", "<|delete|>"}), "dreamon"),
    (facts("", ["DreamModel"], QWEN), "dream"),
    (facts("qwen2", ["Qwen2ForCausalLM"], QWEN | {"<M>"}), "open-dcoder"),
    (facts("qwen2", ["Qwen2ForCausalLM"], {"<|bos|>"}), "generic"),  # not a Qwen vocabulary
    (facts("coda", ["CoDALanguageModel"], QWEN), "coda"),
    (facts("qwen3", ["Qwen3ForCausalLM"], QWEN), "coda"),
    (facts("llada", ["LLaDAModelLM"], {"<|startoftext|>", "<|endoftext|>", "<|eot_id|>"}), "llada"),
    (facts("llada", ["LLaDAModelLM"], {"<|bos|>"}), "generic"),  # not LLaDA's tokenizer
    (facts("diffill"), "diffill"),
    (facts("llama", ["LlamaForCausalLM"]), "generic"),
])
def test_chooser(f, name):
    row, why = choose_recipe(f)
    assert row.name == name and why


def test_resolution_names_the_missing_token():
    row, why = choose_recipe(facts("dream", ["DreamModel"], QWEN | {"<|dlm_pad|>"}))
    ids = {"<|dlm_pad|>": 9, "<|im_end|>": 8}
    r = resolve_recipe(row, why, token_to_id=ids.get, roles={"bos": 1, "eos": 2, "pad": 2,
                                                              "mask": 3}, vocab_size=16)
    assert (r.start, r.end, r.filler, r.mask) == ((1,), (2,), 9, 3)
    assert r.terminators == (9, 2, 8)
    with pytest.raises(RecipeError, match="terminator '<\\|dlm_pad\\|>'"):
        resolve_recipe(row, why, token_to_id={}.get, roles={"bos": 1, "eos": 2, "mask": 3},
                       vocab_size=16)
    with pytest.raises(RecipeError, match="outside the embedding table"):
        resolve_recipe(row, why, token_to_id=ids.get, roles={"bos": 1, "eos": 2, "mask": 30},
                       vocab_size=16)


def test_cross_file_format_is_qwen_repo_only_with_its_tokens():
    from diffill.model.recipes import BY_NAME

    assert {r.name for r in RECIPES if r.cross_file == "qwen-repo"} == {
        "dreamon", "diffucoder-instruct", "dream", "open-dcoder"}
    row = BY_NAME["dream"]
    roles = {"bos": 1, "eos": 2, "pad": 3, "mask": 4}
    with_tokens = {"<|repo_name|>": 10, "<|file_sep|>": 11}.get
    assert resolve_recipe(row, "", token_to_id=with_tokens, roles=roles,
                          vocab_size=16).cross_file == "qwen-repo"
    assert resolve_recipe(row, "", token_to_id={}.get, roles=roles,
                          vocab_size=16).cross_file == "comment"
    assert resolve_recipe(BY_NAME["diffill"], "", token_to_id=with_tokens, roles=roles,
                          vocab_size=16).cross_file == "comment"


def test_recipes_import_without_torch():
    """The text side reads the recipe table at ``initialize``: importing it (and the model
    package, whose loader names come on first use) must not import torch."""
    code = ("import sys, diffill.model, diffill.model.recipes; "
            "print('torch' in sys.modules); from diffill.model import load_model; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
