"""The HTTP face's wire: request bodies, errors, replies and the one prompt to fill
(:class:`Fill`) that every route turns its request into -- shared by the OpenAI routes
(:mod:`.http_server`) and llama-server's ``/infill`` (:mod:`.llama_infill`), which import
it (and not each other)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Annotated, TypeVar

import msgspec
from aiohttp import web
from msgspec import Meta

from ..text.context import FimContext, Snippet

T = TypeVar("T")

DEFAULT_MAX_TOKENS = 16
RID = re.compile(r"^[\x21-\x7e]{1,128}$")
MAX_STOP = 16
"""OpenAI allows 4; FIM clients send more (Continue's templates list a dozen)."""


# ----------------------------------------------------------------------------- wire types


class CompletionRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/completions`` body. Unknown fields are accepted and ignored."""

    prompt: str | list[str]
    suffix: str | None = None
    model: str | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=1024)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    seed: int | None = None
    user: str | None = None
    stream: bool | None = None
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    logit_bias: dict[str, float] | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    raw: bool = False
    """diffill extension: return the model's middles without post-processing."""
    steps: Annotated[int, Meta(ge=1, le=512)] | None = None
    """diffill extension: refinement steps (default: the server's)."""


class RequestError(Exception):
    """A client error with an HTTP status, an OpenAI error ``type`` and the bad field."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code
        self.headers = headers or {}


class Reply(web.Response):
    """A JSON response carrying a note for its access-log line (the error, or what a
    completion took), so each request is logged once."""

    note: str = ""
    quiet: bool = False
    """Logged at DEBUG (llama.vim's idle warm-ups, one a second while the user reads)."""


def error_body(err: RequestError) -> bytes:
    return msgspec.json.encode({"error": {"message": err.message, "type": err.kind,
                                          "param": err.param, "code": err.code}})


def error_response(err: RequestError, request_id: str | None = None) -> Reply:
    headers = dict(err.headers)
    if request_id:
        headers["X-Request-Id"] = request_id
    resp = Reply(status=err.status, body=error_body(err), content_type="application/json",
                 headers=headers)
    resp.note = f"{err.code or err.kind}: {err.message!r}"
    return resp


def raw_error(err: RequestError) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection, for the
    connection guard, which answers outside any request handler."""
    body = error_body(err)
    reason = HTTPStatus(err.status).phrase
    head = (f"HTTP/1.1 {err.status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


def param_of(e: msgspec.ValidationError) -> str | None:
    """The top-level field a msgspec error is about: ``"... - at `$.max_tokens[0]`"``
    or ``"Object missing required field `prompt`"``."""
    msg = str(e)
    m = re.search(r"at `\$\.(\w+)", msg) or re.search(r"required field `(\w+)`", msg)
    return m.group(1) if m else None


def decode_body(body: bytes, kind: type[T]) -> T:
    """A JSON body decoded and validated as ``kind`` (a msgspec Struct); a bad one raises
    :class:`RequestError` (400) naming the field. Every route's body goes through here."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        raise RequestError(400, f"invalid request: {e}", param=param_of(e)) from None
    except msgspec.DecodeError as e:
        raise RequestError(400, f"malformed JSON body: {e}") from None
    except RecursionError:
        raise RequestError(400, "malformed JSON body: nested too deeply") from None


def parse_request(body: bytes) -> CompletionRequest:
    """Decode and validate a request body; raises :class:`RequestError` (400)."""
    req = decode_body(body, CompletionRequest)
    if req.echo:
        raise RequestError(400, "echo=true is not supported", param="echo")
    if req.logprobs:
        raise RequestError(400, "logprobs are not supported; send null", param="logprobs")
    if req.best_of is not None and req.best_of != req.n:
        raise RequestError(400, "best_of must equal n (candidates are ranked by the model)",
                           param="best_of")
    if req.logit_bias:
        raise RequestError(400, "logit_bias is not supported", param="logit_bias")
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not prompts:
        raise RequestError(400, "prompt must be a string or a non-empty list of strings",
                           param="prompt")
    if len(prompts) * req.n > 16:
        raise RequestError(400, f"{len(prompts)} prompts x n={req.n} exceeds 16 choices",
                           param="prompt")
    stops = stop_list(req.stop)
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise RequestError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} "
                           "non-empty strings", param="stop")
    return req


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def earliest_stop(text: str, stops: list[str]) -> tuple[str, str]:
    """``text`` up to the earliest stop sequence (excluded) and that sequence ("": none)."""
    best, word = -1, ""
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best < 0 or i < best):
            best, word = i, s
    return (text, "") if best < 0 else (text[:best], word)


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop sequence (excluded); (text, whether one was found)."""
    cut, word = earliest_stop(text, stops)
    return cut, bool(word)


def cut_at_indent(text: str, n_indent: int) -> tuple[str, bool]:
    """``text`` up to (excluded) its first line after the first that holds something and
    is indented by fewer than ``n_indent`` spaces or tabs (llama-server's ``n_indent``);
    (text, whether it was cut)."""
    lines = text.split("\n")
    for i in range(1, len(lines)):
        line = lines[i]
        if line.strip() and len(line) - len(line.lstrip(" \t")) < n_indent:
            return "\n".join(lines[:i]) + "\n", True
    return text, False


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else f"\\x{ord(c) & 0xFF:02x}" for c in text)


PATH_WORDS = frozenset({"v1", "models", "completions", "fim", "health", "healthz", "infill",
                         "props"})
"""Path segments the access log shows as sent (the routes' own words); any other segment
is ``<redacted>``: a token pasted into a URL is most often a segment or a query item."""
QUERY_WORDS = frozenset({"api_key", "apikey", "api-key", "key", "token", "access_token",
                          "auth", "authorization", "bearer", "password", "secret", "model"})
"""Query keys the access log names (the usual names of a token sent in the URL, so an
operator sees what was tried); every other key, and every value, is ``<redacted>``."""


def log_target(raw_path: str, served: frozenset[str] | set[str] = frozenset()) -> str:
    """The request target for the access log, with nothing a client could have put a
    token in: path segments other than the routes' own words (and a served model's name
    after ``/v1/models/``) are ``<redacted>``, every query value is ``<redacted>``, and so
    is every query key but the usual names of a credential (the API takes no query
    parameters, so anything there is most likely a token: ``?T``, ``?T=1``, ``?api_key=T``).
    Control characters are escaped."""
    path, sep, query = raw_path.partition("?")
    segments = path.split("/")
    shown = []
    for i, seg in enumerate(segments):
        if not seg or seg in PATH_WORDS or segments[:i] == ["", "v1", "models"] and seg in served:
            shown.append(seg)
        else:
            shown.append("<redacted>")
    out = printable("/".join(shown))
    if not sep:
        return out
    parts = []
    for item in query.split("&"):
        key, eq, _ = item.partition("=")
        name = key if not key or key.lower() in QUERY_WORDS else "<redacted>"
        parts.append(f"{name}=<redacted>" if eq else name)
    return out + "?" + "&".join(parts)


def request_id(request: web.BaseRequest) -> str:
    """The client's ``X-Request-Id`` when it is a short printable token, else a new one."""
    rid = request.headers.get("X-Request-Id", "")
    return rid if RID.match(rid) else uuid.uuid4().hex


@dataclass
class Choice:
    text: str
    finish_reason: str
    tokens: int
    stop_word: str = ""
    """The stop sequence that cut the text ("" when none did)."""


@dataclass
class Fill:
    """One prompt to fill, whichever route it came from (the shared request path)."""

    prompt: str
    suffix: str
    max_tokens: int
    n: int = 1
    temperature: float = 0.0
    seed: int | None = None
    steps: int | None = None
    raw: bool = False
    healing: bool = True
    stops: list[str] = field(default_factory=list)
    snippets: tuple[Snippet, ...] = ()
    """Cross-file extra context (llama-server's ``input_extra``), written as the header."""
    n_indent: int = 0
    """Cut the middle before its first later line indented less than this (llama-server's
    ``n_indent``; 0: no cut)."""
    latency_budget_ms: float | None = None
    """The request's own latency budget (llama-server's ``t_max_predict_ms``)."""
    encode_batch: Callable[[list[str]], list[list[int]]] | None = None
    """A tokenizer to use instead of the backend's (the /infill route's cache)."""


@dataclass
class FillResult:
    choices: list[Choice]
    context: FimContext
    steps: int
    model_ms: float
    """Time inside the backend's denoising calls."""
    other_ms: float
    """The rest of the worker's time: context, tokenising, healing, post-processing."""
    steps_planned: int | None = None
    """The steps the model ran with when the request or the server named them (None: the
    latency budget chose them, :class:`~diffill.model.budget.StepDecision`)."""
    budget_ms: float | None = None
    """The latency budget the steps were chosen for (None: named steps, or no budget kept)."""
    max_steps: int | None = None
    """The most steps the budget may choose (the decision's bound; None: not known)."""
