"""The language server and everything that speaks text: context building,
post-processing, the request scheduler, evaluation and the CLI."""
