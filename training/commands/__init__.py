"""The training side's ``diffill`` subcommands: ``train`` and ``corpus``
(one module each: ``add_parser`` + ``run``, dispatched by :mod:`diffill.cli`)."""
