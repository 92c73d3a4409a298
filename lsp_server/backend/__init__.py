"""What turns a prompt into candidate middles: the contract (:mod:`.backend_api`:
``Backend``, ``Candidate``, the errors), the local model and the registry (:mod:`.backends`;
torch is imported when a model loads, not here) and an OpenAI-compatible endpoint
(:mod:`.remote`). Imports only :mod:`..text` (``FimContext``)."""
