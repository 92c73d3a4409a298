"""Evaluation and benchmarking (``diffill eval``, ``diffill bench``): infilling tasks, the
execution sandbox, metrics, a non-neural baseline, the speed-quality frontier, the latency
benchmark and the autoregressive baseline it compares against.

Uses the server side (:mod:`diffill.lsp_server`: the editors' ``Completer``), the model and
the kernels; nothing on the server side imports it.

Modules:

- :mod:`.tasks`      HumanEval single-line infilling tasks (and any human-eval-infilling
                     jsonl), the cursor convention, samples I/O.
- :mod:`.sandbox`    runs ``prompt + completion + suffix + test`` in an isolated subprocess.
- :mod:`.metrics`    exact match, edit similarity (bit-parallel Levenshtein + reference DP, from
                     :mod:`diffill.lsp_server.drafting.similarity`).
- :mod:`.heldout`    masked lines / 2-4 line spans sampled from the held-out corpus.
- :mod:`.baseline`   "continue by analogy" non-neural baseline (the rules of
                     :mod:`diffill.lsp_server.drafting.analogy`).
- :mod:`.generators` the completion sources under test (model via the editors' Completer,
                     the empty completion, the baseline), all behind one ``Generator`` protocol.
- :mod:`.runner`     generation + scoring of one generator on the task sets.
- :mod:`.frontier`   steps vs quality/latency table and plot.
- :mod:`.report`     text tables and the results JSON.
- :mod:`.bench`      ``diffill bench``: engine latency, dual cache, floors, the AR baseline.
- :mod:`.ar`         autoregressive decoding of the same model (the baseline ``bench`` times).

The cursor convention (used for every task, the model, the baseline and the empty floor) is
documented in :mod:`.tasks`.
"""
