"""Training diffill's own model: the corpus build (:mod:`.corpus`, with its manifest
``corpus_manifest.json``), the BPE tokenizer (:mod:`.bpe`), batches and the diffusion
loss's data side (:mod:`.data`), and the training loop (:mod:`.train`).

Uses :mod:`diffill.model` (config, transformer); the server side never imports it.
"""
