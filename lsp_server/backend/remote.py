"""``backend = "openai"``: candidate middles from an OpenAI-compatible
``/v1/completions`` endpoint (``diffill serve-http``, vLLM, SGLang, ...).

Each request sends the context windows as ``prompt`` (prefix) and ``suffix``
(fill in the middle), ``max_tokens``, ``temperature`` and ``n``; the choices come
back best first (by ``index``) and go through the language server's own
post-processing like local candidates.

* **Key handling**: settings name an environment variable (``apiKeyEnv``, default
  ``DIFFILL_API_KEY``); its value is read when a request is sent and only ever
  goes into the ``Authorization`` header -- never into settings, status, errors
  or logs. Unset: no header.
* **Token budgets**: there is no local tokenizer for a remote model, so
  :meth:`RemoteBackend.encode_batch` estimates ``ceil(utf8_bytes / 3)`` tokens per
  text. The estimate is monotone (window cutting relies on that) but only an
  estimate: measured on diffill's own sources in 2,000-character chunks, the real
  count was at most 1.26x the estimate with diffill's 8k BPE vocabulary (large
  vocabularies such as Qwen's need fewer tokens). ``diffill serve-http`` re-cuts
  the windows with the model's real tokenizer, so an overshoot costs nothing there;
  for a server that rejects long prompts, lower ``contextTokens``.
* **Retries**: connection errors, timeouts, 408, 429 and 5xx are retried up to
  ``retries`` times with exponential back-off (``backoff_s * 2**k``, jittered,
  capped at ``max_backoff_s``); a ``Retry-After`` header is honoured (as a lower
  bound) unless it would overrun the request's ``deadline_s``. Other 4xx fail at
  once with the server's message.
* **Cancellation**: the HTTP exchange runs on a helper thread while the caller's
  thread polls ``cancel()`` every few milliseconds; a cancelled request closes its
  connection (the server sees the disconnect and stops between diffusion steps)
  and raises :class:`~.backend_api.Cancelled`. Back-off sleeps are cancellable too.
* Connections are kept alive and reused (one idle connection per backend); a
  reused connection the server has closed meanwhile is replaced once, without
  counting as a retry.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import random
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from ..text.context import FimContext
from .backend_api import BackendError, CancelFn, Cancelled, Candidate, InfillAsk, InfillResult

DEFAULT_URL = "http://127.0.0.1:8000/v1"
DEFAULT_KEY_ENV = "DIFFILL_API_KEY"
BYTES_PER_TOKEN_ESTIMATE = 3
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
POLL_S = 0.005


def estimate_tokens(text: str) -> int:
    """Token count estimate for budgets without the remote tokenizer (see module doc)."""
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN_ESTIMATE)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` (delta seconds or an HTTP date) -> seconds, None when absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class RemoteSettings:
    url: str = DEFAULT_URL
    """Base URL up to and including ``/v1`` (``POST {url}/completions``)."""
    model: str | None = None
    """``model`` sent with each request (None: left out; diffill serve-http takes its own)."""
    api_key_env: str | None = DEFAULT_KEY_ENV
    timeout_s: float = 10.0
    """Per attempt: connect + answer."""
    retries: int = 2
    backoff_s: float = 0.2
    max_backoff_s: float = 4.0
    deadline_s: float = 30.0
    """Whole request, retries and back-off included."""


class RemoteBackend:
    """The :class:`~.backend_api.Backend` protocol over HTTP."""

    name = "openai"

    def __init__(self, settings: RemoteSettings, *, sleep_jitter: random.Random | None = None) -> None:
        parts = urlsplit(settings.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BackendError(f"remote URL must be http(s)://host[:port]/path, got {settings.url!r}")
        self.settings = settings
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.path = parts.path.rstrip("/") + "/completions"
        self._rng = sleep_jitter or random.Random()
        self._idle: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self.requests = 0
        self.retried = 0
        self.failures = 0
        self.last_latency_ms: float | None = None
        self.last_error: str | None = None

    # -- protocol --------------------------------------------------------------------------
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[0] * estimate_tokens(t) for t in texts]

    def max_context_tokens(self, max_tokens: int) -> int | None:
        return None

    def infill(self, ctx: FimContext, ask: InfillAsk) -> InfillResult:
        """See :class:`Backend`; ``ask.steps`` and ``ask.budget_ms`` are the endpoint's business
        and ``ask.drafts`` are ignored (an endpoint cannot verify them)."""
        body: dict[str, Any] = {
            "prompt": ctx.prefix,
            "suffix": ctx.suffix,
            "max_tokens": ask.max_tokens,
            "temperature": ask.temperature,
            "n": max(1, ask.n),
        }
        if self.settings.model:
            body["model"] = self.settings.model
        if ask.seed is not None:
            body["seed"] = ask.seed
        self.requests += 1
        t0 = time.perf_counter()
        try:
            data = self._post_with_retries(json.dumps(body).encode("utf-8"), ask.cancel)
        except BackendError as e:
            self.failures += 1
            self.last_error = str(e)
            raise
        self.last_latency_ms = (time.perf_counter() - t0) * 1000.0
        return InfillResult(self._candidates(data))

    def budget_ms(self, requested: float | None = None) -> float | None:
        """The request's own budget: the endpoint keeps its own, unknown here."""
        return requested

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.settings.model,
            "url": self.settings.url,
            "family": "remote",
            "device": "remote",
            "api_key_env": self.settings.api_key_env,
            "api_key_set": bool(self._api_key()),
            "model_calls": self.requests,
            "retries": self.retried,
            "failures": self.failures,
            "last_latency_ms": self.last_latency_ms,
            "last_error": self.last_error,
        }

    def warmup(self) -> None:
        """Nothing to load; the first request opens the connection."""

    # -- HTTP ------------------------------------------------------------------------------
    def _api_key(self) -> str | None:
        env = self.settings.api_key_env
        value = os.environ.get(env, "").strip() if env else ""
        return value or None

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json",
             "User-Agent": "diffill-lsp",
             # the language server heals partial words itself: diffill serve-http must not
             # back the hole off a second time (other servers ignore the header)
             "X-Diffill-Token-Healing": "0"}
        key = self._api_key()
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _connect(self) -> http.client.HTTPConnection:
        t = self.settings.timeout_s
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=t,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=t)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn, self._idle = self._idle, None
        return (conn, True) if conn is not None else (self._connect(), False)

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            old, self._idle = self._idle, conn
        if old is not None:
            old.close()

    def _exchange(self, body: bytes, cancel: CancelFn | None) -> tuple[int, dict[str, str], bytes]:
        """One POST on a helper thread, polling ``cancel``. Raises Cancelled, OSError,
        http.client.HTTPException."""
        for attempt in range(2):
            conn, reused = self._take()
            box: dict[str, Any] = {}
            done = threading.Event()

            def work(conn: http.client.HTTPConnection = conn, box: dict[str, Any] = box,
                     done: threading.Event = done) -> None:
                try:
                    conn.request("POST", self.path, body=body, headers=self._headers())
                    resp = conn.getresponse()
                    data = resp.read()
                    box["result"] = (resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                     data, resp.will_close)
                except BaseException as e:  # handed to the caller's thread
                    box["error"] = e
                finally:
                    done.set()

            thread = threading.Thread(target=work, name="diffill-remote", daemon=True)
            thread.start()
            while not done.wait(POLL_S):
                if cancel is not None and cancel():
                    _abort(conn)
                    raise Cancelled("cancelled while waiting for the remote model")
            err = box.get("error")
            if err is None:
                status, headers, data, will_close = box["result"]
                if will_close:
                    conn.close()
                else:
                    self._give_back(conn)
                return status, headers, data
            conn.close()
            stale = isinstance(err, (http.client.RemoteDisconnected, ConnectionResetError,
                                     BrokenPipeError))
            if not (reused and stale and attempt == 0):
                raise err
        raise AssertionError("unreachable")

    def _post_with_retries(self, body: bytes, cancel: CancelFn | None) -> dict[str, Any]:
        s = self.settings
        deadline = time.monotonic() + s.deadline_s
        attempt = 0
        while True:
            try:
                return self._attempt(body, cancel)
            except _Retryable as e:
                if attempt >= s.retries:
                    raise BackendError(f"remote model failed after {attempt + 1} attempts: {e}") from None
                delay = min(s.max_backoff_s, s.backoff_s * (2 ** attempt)) * (0.5 + self._rng.random() / 2)
                if e.retry_after is not None:
                    delay = max(delay, e.retry_after)
                if time.monotonic() + delay > deadline:
                    raise BackendError(f"remote model unavailable: {e}; retrying in {delay:.1f} s "
                                       f"would pass the {s.deadline_s:g} s deadline") from None
                attempt += 1
                self.retried += 1
                _sleep(delay, cancel)

    def _attempt(self, body: bytes, cancel: CancelFn | None) -> dict[str, Any]:
        try:
            status, headers, data = self._exchange(body, cancel)
        except Cancelled:
            raise
        except TimeoutError as e:
            raise _Retryable(f"timed out after {self.settings.timeout_s:g} s ({e})") from None
        except (OSError, http.client.HTTPException) as e:
            raise _Retryable(f"cannot reach {self.settings.url}: {type(e).__name__}: {e}") from None
        if status == 200:
            try:
                return json.loads(data)
            except ValueError:
                raise BackendError("remote answered 200 with a body that is not JSON") from None
        message = _error_message(data)
        if status in RETRY_STATUS:
            raise _Retryable(f"HTTP {status}: {message}", parse_retry_after(headers.get("retry-after")))
        if status in (401, 403):
            env = self.settings.api_key_env
            hint = (f"set the key in the environment variable {env}" if env
                    else "set apiKeyEnv to the variable that holds the key")
            raise BackendError(f"remote rejected the request (HTTP {status}: {message}); {hint}")
        raise BackendError(f"remote refused the request (HTTP {status}): {message}")

    def _candidates(self, data: Any) -> list[Candidate]:
        try:
            choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
            out = []
            for rank, c in enumerate(choices):
                text = c["text"]
                if not isinstance(text, str):
                    raise TypeError("text is not a string")
                out.append(Candidate(text=text, score=-float(rank)))
        except (KeyError, TypeError, AttributeError) as e:
            raise BackendError(f"remote answer is not an OpenAI completion: {e}") from None
        return out


