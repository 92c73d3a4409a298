"""What a request gets from outside its buffer: the in-memory workspace index
(:mod:`.workspace`), the imported definitions it resolves (:mod:`.definitions`), the ring of
recent regions (:mod:`.recent`), and :mod:`.gather` over them. Imports only :mod:`..text`."""
