"""``diffill serve``: the language server on stdio (default) or TCP."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys

from ..completion.options import CompletionOptions, flag_errors, merge_options
from ..protocol.server import create_server
from ..protocol.server_log import setup_logging
from . import (
    add_device_option,
    add_recipe_option,
    add_threads_option,
    server_process,
)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve",
        help="run the language server (stdio, or --tcp HOST:PORT)",
        description=(
            "Run the diffill language server. Model options given here are defaults; the "
            "client's initializationOptions / workspace settings (under \"diffill\") override them."
        ),
        epilog=(
            "Test hooks: the environment variable DIFFILL_DEBUG_STEP_DELAY_MS=N makes the local "
            "backend sleep N ms at every per-step cancel check, so tests get deterministic "
            "slowness for cancellation; DIFFILL_DEBUG_LOAD_DELAY_MS=N makes every model load "
            "wait N ms first, so tests can act while the model loads. Never set them in normal use."
        ),
    )
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="checkpoint folder or pulled checkpoint name (default: the shipped model)")
    add_device_option(p, default=None, note=" (default: the editor's `device` option, else cpu)")
    add_recipe_option(p)
    add_threads_option(p)
    p.add_argument("--tcp", default=None, metavar="HOST:PORT", help="listen on TCP instead of stdio")
    p.add_argument("--stdio", action="store_true",
                   help="use stdin/stdout (the default; accepted because many clients pass it)")
    p.add_argument("--log-file", default=None, help="write logs here (default: stderr)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (default info); buffer contents are redacted at every level; "
                        "a request answered with an error logs one WARNING line (ERROR for an "
                        "internal error), its traceback only at debug")
    p.add_argument("--debug", action="store_true",
                   help="the same as --log-level debug: pygls's own records and the traceback "
                        "of every error answer too (buffer contents still redacted)")
    p.add_argument("--debug-log-buffers", action="store_true",
                   help="--debug plus buffer contents (prefix/suffix, suggestions) in the log; "
                        "off by default, never in normal use")
    return p


def parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--tcp {value!r}: expected HOST:PORT, e.g. 127.0.0.1:2087")
    return host or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    raw: dict[str, object] = {}
    if args.model is not None:
        raw["modelPath"] = args.model
    if args.device is not None:
        raw["device"] = args.device
    if args.recipe is not None:
        raw["recipe"] = args.recipe
    defaults, errors = merge_options(CompletionOptions(), raw)
    if errors:
        print("diffill serve: " + "; ".join(flag_errors(raw) or errors), file=sys.stderr)
        return 2
    if not server_process(args, "serve"):
        return 2
    hostport = None
    if args.tcp:
        try:
            hostport = parse_hostport(args.tcp)
        except ValueError as e:
            print(f"diffill serve: {e}", file=sys.stderr)
            return 2
    setup_logging(args.log_file, args.debug_log_buffers, "debug" if args.debug else args.log_level)
    # A crash in native code (an abort in a torch thread, a segfault) prints every
    # thread's Python stack to stderr, where editors keep the server's output.
    faulthandler.enable(sys.stderr, all_threads=True)
    server = create_server(defaults, debug_log_buffers=args.debug_log_buffers)
    if hostport is not None:
        server.start_tcp(*hostport)
    else:
        server.start_io()
    # Leave at once: the stdin reader and model threads are not joined (they may be
    # blocked in a read or a diffusion step); nothing is left to flush but the logs.
    logging.shutdown()
    os._exit(server.exit_code)
