"""Options: camelCase wire names, per-field validation, errors naming the field."""

from __future__ import annotations

import msgspec
import pytest
from diffill.lsp_server.completion.completer import options_from_kwargs
from diffill.lsp_server.completion.options import (
    CompletionOptions,
    extract_settings,
    merge_options,
    options_from,
)
from support import ROOT


def test_wire_names_are_camel_case():
    wire = msgspec.to_builtins(CompletionOptions())
    for key in ("modelPath", "latencyBudgetMs", "maxTokens", "contextTokens", "numCandidates",
                "multiline", "enabled", "device"):
        assert key in wire
    assert wire["latencyBudgetMs"] is None  # the backend's device decides (25 ms GPU, 200 ms CPU)


def test_settings_under_diffill_key_or_top_level():
    assert extract_settings({"diffill": {"maxTokens": 8}, "other": 1}) == {"maxTokens": 8}
    assert extract_settings({"maxTokens": 8, "pylsp": {}}) == {"maxTokens": 8}
    assert extract_settings(None) == {}
    assert extract_settings([1, 2]) == {}


def test_good_values_applied():
    o, errors = options_from({"diffill": {"maxTokens": 8, "multiline": "always-single",
                                          "modelPath": "/m", "latencyBudgetMs": 40}})
    assert errors == []
    assert (o.max_tokens, o.multiline, o.model_path, o.latency_budget_ms) == (8, "always-single", "/m", 40.0)


@pytest.mark.parametrize(
    "key,value",
    [
        ("maxTokens", "many"),
        ("maxTokens", 0),
        ("latencyBudgetMs", -5),
        ("multiline", "never"),
        ("numCandidates", 100),
        ("contextTokens", 1.5),
        ("enabled", "yes"),
        ("prefixFraction", 2.0),
    ],
)
def test_bad_value_is_named_and_previous_value_kept(key, value):
    prev = CompletionOptions(max_tokens=12)
    o, errors = merge_options(prev, {key: value, "device": "cuda"})
    assert len(errors) == 1 and repr(key) in errors[0]
    assert msgspec.to_builtins(o)[key] == msgspec.to_builtins(prev)[key]
    assert o.device == "cuda"  # the good field in the same message still applies


def test_unknown_key_reported():
    o, errors = merge_options(CompletionOptions(), {"maxTokenz": 3})
    assert o == CompletionOptions()
    assert errors and "maxTokenz" in errors[0] and "unknown" in errors[0]


def test_kwargs_helper_raises_with_field_name():
    assert options_from_kwargs(max_tokens=7).max_tokens == 7
    with pytest.raises(ValueError, match="maxTokens"):
        options_from_kwargs(max_tokens=-1)
    with pytest.raises(ValueError, match="unknown completion option"):
        options_from_kwargs(nope=1)


def test_remote_backend_options():
    o, errors = options_from({"diffill": {"backend": "openai", "remoteUrl": "https://gpu:8000/v1",
                                          "apiKeyEnv": "MY_KEY", "remoteRetries": 1}})
    assert errors == [] and (o.backend, o.remote_url, o.api_key_env, o.remote_retries) == (
        "openai", "https://gpu:8000/v1", "MY_KEY", 1)
    o, errors = options_from({"diffill": {"backend": "ollama", "remoteUrl": "gpu:8000",
                                          "apiKeyEnv": "sk-123 secret"}})
    assert len(errors) == 3 and o.backend == "local"
    assert any("'remoteUrl'" in e for e in errors) and any("'apiKeyEnv'" in e for e in errors)


def test_vscode_settings_are_server_options():
    """Every `diffill.*` setting the VS Code extension declares (except the server's own command
    line, ``suggestionList`` and ``languages``, which only the extension reads) is forwarded
    under a wire name the server accepts, with the server's bounds."""
    import json
    import re

    from diffill.lsp_server.completion.options import WIRE_NAMES

    root = ROOT / "editors" / "vscode"
    props = json.loads((root / "package.json").read_text())["contributes"]["configuration"]["properties"]
    declared = {k.removeprefix("diffill.") for k in props} - {"serverCommand", "suggestionList", "languages"}
    src = (root / "src" / "options.ts").read_text()
    block = re.search(r"SERVER_OPTIONS = \[(.*?)\] as const", src, re.S)
    assert block is not None
    forwarded = set(re.findall(r"'(\w+)'", block.group(1)))
    assert declared == forwarded
    assert forwarded <= set(WIRE_NAMES)
    for name in ("tokenHealing", "syntaxCheck", "steps"):
        assert name in forwarded
    # each declared minimum is one the server accepts
    for name in forwarded:
        lo = props[f"diffill.{name}"].get("minimum")
        if lo is not None:
            o, errors = options_from({name: lo})
            assert errors == [], (name, errors)


def test_recipe_option_names_match_the_recipe_table():
    """The VS Code enum (a copy in another language) lists exactly the recipes the loader
    knows, and the server option takes them (the option reads the table's names)."""
    import json

    from diffill.model.limits import RECIPE_NAMES

    root = ROOT / "editors" / "vscode"
    props = json.loads((root / "package.json").read_text())["contributes"]["configuration"]["properties"]
    assert set(props["diffill.recipe"]["enum"]) - {None} == set(RECIPE_NAMES)
    o, errors = options_from({"recipe": "dreamon"})
    assert errors == [] and o.recipe == "dreamon"
    o, errors = options_from({"recipe": "nope"})
    assert errors and "recipe" in errors[0] and o.recipe is None
