"""The language server and everything that speaks text to editors; uses
:mod:`diffill.model` (token ids) through :mod:`.backend`, never imports training or
evaluation. One sub-package per role; imports run down this list only (the "lsp_server
sub-packages" contract in ``pyproject.toml``):

* :mod:`.commands` -- the server side's ``diffill`` subcommands;
* :mod:`.protocol` -- the LSP server: JSON-RPC, handlers, scheduler, items, workspace sync;
  :mod:`.http` -- the OpenAI-compatible HTTP server and llama.cpp's ``/infill``;
* :mod:`.completion` -- the completer and its options;
* :mod:`.backend` -- the backend contract, the local model, a remote endpoint;
  :mod:`.drafting` -- the draft sources; :mod:`.project` -- context from outside the buffer
  (workspace index, definitions, recent regions);
* :mod:`.text` -- one buffer's text: context, post-processing, syntax guard, languages.
"""
