"""The diffill language server (pygls 2, stdio or TCP).

Features: ``textDocument/completion`` (items with ``textEdit`` + ``filterText``),
``textDocument/inlineCompletion`` (LSP 3.18 ghost text), incremental sync, utf-8 /
utf-16 / utf-32 positions, ``workspace/didChangeConfiguration``, and the custom
request ``diffill/status``.

Handlers are glue: resolve the document and position (:meth:`.documents.OpenDocuments.prepare`;
the open documents and what a request borrows from the others are :mod:`.documents`'s),
get suggestions (:meth:`DiffillServer.suggest`: typed-ahead cache, then the model on
the scheduler's worker thread with latest-wins cancellation), convert them
(:mod:`.items`). Requests always get an answer: a result, an empty result (model not
loaded, disabled, superseded by a newer request or a document change), an
InvalidParams error (position outside the document) or RequestCancelled (-32800,
after ``$/cancelRequest``).

The model is loaded, and a request that arrives meanwhile waits for the load, in
:mod:`.loading` (:class:`.loading.ModelLoad`, held as ``DiffillServer.model``); meanwhile
``diffill/status`` says ``loading`` and ``$/progress`` shows the load.

Per-request log lines are DEBUG; INFO is kept for lifecycle events (model loaded, ...).

Buffer contents are never logged unless the server runs with ``--debug-log-buffers``.
An error answer logs one line (WARNING; ERROR for an internal error), its traceback only
with ``--debug`` (:mod:`.jsonrpc`). Handlers, levels and the redaction: :mod:`.server_log`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from lsprotocol import types
from pygls.exceptions import FeatureRequestError
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from ... import __version__
from ..backend.backends import BackendError
from ..completion.completer import CompletionAsk, CompletionResult, Suggestion
from ..completion.options import CompletionOptions, options_from
from . import jsonrpc
from .documents import OpenDocuments, Prepared, encoding_name
from .items import completion_items, inline_items
from .jsonrpc import DiffillProtocol, log_error
from .loading import ModelLoad
from .scheduler import LatencyStats, Scheduler, Superseded, TypeaheadCache
from .workspace_sync import WorkspaceSync

log = logging.getLogger("diffill.server")

STATUS_METHOD = "diffill/status"
TRIGGER_CHARACTERS = [".", "(", "[", "{", ","]
RELOAD_FIELDS = ("backend", "model_path", "recipe", "device", "max_steps", "remote_url", "remote_model",
                 "api_key_env", "remote_timeout_ms", "remote_retries")
"""Options whose change means building the backend again."""


@dataclass(frozen=True)
class Answered:
    """What a completion job on the worker returns: the suggestions, and the model's result
    with the time it took (``result`` None: the typed-ahead cache answered, filled by a job
    that ran while this one queued)."""

    suggestions: list[Suggestion]
    result: CompletionResult | None = None
    model_ms: float = 0.0




def context_digest(prefix: str, suffix: str) -> str:
    """What ``diffill/status`` reports of the last model input (``last_context.digest``):
    16 hex digits of SHA-256 over ``prefix + NUL + suffix`` -- enough to tell which text
    the model saw (tests check freshness with it) without putting buffer text in status."""
    data = (prefix + "\x00" + suffix).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:16]


class DiffillServer(LanguageServer):
    def __init__(self, defaults: CompletionOptions | None = None, *, debug_log_buffers: bool = False) -> None:
        super().__init__(
            "diffill", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=DiffillProtocol,
        )
        self.options = defaults or CompletionOptions()
        self.debug_log_buffers = debug_log_buffers
        self.scheduler = Scheduler()
        self.model = ModelLoad(self, lambda: self.options, self.scheduler)  # :mod:`.loading`
        self.cache = TypeaheadCache()
        self.stats = LatencyStats()
        self.documents = OpenDocuments(lambda: self.workspace, lambda: self.options)
        self.last_context: dict[str, Any] | None = None
        self._last_error_shown: str | None = None
        self.workspace_sync = WorkspaceSync(lambda: self.options)  # index, ring (:mod:`.workspace_sync`)

    def start_io(self, stdin: Any = None, stdout: Any = None) -> None:
        """stdio with diffill's hardened framing and spec error answers (:mod:`.jsonrpc`)."""
        jsonrpc.start_io(self, stdin, stdout)

    def start_tcp(self, host: str, port: int) -> None:
        jsonrpc.start_tcp(self, host, port)

    def shutdown(self) -> None:
        """Stop without waiting for pygls's stdin reader thread (blocked in readline until
        the client closes the pipe) or for a model step in flight: the process exits next."""
        self.scheduler.shutdown()
        if self._stop_event is not None:
            self._stop_event.set()
        if self._thread_pool is not None:
            self._thread_pool.shutdown(wait=False, cancel_futures=True)
        if self._server is not None:
            self._server.close()

    @property
    def exit_code(self) -> int:
        """0 after a shutdown request, 1 otherwise (LSP ``exit`` semantics)."""
        return self.protocol.exit_code

    def report_server_error(self, error: Exception, source: Any) -> None:
        """pygls's hook for errors outside a request's answer (a notification handler
        raised, ...): one log line (the traceback with ``--debug``) and a message to the
        user. A request's error is already in its answer and logged by the protocol."""
        if source is FeatureRequestError:
            return
        log_error(log, logging.WARNING, f"{source.__name__}: {type(error).__name__}: {error}", error)
        self.window_show_message(types.ShowMessageParams(
            message=f"diffill: error in server: {error}", type=types.MessageType.Error))

    # ----------------------------------------------------------------- options & model
    def apply_settings(self, raw: Any) -> None:
        """Merge client settings; report bad fields; reload the model when it changed."""
        old = self.options
        self.options, errors = options_from(raw, old)
        for msg in errors:
            kind = types.MessageType.Warning if "unknown option" in msg else types.MessageType.Error
            log.warning("%s", msg)
            self.window_show_message(types.ShowMessageParams(type=kind, message=msg))
        if self.model.completer is not None:
            self.model.completer.options = self.options
        self.cache = TypeaheadCache()
        changed = any(getattr(old, f) != getattr(self.options, f) for f in RELOAD_FIELDS)
        model = self.model
        if changed and (model.backend is not None or model.error is not None or model.loading):
            model.start()


    # ----------------------------------------------------------------- suggestions
    def cached(self, prep: Prepared, n: int) -> list[Suggestion] | None:
        """Typed-ahead answer: the rest of the last suggestions, if the user typed their
        start, or asks again at the same spot for no more candidates than the last run was
        asked for (a run asked for 3 that found 1 would find the same 1 again: running it
        twice doubles the work and, with the step count chosen from measured timings, can
        answer the same question differently)."""
        hit = self.cache.lookup(prep.uri, prep.row, prep.line_prefix, prep.line_suffix)
        if hit is not None and (hit[0] or len(hit[1]) >= n or self.cache.asked(prep.uri) >= n):
            return hit[1][:n]
        return None

    async def suggest(self, prep: Prepared, n: int, kind: str = "inline") -> list[Suggestion] | None:
        """Suggestions for a prepared request, best first; None when superseded.

        Latest wins per (kind, document): completion and inline requests (VS Code sends
        both on a keystroke) do not cancel each other; the later of the two usually finds
        the first one's answer in the typed-ahead cache, checked again on the worker."""
        t0 = time.perf_counter()
        self.stats.count("requests")
        hit = self.cached(prep, n)
        if hit is not None:
            self.stats.count("cache_hits")
            self.stats.add((time.perf_counter() - t0) * 1000.0)
            return hit
        if self.model.completer is None and self.options.enabled and self.model.pending():
            self.stats.count("waited_for_load")
            if not await self.model.wait(f"{kind} {prep.uri}"):
                self.stats.count("superseded")
                return None
            t0 = time.perf_counter()  # latencies count the completion, not the wait for the load
        completer = self.model.completer
        if completer is None or not self.options.enabled:
            self.stats.count("not_ready" if completer is None else "disabled")
            return []
        snippets = self.documents.snippets(prep.uri)
        doc = self.workspace.text_documents.get(prep.uri)
        full_path = doc.path if doc is not None else None
        self.workspace_sync.visited(prep.uri, full_path, prep.row, prep.language)
        others = self.documents.other_documents(prep.uri)
        recalled = self.cache.recall(prep.uri) if self.options.drafts else []
        cache, gen = self.cache, self.cache.generation(prep.uri)  # an edit elsewhere bumps gen

        def work(cancel: Any) -> Answered:
            again = self.cached(prep, n)  # filled by a job that ran while this one queued
            if again is not None:
                return Answered(again)
            t = time.perf_counter()
            ex = self.workspace_sync.extras(prep.uri, full_path, prep.text, prep.offset,
                                            prep.language, self.documents.open_text)
            res = completer.run(prep.text, prep.offset, CompletionAsk(n=n, cancel=cancel),
                                language=prep.language, path=prep.path,
                                snippets=[*ex.snippets, *snippets], others=others,
                                recalled=recalled, workspace=ex.workspace)
            cache.store(prep.uri, prep.row, prep.line_prefix, prep.line_suffix, res.suggestions,
                        generation=gen, asked=n)
            return Answered(res.suggestions, res, (time.perf_counter() - t) * 1000.0)

        try:
            got = await self.scheduler.run(
                f"{kind} {prep.uri}", work, stale=lambda: self.documents.doc_version(prep.uri) != prep.version
            )
        except Superseded:
            self.stats.count("superseded")
            return None
        except asyncio.CancelledError:
            self.stats.count("cancelled")
            raise
        except BackendError as e:  # e.g. the remote endpoint is down: tell the user once
            self.stats.count("errors")
            self.report_model_error(e, "backend error")
            return []
        except Exception as e:  # the model failed (out of memory, ...): tell the user, stay up
            self.stats.count("errors")
            self.report_model_error(e)
            return []
        self._last_error_shown = None
        total_ms = (time.perf_counter() - t0) * 1000.0
        res = got.result
        if res is None:
            self.stats.count("cache_hits")
            self.stats.add(total_ms)
            return got.suggestions
        self.stats.count("model_requests")
        self.count_drafts(res)
        self.stats.add(total_ms, got.model_ms)
        self._log_result(prep, res, got.model_ms)
        return got.suggestions

    def count_drafts(self, res: CompletionResult) -> None:
        """Draft counters for ``diffill/status``: model requests sent with drafts
        (``draft_offered``), answered by a verified draft (``draft_accepted``, and
        ``draft_accepted_<source>``), or with a draft partly accepted (``draft_partial``)."""
        if not res.drafts:
            return
        self.stats.count("draft_offered")
        top = res.suggestions[0] if res.suggestions else None
        if top is not None and top.verified:
            self.stats.count("draft_accepted")
            self.stats.count(f"draft_accepted_{top.source}")
        elif any(c.draft is not None and c.accepted > 0 for c in res.candidates):
            self.stats.count("draft_partial")

    def report_model_error(self, e: BaseException, what: str = "model error") -> None:
        """A model call raised: log it and show it (not again while the same error repeats)."""
        msg = (f"diffill: {what}: {e}" if isinstance(e, BackendError)
               else f"diffill: {what}: {type(e).__name__}: {e}")[:500]
        log.error("%s", msg)
        if msg != self._last_error_shown:
            self._last_error_shown = msg
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=msg))

    def _log_result(self, prep: Prepared, res: CompletionResult, model_ms: float) -> None:
        ctx = res.context
        self.last_context = {
            "uri": prep.uri, "version": prep.version, "prefix_tokens": ctx.prefix_tokens,
            "suffix_tokens": ctx.suffix_tokens, "header_tokens": ctx.header_tokens,
            "digest": context_digest(ctx.prefix, ctx.suffix), "model_ms": round(model_ms, 3),
            "steps": max((c.steps for c in res.candidates), default=0),
            "drafts": [d.source for d in res.drafts],
            "source": res.suggestions[0].source if res.suggestions else None,
        }
        log.debug(
            "complete %s:%d:%d prefix=%d suffix=%d tokens, %d candidates -> %d suggestions, %.1f ms",
            prep.path, prep.row, prep.col, ctx.prefix_tokens, ctx.suffix_tokens,
            len(res.candidates), len(res.suggestions), model_ms,
        )
        if self.debug_log_buffers:
            log.debug("prefix=%r suffix=%r", ctx.prefix[-400:], ctx.suffix[:400])
            log.debug("suggestions=%r", [s.text for s in res.suggestions])

    def markdown_docs(self) -> bool:
        caps = self.client_capabilities
        try:
            fmts = caps.text_document.completion.completion_item.documentation_format or []
        except AttributeError:
            return False
        return types.MarkupKind.Markdown in fmts

    def status(self) -> dict[str, Any]:
        backend = self.model.backend
        desc = backend.describe() if backend is not None else {}
        return {
            "version": __version__,
            "model": desc.get("model") or self.options.model_path,
            "family": desc.get("family"),
            "device": desc.get("device") or self.options.device,
            "backend": self.options.backend,
            "loaded": backend is not None,
            "loading": self.model.loading,
            "error": self.model.error,
            "model_calls": desc.get("model_calls"),
            "engine_cancelled": desc.get("engine_cancelled"),
            # requests that started from their document's kept context / computed it in full
            "context_reused": desc.get("context_reused"),
            "context_computed": desc.get("context_computed"),
            "position_encoding": encoding_name(self.workspace.position_encoding),
            "last_context": self.last_context,
            "rejected_messages": {str(k): v for k, v in getattr(self.protocol, "rejected", {}).items()},
            "in_flight": len(getattr(self.protocol, "_request_futures", {})),
            "options": self._options_wire(),
            "drafts": self.drafts_summary(),
            "workspace": self.workspace_sync.status(),
            **self.stats.summary(),
        }

    def drafts_summary(self) -> dict[str, Any]:
        """``diffill/status`` ``drafts``: whether drafting is on and its counters."""
        c = self.stats.counters
        prefix = "draft_accepted_"
        return {
            "enabled": self.options.drafts,
            "offered": c.get("draft_offered", 0),
            "accepted": c.get("draft_accepted", 0),
            "partial": c.get("draft_partial", 0),
            "accepted_by_source": {k[len(prefix):]: v for k, v in c.items() if k.startswith(prefix)},
        }

    def _options_wire(self) -> dict[str, Any]:
        return msgspec.to_builtins(self.options)


