"""Fused GPU kernels (Triton) with a pure-torch reference each."""
