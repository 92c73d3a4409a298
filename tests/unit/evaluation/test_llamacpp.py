"""``diffill bench --vs-llamacpp`` (evaluation/llamacpp.py) without llama-cpp-python: the
request builder, the GGUF naming / vocabulary / cache key, the missing-extra error. The
conversion itself runs where the ``gguf`` package is installed (not in CI)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from diffill.cli import main as cli_main
from diffill.evaluation import llamacpp as lc


def test_shlex_case_cuts_one_statement_line_out_of_the_first_72_lines():
    text = Path(shlex.__file__).read_text(encoding="utf-8")
    first = "".join(text.splitlines(keepends=True)[:72])
    c = lc.shlex_case()
    assert c.prefix + c.middle + c.suffix == first
    assert c.middle == "self.pushback = deque()"
    assert c.prefix.endswith("\n" + " " * 8)  # the cursor after the emptied line's indentation
    assert c.suffix.startswith("\n")
    assert first.splitlines()[c.line - 1].strip() == c.middle
    assert 1500 < len(first) < 4000  # ~640 Qwen tokens


def test_shlex_case_on_other_text_and_typing():
    text = "def f():\n    a = 1\n    b = 2\n    return a\n"
    c = lc.shlex_case(text, lines=3, statement="b = 2")
    assert (c.prefix, c.middle, c.suffix, c.line) == ("def f():\n    a = 1\n    ", "b = 2", "\n", 3)
    t = c.typed(2)
    assert (t.prefix, t.middle, t.suffix) == (c.prefix + "b ", "= 2", "\n")
    with pytest.raises(ValueError, match="return a"):
        lc.shlex_case(text, lines=3, statement="return a")  # past the cut


def test_fim_prompt_is_qwen_coder_psm():
    c = lc.Case("def f():\n    ", "pass", "\n\nx = 1\n", 2)
    assert lc.fim_prompt(c) == ("<|fim_prefix|>def f():\n    <|fim_suffix|>\n\nx = 1\n"
                                "<|fim_middle|>")


def test_gguf_tensor_names():
    assert lc.gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert lc.gguf_name("model.norm.weight") == "output_norm.weight"
    assert lc.gguf_name("lm_head.weight") == "output.weight"
    assert lc.gguf_name("model.layers.11.self_attn.k_proj.bias") == "blk.11.attn_k.bias"
    assert lc.gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert lc.gguf_name("model.layers.3.post_attention_layernorm.weight") == "blk.3.ffn_norm.weight"
    with pytest.raises(ValueError, match="rotary"):
        lc.gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq")


def test_gguf_vocab_pads_and_types():
    tj = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                    "merges": [["a", "b"], "ab b"]},
          "added_tokens": [{"id": 3, "content": "<|fim_prefix|>", "special": True},
                           {"id": 4, "content": "<tool>", "special": False}]}
    tokens, types, merges = lc.gguf_vocab(tj, 6)
    assert tokens == ["a", "b", "ab", "<|fim_prefix|>", "<tool>", "[PAD5]"]
    assert types == [1, 1, 1, 3, 4, 5]
    assert merges == ["a b", "ab b"]
    with pytest.raises(ValueError, match="vocab_size"):
        lc.gguf_vocab(tj, 4)


def _tiny_qwen2(folder: Path) -> Path:
    """A 2-layer Qwen2-layout checkpoint (config, tokenizer.json, bf16 safetensors)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    folder.mkdir()
    d, f, v, kv = 64, 128, 40, 32
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": v,
           "hidden_size": d, "intermediate_size": f, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256,
           "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
           "eos_token_id": 33}
    (folder / "config.json").write_text(json.dumps(cfg))
    vocab = {chr(97 + i): i for i in range(26)}
    (folder / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": vocab, "merges": [["a", "b"]]},
        "added_tokens": [{"id": 33, "content": "<|endoftext|>", "special": True}]}))
    g = torch.Generator().manual_seed(0)
    t = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(2):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
              p + "self_attn.q_proj.weight": (d, d), p + "self_attn.q_proj.bias": (d,),
              p + "self_attn.k_proj.weight": (kv, d), p + "self_attn.k_proj.bias": (kv,),
              p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.v_proj.bias": (kv,),
              p + "self_attn.o_proj.weight": (d, d), p + "mlp.gate_proj.weight": (f, d),
              p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f)}
    save_file({k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in t.items()},
              str(folder / "model.safetensors"))
    return folder


def test_gguf_cache_key_follows_the_checkpoint(tmp_path):
    pytest.importorskip("safetensors")
    ck = _tiny_qwen2(tmp_path / "ck")
    a = lc.gguf_cache_path(ck, tmp_path / "cache")
    assert a == lc.gguf_cache_path(str(ck), tmp_path / "cache")
    assert a.parent == tmp_path / "cache" and a.name.startswith("ck-") and a.suffix == ".gguf"
    st = (ck / "model.safetensors").stat()
    os.utime(ck / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert lc.gguf_cache_path(ck, tmp_path / "cache") != a


def test_convert_to_gguf_writes_q8_0_matrices(tmp_path):
    gguf = pytest.importorskip("gguf")
    ck = _tiny_qwen2(tmp_path / "ck")
    out = lc.convert_to_gguf(ck, tmp_path / "m.gguf", log=lambda s: None)
    r = gguf.GGUFReader(str(out))
    kinds = {t.name: t.tensor_type for t in r.tensors}
    assert len(kinds) == 2 + 2 * 12 and "output.weight" not in kinds  # tied head
    assert kinds["token_embd.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert kinds["blk.1.ffn_down.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert kinds["blk.0.attn_q.bias"] == gguf.GGMLQuantizationType.F32
    arch = r.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "qwen2"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 40


def test_vs_llamacpp_without_the_extra_names_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    rc = cli_main(["bench", "--vs-llamacpp", "--model", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc != 0
    assert 'pip install -e ".[llamacpp]"' in err and "llama_cpp" in err


def test_reuse_keyword():
    def with_key(prefix, suffix, *, steps=None, context_key=None): ...
    def without(prefix, suffix, *, steps=None): ...
    assert lc.reuse_keyword(with_key) == "context_key"
    assert lc.reuse_keyword(without) is None


def test_format_table_renders_a_result():
    side = {"p50_ms": 1000.0, "min_ms": 900.0, "n": 3}
    row = {"llama_cpp": side, "diffill": {"p50_ms": 500.0, "min_ms": 450.0, "n": 3},
           "llama_over_diffill_p50": 2.0, "llama_over_diffill_min": 2.0,
           "llama_prompt_tokens": 639, "llama_tokens_evaluated": 639,
           "diffill_context_tokens": 636, "diffill_steps": [4], "diffill_verified": 0}
    res = {"model": "/m", "machine": "cpu", "threads": 2, "steps": 4, "hole": 16, "n_gen": 16,
           "repeats": 3, "warmup": 1, "keystrokes": 5, "gguf_mb": 531.0, "reuse": None,
           "load_average": {"before": [1.0], "after": [2.0]},
           "case": {"file": "shlex.py", "lines": 72, "hole_line": 48, "middle": "x"},
           "llama_cpp": {"version": "0.3.36", "peak_rss_mb": 700.0},
           "diffill": {"weights": "int8", "context": "request", "peak_rss_mb": 2300.0},
           "rows": [dict(row, scenario=s) for s in ("cold", "keystroke", "draft")]}
    out = lc.format_table(res)
    assert "(a) cold request" in out and "(c) verified draft" in out and "2.00" in out
    assert "each keystroke from scratch" in out
