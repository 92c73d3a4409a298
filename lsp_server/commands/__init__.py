"""Subcommands of the ``diffill`` CLI: one module each (``add_parser`` + ``run``)."""
