"""The language server and everything that speaks text to editors: LSP protocol and
handlers, options, context building, post-processing, the syntax guard, the draft sources
(:mod:`.drafts`, over :mod:`.analogy` and :mod:`.similarity`), the request scheduler, the
local and remote backends, the OpenAI-compatible HTTP server, and the
server side's ``diffill`` subcommands (:mod:`.commands`). Uses :mod:`diffill.model`
(token ids) through :mod:`.backends`; never imports training or evaluation."""
