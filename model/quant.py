"""int8 weights for CPU inference (per-output-channel weights, int8 matmuls), and the one
``weights`` rule that chooses between fp32, int8 and bf16.

A step of a 0.5B model on a CPU is compute-bound (hundreds of canvas tokens per step, not
one), so a weight-only scheme that widens the int8 weights back to fp32 before the matmul
saves memory but no time. What runs instead is torch's own dynamic-quantized linear
(``torch.ops.quantized.linear_dynamic``, FBGEMM on x86): weights int8 per output channel
(symmetric, scale = max |w| / 127 per row, packed once at load), activations quantized per
call (per tensor, 7-bit range on x86 so that FBGEMM's 8-bit products cannot saturate),
int32 accumulation, fp32 out. Measured against the candidates on a 2-core AVX2 EPYC
(BENCHMARKS.md, *One context per request and int8 weights on a CPU*):
``aten._weight_int8pack_mm`` and ``torch._int_mm`` have no fast CPU kernel here (50-100x
slower than fp32), bf16 matmuls without native bf16 (no avx512_bf16 / amx) are ~10x slower
than fp32.

Where the CPU does have native bf16 matmuls (Intel AMX), torch's bf16 linear (oneDNN) beats
the int8 path (BENCHMARKS.md, *bf16 weights on a CPU with AMX (issue 25)*): ``bf16`` weights
are the checkpoint's own bf16 tensors, mapped from the file rather than copied
(:func:`~.checkpoint_files.read_tensors`), with activations bf16 through the matmuls.

:func:`quantize_model` swaps every linear layer of the transformer blocks for an
:class:`Int8Linear` and, with ``head=True``, gives the (tied or not) LM head an int8 copy;
the embedding table stays in floating point (a lookup, not a matmul).

:func:`resolve_weights` is the one ``weights`` rule (``auto`` | ``fp32`` | ``int8`` | ``bf16``),
:func:`cpu_facts` what it reads of the CPU; the loader
applies it (``load_model(weights=...)``, ``DIFFILL_WEIGHTS``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

WEIGHTS = ("auto", "fp32", "int8", "bf16")
WEIGHTS_ENV = "DIFFILL_WEIGHTS"
AUTO_INT8_PARAMS = 100_000_000
"""``auto`` leaves fp32 on a CPU (for int8 or bf16) from this many parameters up (:func:`resolve_weights`)."""
AUTO_BF16 = False
"""Whether ``auto`` picks bf16 where the CPU has native bf16 matmuls. Not yet: on the 0.5B shape
on an AMX Xeon a cold request was 1.2-2.1x faster than int8 but a reused-context keystroke was
not (0.85-1.5x), and the process peaked at 1.46-1.60 GB (the file's 0.99 GB of bf16 weights,
mapped, plus ~0.35 GB of process and activations) against int8's 0.96-1.23 GB and issue 25's
1.2 GB (BENCHMARKS.md, *bf16 weights on a CPU with AMX*). ``DIFFILL_WEIGHTS=bf16`` /
``weights='bf16'`` choose it."""


def int8_available() -> bool:
    """Whether torch has the dynamic int8 linear on this build (FBGEMM or oneDNN/x86)."""
    return "fbgemm" in torch.backends.quantized.supported_engines or \
        "x86" in torch.backends.quantized.supported_engines


@dataclass(frozen=True)
class CpuFacts:
    """What the weights rule reads of the CPU (tests inject their own)."""

    amx: bool = False  # AMX tiles with bf16 (Sapphire Rapids and later)
    avx512_bf16: bool = False  # bf16 dot products in AVX-512 (Cooper Lake, Zen 4), no tiles
    mkldnn: bool = False  # torch's oneDNN, which runs the bf16 linear

    @property
    def native_bf16(self) -> bool:
        """Whether bf16 weights run fast here: AMX with oneDNN only. Without native bf16
        (AVX2) a bf16 linear was ~10x slower than fp32; with AMX it was 2.2x faster than int8
        on the 640-token linear. ``avx512_bf16`` alone has not been measured (no such machine
        at hand), so it keeps int8 until it is."""
        return self.amx and self.mkldnn


def cpu_facts() -> CpuFacts:
    """This CPU as torch sees it (``torch.cpu._is_amx_tile_supported`` and friends, 2.13)."""
    def probe(name: str) -> bool:  # private torch probes: absent in some builds, not an error
        fn = getattr(torch.cpu, name, None)
        try:
            return bool(fn()) if fn is not None else False
        except RuntimeError:
            return False

    return CpuFacts(amx=probe("_is_amx_tile_supported"),
                    avx512_bf16=probe("_is_avx512_bf16_supported"),
                    mkldnn=torch.backends.mkldnn.is_available())


def resolve_weights(weights: str | None, *, device: torch.device | str, params: int,
                    cpu: CpuFacts | None = None) -> str:
    """``fp32``, ``int8`` or ``bf16``: ``weights`` if given (else ``DIFFILL_WEIGHTS``, else
    ``auto``). ``auto`` on a CPU, for a model of at least :data:`AUTO_INT8_PARAMS` parameters
    (where the matmuls are the step; a few-MB model's step is its small ops and overheads): bf16
    where the CPU has native bf16 matmuls (:attr:`CpuFacts.native_bf16`, ``cpu`` or
    :func:`cpu_facts`) once :data:`AUTO_BF16` allows it, else int8 when torch has the int8 kernels; fp32 otherwise. int8 and bf16
    are CPU-only (CUDA keeps the checkpoint's dtype); an explicit bf16 runs on any CPU (slowly
    without native bf16)."""
    w = (weights or os.environ.get(WEIGHTS_ENV, "").strip() or "auto").lower()
    if w not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {w!r}")
    on_cpu = torch.device(device).type == "cpu"
    if w in ("int8", "bf16") and not on_cpu:
        raise ValueError(f"weights {w!r} runs on a CPU only (CUDA keeps the checkpoint's dtype)")
    if w == "int8" and not int8_available():
        raise ValueError("weights 'int8': this torch build has no quantized CPU engine")
    if w == "auto":
        if not on_cpu or params < AUTO_INT8_PARAMS:
            w = "fp32"
        elif AUTO_BF16 and (cpu or cpu_facts()).native_bf16:
            w = "bf16"
        else:
            w = "int8" if int8_available() else "fp32"
    return w


def quantize_per_channel(w: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (any float dtype) -> (int8 [N, K], scale [N] fp32): symmetric per output
    channel, ``w ~ q * scale``. A zero row gets scale 1 (its codes are all 0). Works through
    ``chunk`` rows at a time, so a vocabulary-sized head costs no full fp32 copy."""
    q = torch.empty(w.shape, dtype=torch.int8)
    scale = torch.empty(w.shape[0], dtype=torch.float32)
    for i in range(0, w.shape[0], chunk):
        wf = w[i:i + chunk].to(torch.float32, copy=True)
        s = wf.abs().amax(1) / 127.0
        s = torch.where(s > 0, s, torch.ones_like(s))
        wf.div_(s[:, None]).round_().clamp_(-127, 127)
        q[i:i + chunk] = wf.to(torch.int8)
        scale[i:i + chunk] = s
    return q, scale


# torch marks quantized tensors deprecated (2.13); the packed op they feed is what runs. A
# filter for that message, (re)installed where missing: warnings.catch_warnings() around each
# call is not thread-safe (the loader packs on several threads) and let the warning through.
_DEPRECATED = r"torch\.quantize_per_tensor, torch\.quantize_per_channel"


def _quiet_deprecation() -> None:
    if not any(f[0] == "ignore" and f[1] is not None and f[1].pattern == _DEPRECATED
               for f in warnings.filters):
        warnings.filterwarnings("ignore", message=_DEPRECATED, category=UserWarning)

PACK_ROWS = 8192
"""An :class:`Int8Linear` packs its weight this many output rows at a time: a vocabulary-sized
head packs in pieces (FBGEMM packed 152K x 896 in 1.35 s as one matrix, 0.70 s in 8192-row
pieces, on the 2-core test machine) and never holds its int8 codes and their packed copy whole
at once. Each output column is computed alone (int32 accumulation, its own scale), so the
pieces give the bits one matrix gives."""


def pack_int8(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
    """int8 codes [N, K] and their per-row ``scale`` [N] (+ fp32 ``bias`` [N]) -> torch's packed
    dynamic-quantized linear weight (FBGEMM layout on x86; torch releases the GIL while packing)."""
    _quiet_deprecation()
    qw = torch._make_per_channel_quantized_tensor(
        q, scale.double(), torch.zeros(scale.shape, dtype=torch.long), 0)
    return torch.ops.quantized.linear_prepack(qw, bias)


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with W int8 per output channel, run by torch's dynamic-quantized
    linear (:data:`PACK_ROWS` output rows per packed piece). Input and output fp32 of any
    leading shape."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        b = None if bias is None else bias.detach().float().contiguous()
        packed = []
        for i in range(0, weight.shape[0], PACK_ROWS):
            q, scale = quantize_per_channel(weight[i:i + PACK_ROWS])
            packed.append(pack_int8(q, scale, None if b is None else b[i:i + PACK_ROWS]))
            del q, scale
        self._set(packed, *weight.shape, b is not None)

    @classmethod
    def from_packed(cls, packed: list[Any], out_features: int, in_features: int,
                    bias_present: bool) -> Int8Linear:
        """The layer whose weight :func:`pack_int8` packed as ``packed``, pieces of
        :data:`PACK_ROWS` rows in order (the int8 weights cache, :mod:`.int8_cache`)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._set(packed, out_features, in_features, bias_present)
        return self

    def _set(self, packed: list[Any], out_features: int, in_features: int,
             bias_present: bool) -> None:
        if len(packed) != max(1, -(-out_features // PACK_ROWS)):
            raise ValueError(f"{len(packed)} packed pieces for {out_features} rows")
        self.out_features, self.in_features = out_features, in_features
        self._packed = packed
        self.bias_present = bias_present

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float().contiguous()
        if len(self._packed) == 1:
            y = torch.ops.quantized.linear_dynamic(x2, self._packed[0], True)
        else:  # each piece straight into its columns: the logits exist once
            y = torch.empty(x2.shape[0], self.out_features, dtype=torch.float32, device=x2.device)
            for lo, piece in self.pieces(x2):
                y[:, lo:lo + piece.shape[1]] = piece
        return y.view(*shape[:-1], self.out_features)

    def pieces(self, x: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """The output a packed piece at a time: (first output column, ``y[:, lo:lo + rows]``
        fp32 [M, at most :data:`PACK_ROWS`]) in order, x [M, in_features]; what
        :meth:`forward` writes into its columns (an LM head read by vocabulary pieces)."""
        x2 = x.reshape(-1, x.shape[-1]).float().contiguous()
        for i, p in enumerate(self._packed):
            yield i * PACK_ROWS, torch.ops.quantized.linear_dynamic(x2, p, True)

    def dequantized(self) -> torch.Tensor:
        """The weight the int8 codes stand for, fp32 [N, K] (tests, error reports)."""
        return torch.cat([torch.ops.quantized.linear_unpack(p)[0].dequantize()
                          for p in self._packed])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias_present}, int8 per channel"


def quantize_model(model: Any, *, head: bool = True) -> Any:
    """Replace, in place, every ``nn.Linear`` inside ``model.layers`` by an
    :class:`Int8Linear` (its fp32 weight is let go) and, with ``head``, give the model an
    int8 head (``model.int8_head``, used by ``Transformer.head``). Returns ``model``."""
    for block in model.layers:
        for parent in block.modules():
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, Int8Linear(child.weight.data, child.bias))
    if head:
        model.int8_head = Int8Linear(model.head_weight.data)
        if model.lm_head is not None:  # untied: the fp32 head is no longer read
            model.lm_head.weight = nn.Parameter(torch.empty(0), requires_grad=False)
    model.weights = "int8"
    return model


def count_parameters(model: Any) -> int:
    """Parameters of ``model`` with each :class:`Int8Linear` counted as its weight (and bias);
    the int8 head of a tied model is the embedding again and is not counted."""
    n = sum(p.numel() for p in model.parameters())
    head = getattr(model, "int8_head", None)
    tied = getattr(model, "lm_head", None) is None
    for m in model.modules():
        if isinstance(m, Int8Linear) and not (m is head and tied):
            n += m.in_features * m.out_features + (m.out_features if m.bias_present else 0)
    return n
