"""The language server's logging: where it goes and at what level (:func:`setup_logging`),
and the filter that keeps buffer contents out of pygls's own records
(:class:`RedactBuffers`). stdout is the LSP channel, so logs go to a file or stderr."""

from __future__ import annotations

import logging
from typing import Any


class RedactBuffers(logging.Filter):
    """pygls log records keep only scalar arguments and short strings; anything else
    (message objects, didOpen/didChange params, raw JSON) becomes ``<Type redacted>``,
    so buffer contents never reach the log."""

    MAX_STR = 200

    def _safe(self, a: Any) -> Any:
        if a is None or isinstance(a, (bool, int, float)):
            return a
        if isinstance(a, str) and len(a) <= self.MAX_STR and '"text"' not in a:
            return a
        return f"<{type(a).__name__} redacted>"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("pygls") and record.args:
            if isinstance(record.args, dict):
                record.args = {k: self._safe(v) for k, v in record.args.items()}
            else:
                record.args = tuple(self._safe(a) for a in record.args)
        return True


def setup_logging(log_file: str | None, debug_log_buffers: bool, level: str | None = None) -> None:
    """Logs to ``log_file`` (or stderr; stdout is the LSP channel) at ``level`` (default
    INFO). Buffer contents are redacted at every level unless ``debug_log_buffers``
    (which also means DEBUG). pygls's own records pass only at an explicit DEBUG level, and
    so do the tracebacks of error answers (:func:`.jsonrpc.log_error`)."""
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if not debug_log_buffers:
        handler.addFilter(RedactBuffers())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    lvl = logging.DEBUG if debug_log_buffers else getattr(logging, (level or "info").upper())
    root.setLevel(lvl)
    if not debug_log_buffers and lvl > logging.DEBUG:
        logging.getLogger("pygls").setLevel(logging.WARNING)


__all__ = ["RedactBuffers", "setup_logging"]