def _error_message(data: bytes) -> str:
    try:
        err = json.loads(data)["error"]
        msg = err["message"] if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        msg = data[:200].decode("utf-8", "replace").strip() or "(empty body)"
    return str(msg)[:500]


def _abort(conn: http.client.HTTPConnection) -> None:
    """Unblock a thread waiting on ``conn`` and drop the connection."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def _sleep(seconds: float, cancel: CancelFn | None) -> None:
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        if cancel is not None and cancel():
            raise Cancelled("cancelled during back-off")
        time.sleep(min(left, 0.02))


def settings_from_options(options: Any) -> RemoteSettings:
    """:class:`RemoteSettings` from the language server's CompletionOptions."""
    timeout_s = float(getattr(options, "remote_timeout_ms", 10_000.0)) / 1000.0
    return RemoteSettings(
        url=getattr(options, "remote_url", DEFAULT_URL),
        model=getattr(options, "remote_model", None),
        api_key_env=getattr(options, "api_key_env", DEFAULT_KEY_ENV),
        timeout_s=timeout_s,
        retries=int(getattr(options, "remote_retries", 2)),
        deadline_s=max(timeout_s, 3.0 * timeout_s),
    )


def load_remote_backend(model_path: str | None = None, device: str = "cpu", *,
                        options: Any = None, **_: Any) -> RemoteBackend:
    """Factory for ``BACKENDS["openai"]`` (model_path/device belong to local backends)."""
    return RemoteBackend(settings_from_options(options) if options is not None else RemoteSettings())


__all__ = [
    "RemoteBackend",
    "RemoteSettings",
    "estimate_tokens",
    "load_remote_backend",
    "parse_retry_after",
    "settings_from_options",
]
