"""The language server: LSP lifecycle and handlers (:mod:`.server`), the open documents
(:mod:`.documents`), the model and its loading (:mod:`.loading`), its logging (:mod:`.server_log`), JSON-RPC framing
(:mod:`.jsonrpc`), the request scheduler and typed-ahead cache (:mod:`.scheduler`), completion
items (:mod:`.items`) and position encodings (:mod:`.encoding`), and the server's side of the
workspace index (:mod:`.workspace_sync`)."""
