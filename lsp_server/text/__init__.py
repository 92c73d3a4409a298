"""The text side, one buffer at a time: the prompt around the cursor (:mod:`.context`: the
prefix and suffix windows, the extra context header, ``FimContext``; :mod:`.fim_prompt`: an
OpenAI-style prompt split at its FIM markers), post-processing (:mod:`.postprocess`), the syntax
guard (:mod:`.syntax`: Python by ``ast``; :mod:`.treesitter_guard`: every other language, on
the trees of :mod:`.treesitter`, the tree-sitter parser layer), the
unbound-name check (:mod:`.scope`) and the one table of per-language facts (:mod:`.languages`).
The bottom of ``lsp_server``: imports no other sub-package."""
