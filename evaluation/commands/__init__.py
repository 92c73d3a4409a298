"""The evaluation side's ``diffill`` subcommands: ``eval`` and ``bench``
(one module each: ``add_parser`` + ``run``, dispatched by :mod:`diffill.cli`)."""
