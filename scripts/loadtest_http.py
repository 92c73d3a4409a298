#!/usr/bin/env python3
"""Load test for ``diffill serve-http`` (or any OpenAI-compatible /v1/completions).

N concurrent clients send M requests each (aiohttp, bounded: one request in flight
per client). Every request carries a unique marker in its prompt and an
``X-Request-Id``; the report checks that

* every request got exactly one final answer (none lost): 200, or an error; a 429 is
  counted and retried after its ``Retry-After`` (capped), up to ``--retries`` times;
* the ``X-Request-Id`` echoed is the one sent and every ``id`` is unique;
* the answer is the prompt's own: with temperature 0 the completion depends only on
  the prompt, so ``--verify K`` requests (chosen evenly) are sent again one at a
  time after the load and their texts must be identical -- a completion crossed
  with another client's (different marker, different prompt) would not match.

Prints a summary and, with ``--json PATH``, writes every figure. Exit status 1 when a
request was lost, answered out of place, or a verification mismatched.

    python scripts/loadtest_http.py --url http://127.0.0.1:8000 --clients 8 --requests 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field

import aiohttp

TEMPLATES = [
    "def add_numbers(a, b):\n    total = a + b\n    return ",
    "def greet_user(name):\n    message = ",
    "def square_list(values):\n    result = ",
    "def is_even(number):\n    return number ",
    "def celsius_to_kelvin(celsius):\n    kelvin = ",
    "def reverse_words(sentence):\n    words = ",
    "def max_of_three(x, y, z):\n    best = ",
    "def merge_dicts(left, right):\n    merged = ",
]


@dataclass
class Result:
    rid: str
    k: int
    status: int = 0
    text: str | None = None
    cid: str | None = None
    echoed: str | None = None
    latency_s: float = 0.0
    retries_429: int = 0
    error: str | None = None


@dataclass
class Report:
    url: str
    clients: int
    requests_per_client: int
    total: int
    wall_s: float
    ok: int
    errors: int
    rejected_429: int
    lost: int
    requests_per_s: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    duplicate_ids: int
    wrong_request_id: int
    verified: int
    mismatched: int
    error_rate: float
    error_samples: list[str] = field(default_factory=list)


def prompt_for(rid: str, k: int) -> tuple[str, str]:
    """A prompt unique to the request (marker comment) and a suffix."""
    return f"# request {rid}\n" + TEMPLATES[k % len(TEMPLATES)], "\n"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    vs = sorted(values)
    return vs[max(0, min(len(vs) - 1, math.ceil(q / 100 * len(vs)) - 1))]


async def one(session: aiohttp.ClientSession, url: str, rid: str, k: int, args: argparse.Namespace,
              headers: dict[str, str]) -> Result:
    prompt, suffix = prompt_for(rid, k)
    body = {"prompt": prompt, "suffix": suffix, "max_tokens": args.max_tokens, "temperature": 0,
            "user": rid}
    if args.model:
        body["model"] = args.model
    res = Result(rid, k)
    t0 = time.perf_counter()
    for attempt in range(args.retries + 1):
        try:
            async with session.post(url, json=body, headers={**headers, "X-Request-Id": rid}) as r:
                res.status = r.status
                res.echoed = r.headers.get("X-Request-Id")
                data = await r.json(content_type=None)
                if r.status == 429 and attempt < args.retries:
                    res.retries_429 += 1
                    wait = float(r.headers.get("Retry-After", "1"))
                    await asyncio.sleep(min(wait, args.max_retry_wait))
                    continue
                if r.status == 200:
                    res.cid = data["id"]
                    res.text = data["choices"][0]["text"]
                else:
                    res.error = f"HTTP {r.status}: {str(data)[:200]}"
                break
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
            res.error = f"{type(e).__name__}: {e}"
            break
    res.latency_s = time.perf_counter() - t0
    return res


async def client(session: aiohttp.ClientSession, url: str, c: int, args: argparse.Namespace,
                 headers: dict[str, str], out: list[Result]) -> None:
    run = uuid.uuid4().hex[:8]
    for i in range(args.requests):
        out.append(await one(session, url, f"{run}-c{c}-r{i}", c + i, args, headers))


async def main_async(args: argparse.Namespace) -> Report:
    url = args.url.rstrip("/") + "/v1/completions"
    headers = {}
    if args.token_env:
        headers["Authorization"] = f"Bearer {os.environ[args.token_env]}"
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    connector = aiohttp.TCPConnector(limit=args.clients)
    results: list[Result] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session, url, c, args, headers, results)
                               for c in range(args.clients)))
        wall = time.perf_counter() - t0
        ok = [r for r in results if r.status == 200 and r.text is not None]
        # verification: the same prompts one at a time, after the load
        step = max(1, len(ok) // args.verify) if args.verify else 0
        sample = ok[::step][: args.verify] if step else []
        mismatched = 0
        for r in sample:
            again = await one(session, url, r.rid, r.k, args, headers)
            if again.text != r.text:
                mismatched += 1
                print(f"MISMATCH {r.rid}: under load {r.text!r}, alone {again.text!r}", file=sys.stderr)
    total = args.clients * args.requests
    ids = [r.cid for r in ok]
    lat_ms = [r.latency_s * 1000 for r in ok]
    errors = [r for r in results if r.status != 200]
    return Report(
        url=args.url, clients=args.clients, requests_per_client=args.requests, total=total,
        wall_s=round(wall, 3), ok=len(ok), errors=len(errors),
        rejected_429=sum(r.retries_429 for r in results) + sum(r.status == 429 for r in results),
        lost=total - len(results),
        requests_per_s=round(len(ok) / wall, 2) if wall > 0 else 0.0,
        p50_ms=_r(percentile(lat_ms, 50)), p95_ms=_r(percentile(lat_ms, 95)),
        p99_ms=_r(percentile(lat_ms, 99)), max_ms=_r(max(lat_ms) if lat_ms else None),
        duplicate_ids=len(ids) - len(set(ids)),
        wrong_request_id=sum(r.echoed != r.rid for r in ok),
        verified=len(sample), mismatched=mismatched,
        error_rate=round(len(errors) / total, 4) if total else 0.0,
        error_samples=[r.error or "" for r in errors[:5]],
    )


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (no /v1)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=50, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--model", default=None)
    p.add_argument("--token-env", default=None, help="environment variable holding the bearer token")
    p.add_argument("--retries", type=int, default=20, help="retries of a request answered 429")
    p.add_argument("--max-retry-wait", type=float, default=1.0, help="cap on a Retry-After wait (s)")
    p.add_argument("--timeout", type=float, default=120.0, help="per request (s)")
    p.add_argument("--verify", type=int, default=32, help="requests re-sent alone and compared")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rep = asyncio.run(main_async(args))
    print(f"{rep.total} requests ({rep.clients} clients x {rep.requests_per_client}) in {rep.wall_s} s: "
          f"{rep.requests_per_s} req/s sustained; latency p50 {rep.p50_ms} ms, p95 {rep.p95_ms} ms, "
          f"p99 {rep.p99_ms} ms; errors {rep.errors} (rate {rep.error_rate}), 429s {rep.rejected_429} "
          f"(retried); lost {rep.lost}; duplicate ids {rep.duplicate_ids}; wrong X-Request-Id "
          f"{rep.wrong_request_id}; verified alone {rep.verified}, mismatched {rep.mismatched}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(rep), f, indent=2)
    bad = rep.lost or rep.duplicate_ids or rep.wrong_request_id or rep.mismatched
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
