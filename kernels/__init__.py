"""Fused GPU kernels (Triton) with a pure-torch reference each.

* :mod:`.select_unmask` -- one denoising step's select-and-unmask over the hole's
  logits (softmax -> confidence/margin/entropy score + argmax in one pass over V,
  then per-row top-k / threshold selection and the scatter into the canvas);
  ``select_unmask`` dispatches to Triton on CUDA (or Triton's CPU interpreter under
  ``TRITON_INTERPRET=1``) and to ``select_unmask_reference`` otherwise.
"""
