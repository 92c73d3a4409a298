"""``diffill serve-http``: the engine as an OpenAI-compatible completions API.

Needs the ``http`` extra (``pip install 'diffill[http]'``: aiohttp).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import re
import sys
from pathlib import Path

from ..backend.backends import load_local_backend
from ..completion.options import CompletionOptions, flag_errors, merge_options
from . import (
    add_device_option,
    add_recipe_option,
    add_threads_option,
    server_process,
)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve-http",
        aliases=["serve_http"],
        help="serve the model as an OpenAI-compatible /v1/completions API",
        description=(
            "Serve the model over HTTP: POST /v1/completions (prompt + suffix = fill in the "
            "middle), GET /v1/models, GET /health, and llama-server's POST /infill + GET /props "
            "(llama.vim, llama.vscode). Point diffill's editors at it with backend=\"openai\"."
        ),
    )
    p.add_argument("--model", default=None, metavar="DIR",
                   help="checkpoint folder (default: the shipped default model)")
    add_device_option(p)
    add_recipe_option(p)
    add_threads_option(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--token-env", metavar="VAR",
                      help="require 'Authorization: Bearer <token>', the token read from this "
                           "environment variable")
    auth.add_argument("--api-key-file", metavar="PATH",
                      help="require a bearer token, read from this file (first line)")
    p.add_argument("--max-queue", type=int, default=32, metavar="N",
                   help="requests admitted at once (running + waiting); more get 429 (default 32)")
    p.add_argument("--workers", type=int, default=4, metavar="N",
                   help="threads running requests; the engine batches requests that meet (default 4)")
    p.add_argument("--max-body-bytes", type=int, default=1024 * 1024, metavar="N",
                   help="largest request body; larger ones get 413 (default 1 MiB; at most "
                        "max-queue bodies are buffered at once)")
    p.add_argument("--request-timeout", type=float, default=60.0, metavar="S",
                   help="answer 504 this many seconds after admission, queue wait included; "
                        "the worker stops at its next diffusion step (default 60)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                   help="close a connection whose request line and headers are not complete "
                        "S seconds after it opened, or after a later request's first byte "
                        "(408; default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="close a request whose body has not fully arrived S seconds after "
                        "its headers (408; default 30)")
    p.add_argument("--idle-timeout", type=float, default=30.0, metavar="S",
                   help="close a kept-alive connection idle for S seconds (default 30)")
    p.add_argument("--max-connections", type=int, default=256, metavar="N",
                   help="open connections at once; a new one beyond gets 503 (default 256)")
    p.add_argument("--max-request-steps", type=int, default=64, metavar="N",
                   help="largest 'steps' a request may ask for; more is a 400 (default 64)")
    p.add_argument("--max-request-tokens", type=int, default=256, metavar="N",
                   help="largest 'max_tokens'; more is a 400 (default 256, lowered to what the "
                        "model's positions hold)")
    p.add_argument("--max-request-ms", type=float, default=None, metavar="MS",
                   help="largest predicted model time of one request, priced from the step "
                        "plan before it runs; more is a 400 (default: 5000 on a CPU, 1000 on "
                        "a GPU; see docs/team-serving.md)")
    p.add_argument("--steps", type=int, default=None,
                   help="refinement steps per request (default: from --latency-budget-ms)")
    p.add_argument("--latency-budget-ms", type=float, default=None,
                   help="target model time per request when --steps is not given")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="token budget for prefix + suffix (default 1024)")
    p.add_argument("--served-model-name", action="append", default=None, metavar="NAME",
                   help="name(s) clients send as 'model' (default: the checkpoint folder's name "
                        "and 'diffill')")
    p.add_argument("--log-file", default=None, help="write logs here (default: stderr)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (default info); prompts are never logged at any level ...")
    p.add_argument("--debug-log-buffers", action="store_true",
                   help="... unless this is given: log prompts and completions (implies debug)")
    return p


def read_token(args: argparse.Namespace) -> str | None:
    """The bearer token from --token-env / --api-key-file (None without either).
    Raises ValueError with a message that never contains the token."""
    if args.token_env:
        if not ENV_NAME.match(args.token_env):
            raise ValueError("--token-env takes the NAME of an environment variable, not the token")
        value = os.environ.get(args.token_env, "").strip()
        if not value:
            raise ValueError(f"--token-env {args.token_env}: the variable is unset or empty")
        return value
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ValueError(f"--api-key-file: cannot read {args.api_key_file}: {e.strerror}") from None
        value = lines[0].strip() if lines else ""
        if not value:
            raise ValueError(f"--api-key-file {args.api_key_file}: the file is empty")
        return value
    return None


def model_names(args: argparse.Namespace) -> list[str]:
    if args.served_model_name:
        return list(args.served_model_name)
    names = []
    if args.model:
        names.append(Path(args.model).resolve().name)
    if "diffill" not in names:
        names.append("diffill")
    return names


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401  (optional dependency: diffill[http]; checked first)
    except ImportError:
        print("diffill serve-http needs aiohttp: pip install 'diffill[http]'", file=sys.stderr)
        return 2
    if not server_process(args, "serve-http"):
        return 2
    from ..http.http_connection import HttpConfig, ListenError, serve  # needs aiohttp (above)
    from ..http.http_server import HttpFront  # needs aiohttp (above)

    raw: dict[str, object] = {"modelPath": args.model, "device": args.device}
    if args.recipe is not None:
        raw["recipe"] = args.recipe
    for flag, wire in (("steps", "steps"), ("latency_budget_ms", "latencyBudgetMs"),
                       ("context_tokens", "contextTokens")):
        if getattr(args, flag) is not None:
            raw[wire] = getattr(args, flag)
    options, errors = merge_options(CompletionOptions(), raw)
    try:
        if errors:
            raise ValueError("; ".join(flag_errors(raw) or errors))
        token = read_token(args)
        config = HttpConfig(
            token=token,
            max_queue=args.max_queue,
            workers=args.workers,
            max_body_bytes=args.max_body_bytes,
            request_timeout_s=args.request_timeout,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            idle_timeout_s=args.idle_timeout,
            max_connections=args.max_connections,
            max_request_steps=args.max_request_steps,
            max_request_tokens=args.max_request_tokens,
            max_request_ms=args.max_request_ms,
            model_names=model_names(args),
            debug_log_buffers=args.debug_log_buffers,
        )
        try:
            config.check()
        except ValueError as e:  # name the flag, not the field (max_queue_s -> --max-queue)
            field, _, rule = str(e).partition(" must be ")
            flag = "--" + field.removesuffix("_s").replace("_", "-")
            raise ValueError(f"{flag} must be {rule}") from None
    except ValueError as e:
        print(f"diffill serve-http: {e}", file=sys.stderr)
        return 2

    handler: logging.Handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if args.debug_log_buffers else getattr(logging, args.log_level.upper()))
    if token is None and not is_loopback(args.host):
        logging.getLogger("diffill.http").warning(
            "listening on %s without a token: anyone who can reach the port can use the model "
            "(see --token-env / --api-key-file)", args.host)

    front = HttpFront(
        options, config,
        loader=lambda: load_local_backend(options.model_path, options.device,
                                          max_steps=options.max_steps, options=options),
    )
    def ready(url: str) -> None:
        print(f"diffill serve-http: listening on {url}", file=sys.stderr, flush=True)

    try:
        asyncio.run(serve(front, args.host, args.port, ready))
    except ListenError as e:  # one line, as every other start-up error
        print(f"diffill serve-http: {e}", file=sys.stderr)
        return 2
    return 0
