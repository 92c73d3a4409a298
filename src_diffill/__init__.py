"""diffill: fill-in-the-middle code completion from a masked-diffusion language model.

The code lives in three top-level folders of the repository, installed as
``diffill.model`` (token ids: configs, transformer, loader, sampler, engine,
training), ``diffill.lsp_server`` (text: the language server, context building,
post-processing, CLI) and ``diffill.kernels`` (fused GPU kernels with pure-torch
references).
"""

__version__ = "0.1.0"
