"""diffill: fill-in-the-middle code completion from a masked-diffusion language model.

The code lives in five top-level folders of the repository, installed under this package:
``diffill.lsp_server`` (text: the language server, context, post-processing, HTTP serving),
``diffill.model`` (token ids: configs, transformer, loader, sampler, engine, step plan),
``diffill.kernels`` (fused GPU kernels with pure-torch references), ``diffill.training``
(corpus, tokenizer, training) and ``diffill.evaluation`` (eval harness, sandbox, bench).
:mod:`diffill.cli` is the ``diffill`` command. Imports run server -> model -> kernels;
training and evaluation use those, never the other way (``docs/layout.md``).
"""

__version__ = "0.1.0"