def create_server(defaults: CompletionOptions | None = None, *, debug_log_buffers: bool = False) -> DiffillServer:
    server = DiffillServer(defaults, debug_log_buffers=debug_log_buffers)

    @server.feature(types.INITIALIZE)
    def initialize(ls: DiffillServer, params: types.InitializeParams) -> None:
        if params.initialization_options is not None:
            ls.apply_settings(params.initialization_options)

    @server.feature(types.INITIALIZED)
    def initialized(ls: DiffillServer, params: types.InitializedParams) -> None:
        ls.model.start()
        asyncio.ensure_future(ls.workspace_sync.start(ls))  # the index builds on its own thread

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: DiffillServer, params: None) -> None:
        # pygls then cancels the requests in flight (answered RequestCancelled; a model
        # step in flight stops at its next cancel check)
        if ls.model.task is not None:
            ls.model.task.cancel()  # a load not begun yet never starts, one running is dropped
        ls.scheduler.shutdown()
        ls.workspace_sync.shutdown()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: DiffillServer, params: types.DidChangeConfigurationParams) -> None:
        settings = params.settings
        if not settings and ls.client_capabilities.workspace and ls.client_capabilities.workspace.configuration:
            got = await ls.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="diffill")])
            )
            settings = {"diffill": got[0]} if got and isinstance(got[0], dict) else None
        if settings:
            ls.apply_settings(settings)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DiffillServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.documents.note_edit(params.text_document.uri, 0)
        doc = params.text_document  # a visit, for the ring of recent regions (its first lines)
        ls.workspace_sync.visited(doc.uri, to_fs_path(doc.uri), 0, doc.language_id)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DiffillServer, params: types.DidChangeTextDocumentParams) -> None:
        last = params.content_changes[-1] if params.content_changes else None
        row = last.range.start.line if isinstance(last, types.TextDocumentContentChangePartial) else 0
        ls.documents.note_edit(params.text_document.uri, row)
        ls.cache.invalidate(params.text_document.uri, params.content_changes)
        doc = ls.workspace.text_documents.get(params.text_document.uri)
        if doc is not None:
            ls.workspace_sync.edited(doc.uri, doc.path, row, doc.language_id, ls.documents.open_text)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: DiffillServer, params: types.DidSaveTextDocumentParams) -> None:
        doc = ls.workspace.text_documents.get(params.text_document.uri)
        ls.workspace_sync.saved(doc.path if doc is not None else None)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: DiffillServer, params: types.DidChangeWatchedFilesParams) -> None:
        ls.workspace_sync.watched(params.changes)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DiffillServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.workspace_sync.closed(params.text_document.uri, to_fs_path(params.text_document.uri))
        ls.documents.forget(params.text_document.uri)
        ls.cache.forget(params.text_document.uri, closed=True)

    @server.feature(
        types.TEXT_DOCUMENT_COMPLETION,
        types.CompletionOptions(trigger_characters=TRIGGER_CHARACTERS, resolve_provider=False),
    )
    async def completion(ls: DiffillServer, params: types.CompletionParams) -> types.CompletionList:
        prep = ls.documents.prepare(params.text_document.uri, params.position)
        sugg = await ls.suggest(prep, ls.options.num_candidates, "completion") if prep is not None else []
        if not sugg:
            return types.CompletionList(is_incomplete=True, items=[])
        items = completion_items(
            sugg, row=prep.row, col=prep.col, line=prep.line,
            encoding=encoding_name(ls.workspace.position_encoding),
            markdown=ls.markdown_docs(), language=prep.language,
        )
        return types.CompletionList(is_incomplete=False, items=items)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: DiffillServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList:
        ctx = params.context
        prep = ls.documents.prepare(params.text_document.uri, params.position, ctx.selected_completion_info)
        invoked = ctx.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        n = ls.options.num_candidates if invoked else 1
        sugg = await ls.suggest(prep, n, "inline") if prep is not None else []
        if not sugg:
            return types.InlineCompletionList(items=[])
        items = inline_items(
            sugg, row=prep.row, start=prep.start, end=prep.end, line=prep.line,
            encoding=encoding_name(ls.workspace.position_encoding), lead=prep.lead,
        )
        return types.InlineCompletionList(items=items)

    @server.feature(STATUS_METHOD)
    def status(ls: DiffillServer, params: Any) -> dict[str, Any]:
        return ls.status()

    return server
