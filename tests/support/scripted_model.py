"""The scripted checkpoint: a real diffill checkpoint whose answers are certain.

Tests that check what the server, the editors or the HTTP front do with a suggestion need
a model whose suggestion is known. A model trained at test time cannot give that (floating
point differs between CPUs, and so does what it learns), so this module *builds* one: no
training, weights written by hand so that the model fills a hole after each prompt of
:data:`RULES` with that rule's answer, and with nothing (pads) everywhere else. It is an
ordinary checkpoint folder (``config.json``, ``model.safetensors``, ``tokenizer.json`` --
the shipped model's real BPE tokenizer), loaded by the real loader and run by the real
engine and sampler, so the local path (cancellation between diffusion steps, the step
delay test hook, typed-ahead) stays under test.

How the weights decide (two transformer layers, ``shift_logits`` off, rotary theta 3):

* Token codes: token ``t`` is embedded as its id in binary, ``B`` dims of +-1 (13 for the
  shipped tokenizer's 8192 tokens); the mask token has code 0 and a flag dim instead, plus
  a filler dim so every embedding has the same norm (RMSNorm then scales all alike).
* Layer 0 attention: head ``k`` (k = 1 .. K) has constant queries and keys (biases only)
  built so that the rotary score peaks at the key ``k`` positions to the left, by more
  than 50 logits over any other key up to 2048 positions away: it copies the code of the
  token ``k`` to the left into its own part of the residual stream (softmax weight 1 up
  to ``e**-50``). So every position sees the K tokens before it, exactly.
* Layer 0 MLP: one unit per (rule, answer token). Unit ``(r, j)`` fires when the window
  matches rule ``r`` at answer slot ``j``: the last ``context`` tokens of the rule's
  prompt at the right offsets, and at the offsets of answer slots ``1 .. j-1`` either
  that answer token or the mask token (so the prediction does not depend on which slots
  are decoded yet, nor on the order or the number of steps). A code dot product is ``B``
  for the right token and at most ``B - 2`` otherwise, so a full match is an integer
  threshold apart from any miss. A firing unit adds a small vote for its token.
* Layer 1 MLP: per voted token, ``min(votes, 1)`` (two SiLU ramps), so two rules that
  agree (one rule's answer runs into another rule's prompt: ``"    "`` -> ``"message =
  ..."`` and ``"message ="`` -> ``' "hello " ...'``) write exactly what one would: the
  token's code and a "fired" flag.
* LM head: logit(X) = 200 for the written token X, at most 169 for any other token, and
  192 for the pad token (margin 8: every answer token gets the same log-probability, about
  -3.4e-4); where nothing fired, the pad token's logit is 40 and every other one 0.

:func:`compile_rules` checks the table symbolically before anything is built: in every
state the decoding of each rule's hole can pass through (each earlier slot masked or
decoded), the units that fire on an answer slot all vote for that slot's answer token and
none fires after the answer. Building also runs every rule through the real sampler.

Outside pytest: ``python tests/support/scripted_model.py OUT`` writes the folder to OUT.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# ---------------------------------------------------------------------------------- the script


@dataclass(frozen=True)
class Rule:
    """After a prefix whose last ``context`` tokens are those of ``prompt``, the hole is
    filled with ``answer`` (then pads). ``prompt`` is what the MODEL sees: with token
    healing (on by default) the server backs the hole off over a half-typed word or a
    lone space after a non-space (``"total = "`` is asked as ``"total ="``, the answer
    then has to start with the backed-off text), see ``lsp_server/completion/completer.py``."""

    prompt: str
    answer: str
    context: int = 3


ADD = "def add_numbers(a, b):\n    total = a + b\n    return"
GREET = "def greet_user(name):\n"
RULES: tuple[Rule, ...] = (
    # add_numbers
    Rule("def add_numbers(a, b):\n    total =", " a + b"),
    Rule(ADD, " total"),  # "return " and "return to" (healed) -> " total"
    Rule(ADD + " ", "total", context=4),  # "return " without token healing
    # greet_user
    Rule(GREET + "    message =", ' "hello " + name'),
    Rule(GREET + "   ", ' message = "hello " + name'),  # a selected item "message", healed
    Rule(GREET + "    ", 'message = "hello " + name'),  # cursor after the indentation
    Rule(GREET + '    message = "hello \U0001F600" +', " name", context=2),
    Rule(GREET + '    message = "hello \U0001F600!" +', " name", context=2),
    Rule(GREET + '    message = "hello " + name\n    print(', "message)"),
    # square_list
    Rule("def square_list(values):\n    result =", " sorted(values)"),
    Rule("def square_list(values):\n    result = [", "v * v for v in values]"),
    # is_even
    Rule("def is_even(number):\n    return", " number % 2 == 0", context=4),
    # celsius_to_kelvin, reverse_words
    Rule("def celsius_to_kelvin(celsius):\n    kelvin =", " celsius + 273.15"),
    Rule("def reverse_words(sentence):\n    words =", " sentence.split()"),
)
"""The script. Tests state the completions they expect as literals; this table is why."""

# ------------------------------------------------------------------------------- the weights

HEAD_DIM = 32  # 16 rotary frequency pairs per head
ROPE_THETA = 3.0  # high frequencies only: the sharpest peak (see attention_margin)
MAX_POSITIONS = 1024
GATE = 20.0  # a unit's pre-activation is +GATE on a full match, <= -GATE otherwise
RAMP = 40.0  # sharpness of the min(votes, 1) ramps
ANSWER_LOGIT, PAD_WHEN_FIRED, PAD_LOGIT = 200.0, 192.0, 40.0
ATTN_GAP = 50.0  # logits between the key k to the left and any other key
CONST = 1.0
EPS = 1e-6


class ScriptError(ValueError):
    """The rule table cannot be built into a model that answers it exactly."""


@dataclass(frozen=True)
class Unit:
    rule: int
    slot: int  # 1-based answer slot
    token: int  # what it writes
    window: tuple[tuple[int, ...], ...]  # per offset 1..L: the tokens it accepts


def shipped_tokenizer() -> Path:
    from diffill.model import default_model_path

    return default_model_path() / "tokenizer.json"


def load_shipped_tokenizer():
    from diffill.model.tokenizer import Tokenizer

    return Tokenizer.from_folder(shipped_tokenizer().parent)


def compile_rules(tok, rules: Sequence[Rule] = RULES) -> tuple[list[Unit], int]:
    """Rules -> MLP units and the number of attention heads (the longest window); raises
    :class:`ScriptError` unless every rule decodes to exactly its answer in every state."""
    mask, pad = tok.mask_id, tok.pad_id
    units: list[Unit] = []
    seqs = []
    for r, rule in enumerate(rules):
        prompt, answer = tok.encode(rule.prompt), tok.encode(rule.answer)
        if not answer or len(prompt) < rule.context or rule.context < 1:
            raise ScriptError(f"rule {r} ({rule.prompt[-30:]!r}): empty answer or short prompt")
        if tok.decode(answer) != rule.answer:
            raise ScriptError(f"rule {r}: answer {rule.answer!r} does not round-trip")
        ctx = prompt[-rule.context:]
        for j in range(1, len(answer) + 1):
            window = [(answer[j - 1 - k], mask) for k in range(1, j)]
            window += [(t,) for t in reversed(ctx)]
            units.append(Unit(r, j, answer[j - 1], tuple(window)))
        seqs.append((prompt, answer))
    heads = max(len(u.window) for u in units)

    def voted(window: list[int]) -> set[int]:
        return {u.token for u in units if len(u.window) <= len(window)
                and all(window[k] in acc for k, acc in enumerate(u.window))}

    for r, (prompt, answer) in enumerate(seqs):
        final = answer + [pad] * 3
        for j in range(1, len(final) + 1):
            for masked in itertools.product((True, False), repeat=j - 1):
                left = [mask if m else final[i] for i, m in enumerate(masked)]
                window = (list(reversed(left)) + list(reversed(prompt)))[:heads]
                got = voted(window)
                want = {answer[j - 1]} if j <= len(answer) else set()
                if got != want:
                    raise ScriptError(
                        f"rule {r} ({rules[r].prompt[-30:]!r}) slot {j}, earlier slots {left}: "
                        f"votes for {sorted(got)}, want {sorted(want)}")
    return units, heads


def attention_margin(theta: float = ROPE_THETA, head_dim: int = HEAD_DIM, span: int = 2 * MAX_POSITIONS
                     ) -> float:
    """Smallest drop of sum_f cos(theta_f u) from u = 0 over 0 < |u| <= span, per frequency
    (float64): how much the rotary score of the wanted key beats any other key."""
    half = head_dim // 2
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    u = torch.arange(1, span + 1, dtype=torch.float64)
    g = torch.cos(u[:, None] * inv[None, :]).sum(1)
    return float(half - g.max()) / half


def build_weights(tok, units: list[Unit], heads: int) -> tuple[dict[str, torch.Tensor], dict]:
    """The state dict (float32) and config.json fields of the scripted model."""
    V = tok.vocab_size
    B = max(4, (V - 1).bit_length())  # code bits
    mask, pad = tok.mask_id, tok.pad_id
    f64 = torch.float64
    code = ((torch.arange(V)[:, None] >> torch.arange(B)[None, :]) & 1).to(f64) * 2 - 1  # [V, B]
    code[mask] = 0.0
    voted = sorted({u.token for u in units})
    slot_of = {t: i for i, t in enumerate(voted)}
    # residual stream layout
    width = B + 2  # per copied token: code, mask flag, filler
    ISM, FILL, CST = B, B + 1, B + 2
    H0 = B + 3  # head k's copy at H0 + (k - 1) * width
    VOTE = H0 + heads * width  # one dim per voted token
    OUT = VOTE + len(voted)  # the code of the token written
    FIRED = OUT + B
    D = FIRED + 1
    H, Dh = heads, HEAD_DIM
    F0, F1 = max(1, len(units)), 2 * len(voted)
    F = max(F0, F1)

    def scale(sq: float) -> float:  # RMSNorm's factor for a vector with |x|^2 = sq
        return 1.0 / math.sqrt(sq / D + EPS)

    n_in = scale(B + CONST ** 2)  # every embedding
    n_mid = scale(B + CONST ** 2 + heads * B)  # after layer 0's attention (votes ~ 0)
    n_out = scale(B + CONST ** 2 + heads * B + B + 1)  # after layer 1 wrote a token
    VOTE_SIZE = 1e-3  # small: votes leave the residual norm unchanged to ~1e-7

    emb = torch.zeros(V, D, dtype=f64)
    emb[:, :B] = code
    emb[mask, ISM] = 1.0
    emb[mask, FILL] = math.sqrt(B - 1)
    emb[:, CST] = CONST

    # layer 0 attention: head k attends to the key k positions to the left (rotate-half
    # rotary: q.k = sum_f a^2 cos(theta_f (j - i + k)) for a query at i and a key at j)
    a2 = ATTN_GAP * math.sqrt(Dh) / (attention_margin() * (Dh // 2))
    inv = ROPE_THETA ** (-torch.arange(0, Dh, 2, dtype=f64) / Dh)
    qb = torch.zeros(H, Dh, dtype=f64)
    kb = torch.zeros(H, Dh, dtype=f64)
    wv = torch.zeros(H, Dh, D, dtype=f64)
    wo = torch.zeros(D, H, Dh, dtype=f64)
    for k in range(1, heads + 1):
        qb[k - 1, : Dh // 2] = math.sqrt(a2)
        kb[k - 1, : Dh // 2] = math.sqrt(a2) * torch.cos(k * inv)
        kb[k - 1, Dh // 2:] = math.sqrt(a2) * torch.sin(k * inv)
        for d in range(width):  # value: (code, mask flag, filler) of that key
            wv[k - 1, d, d] = 1.0 / n_in
            wo[H0 + (k - 1) * width + d, k - 1, d] = 1.0

    # layer 0 MLP: pre-activation GATE * (matches - L*B + 1): +GATE on a full match, else <= -GATE
    act = GATE * torch.sigmoid(torch.tensor(GATE, dtype=f64)).item()  # silu(GATE)
    gate0 = torch.zeros(F, D, dtype=f64)
    up0 = torch.zeros(F, D, dtype=f64)
    down0 = torch.zeros(D, F, dtype=f64)
    for u, unit in enumerate(units):
        for k, accepted in enumerate(unit.window, start=1):
            base = H0 + (k - 1) * width
            gate0[u, base: base + B] += code[accepted[0]]
            if mask in accepted:
                gate0[u, base + B] += B
        gate0[u] *= GATE / n_mid
        gate0[u, CST] = -GATE * (len(unit.window) * B - 1) / (CONST * n_mid)
        up0[u, CST] = 1.0 / (CONST * n_mid)
        down0[VOTE + slot_of[unit.token], u] = VOTE_SIZE / act

    # layer 1 MLP: min(votes, 1) = relu(v) - relu(v - 1), relu(x) ~ silu(RAMP x) / RAMP
    gate1 = torch.zeros(F, D, dtype=f64)
    up1 = torch.zeros(F, D, dtype=f64)
    down1 = torch.zeros(D, F, dtype=f64)
    for i, t in enumerate(voted):
        for unit, shift, sign in ((2 * i, 0.0, 1.0), (2 * i + 1, 1.0, -1.0)):
            gate1[unit, VOTE + i] = RAMP / (VOTE_SIZE * n_mid)
            gate1[unit, CST] = -RAMP * shift / (CONST * n_mid)
            up1[unit, CST] = 1.0 / (CONST * n_mid)
            down1[OUT: OUT + B, unit] = sign * code[t] / RAMP
            down1[FIRED, unit] = sign / RAMP

    head = torch.zeros(V, D, dtype=f64)
    head[:, OUT: OUT + B] = code * (ANSWER_LOGIT / (n_out * B))
    head[pad, OUT: OUT + B] = 0.0
    head[pad, CST] = PAD_LOGIT / (n_mid * CONST)
    head[pad, FIRED] = PAD_WHEN_FIRED / n_out - PAD_LOGIT / n_mid  # n_out * (P*CONST + Q) = 192

    zeros = lambda *shape: torch.zeros(*shape, dtype=f64)  # noqa: E731
    ones = torch.ones(D, dtype=f64)
    sd: dict[str, torch.Tensor] = {"embed_tokens.weight": emb, "norm.weight": ones, "lm_head.weight": head}
    for layer, (q_bias, k_bias, v_w, o_w, g, up, dn) in enumerate((
            (qb.reshape(-1), kb.reshape(-1), wv.reshape(H * Dh, D), wo.reshape(D, H * Dh),
             gate0, up0, down0),
            (zeros(H * Dh), zeros(H * Dh), zeros(H * Dh, D), zeros(D, H * Dh), gate1, up1, down1))):
        p = f"layers.{layer}."
        sd.update({
            p + "input_layernorm.weight": ones, p + "post_attention_layernorm.weight": ones,
            p + "self_attn.q_proj.weight": zeros(H * Dh, D), p + "self_attn.q_proj.bias": q_bias,
            p + "self_attn.k_proj.weight": zeros(H * Dh, D), p + "self_attn.k_proj.bias": k_bias,
            p + "self_attn.v_proj.weight": v_w, p + "self_attn.v_proj.bias": zeros(H * Dh),
            p + "self_attn.o_proj.weight": o_w,
            p + "mlp.gate_proj.weight": g, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": dn,
        })
    config = {
        "vocab_size": V, "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 2,
        "num_attention_heads": H, "num_key_value_heads": H, "head_dim": Dh,
        "rope_theta": ROPE_THETA, "rms_norm_eps": EPS, "qkv_bias": True, "qk_norm": False,
        "tie_word_embeddings": False, "max_position_embeddings": MAX_POSITIONS,
        "mask_token_id": mask, "pad_token_id": pad, "eos_token_id": tok.eos_id,
        "bos_token_id": tok.bos_id, "shift_logits": False, "torch_dtype": "float32",
    }
    return {k: v.float().contiguous() for k, v in sd.items()}, config


# ------------------------------------------------------------------------------ build, check


def build_scripted_model(out: str | Path, rules: Sequence[Rule] = RULES) -> Path:
    """Write the scripted checkpoint folder ``out`` (created; must not hold another
    checkpoint) and check it through the real loader and sampler. Returns ``out``."""
    from safetensors.torch import save_file

    tok = load_shipped_tokenizer()
    units, heads = compile_rules(tok, rules)
    weights, config = build_weights(tok, units, heads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["DiffillForMaskedDiffusion"], "model_type": "diffill", **config,
              "provenance": {"built_by": "tests/support/scripted_model.py",
                             "rules": [[r.prompt, r.answer, r.context] for r in rules]}}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(weights, str(out / "model.safetensors"))
    shutil.copy(shipped_tokenizer(), out / "tokenizer.json")
    check_answers(out, rules)
    return out


def check_answers(folder: Path, rules: Sequence[Rule] = RULES) -> None:
    """Every rule's prompt gets exactly its answer through ``load_model`` + ``infill``
    (several candidate lengths, 1 and 4 steps), and the logits at the hole have the
    designed margins; raises :class:`ScriptError` otherwise."""
    from diffill.model import load_model

    lm = load_model(folder, device="cpu")
    tok = lm.tokenizer
    suffix = tok.encode("\n")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny forwards: a second thread only spins on a busy machine
    try:
        _check_rules(lm, rules, suffix)
    finally:
        torch.set_num_threads(threads)


def _check_rules(lm, rules: Sequence[Rule], suffix: list[int]) -> None:
    from diffill.model.decoder.loop import infill
    from diffill.model.decoder.spec import SamplerConfig

    tok = lm.tokenizer
    for r, rule in enumerate(rules):
        prefix = tok.encode(rule.prompt)
        want = tok.encode(rule.answer)
        n = len(want) + 2
        canvas = [tok.bos_id, *prefix, *([tok.mask_id] * n), *suffix, tok.eos_id]
        with torch.no_grad():
            logits = lm.model(torch.tensor([canvas]))[0, 1 + len(prefix): 1 + len(prefix) + n]
        logits[:, tok.mask_id] = -math.inf
        top = logits.topk(2, dim=-1)
        expect = want + [tok.pad_id] * 2
        margins = (top.values[:, 0] - top.values[:, 1]).tolist()
        if top.indices[:, 0].tolist() != expect or min(margins) < 7.5:
            raise ScriptError(f"rule {r}: hole argmax {top.indices[:, 0].tolist()} (want {expect}), "
                              f"margins {margins}")
        for steps in (1, 4):
            best = infill(lm.model, lm.config, prefix, suffix,
                          SamplerConfig(steps=steps, lengths=(max(1, len(want) - 1), n, 2 * n)))[0]
            if tok.decode(best.ids) != rule.answer:
                raise ScriptError(f"rule {r}: infill gave {tok.decode(best.ids)!r}, want {rule.answer!r}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/support/scripted_model.py OUT")
    print(build_scripted_model(sys.argv[1]))
