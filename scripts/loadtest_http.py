#!/usr/bin/env python3
"""Load test for ``diffill serve-http`` (or any OpenAI-compatible /v1/completions).

N concurrent clients send M requests each (aiohttp, bounded: one request in flight
per client), greedy (``temperature: 0``). Every request carries a unique marker in
its prompt and an ``X-Request-Id``. The report keeps apart what load may legitimately
do and what it must never do:

* **latency** (p50 / p95 / p99 / max of the answered requests) and throughput;
* **429s**: counted, and retried after their ``Retry-After`` (capped) up to
  ``--retries`` times; other errors counted with samples;
* **lost**: every request must get exactly one final answer, 200 or an error;
* **identity**: the ``X-Request-Id`` echoed is the one sent, every ``id`` unique;
* **crossed answers** -- an answer that belongs to another request. ``--verify K``
  requests (chosen evenly) are sent again one at a time after the load, and, when
  that answer differs and the server reported the step count it ran the request
  with under load (``diffill.steps_planned``), once more alone *with those steps*.
  A greedy answer depends only on the prompt and the steps, so an answer under load
  that matches neither of its own prompt's answers alone is wrong: **crossed** when
  it is an answer alone of another verified request, else **unexplained** (it may
  have crossed with an unverified request, or the server is not deterministic). A
  crossing between two prompts whose answers alone are equal cannot be seen;
  ``distinguishable`` counts the verified requests whose answer alone is unique.
* **step drift** (not a wrong answer: a step policy that gives fewer steps under
  load): ``steps_drifted`` counts the verified requests that ran with other steps
  under load than alone (``steps_planned``, else the steps taken, ``diffill.steps``);
  ``differs_by_steps`` those whose answer under load is their own prompt's answer at
  the load's steps but not the answer alone -- load showing as silently different
  code rather than as latency. ``--fail-on-step-drift`` makes drift an error.
* **differs_unverified**: an answer that differs from its prompt's answer alone
  while the server did not report ``steps_planned`` (``diffill serve-http`` reports it
  when the request or ``--steps`` fixes the count; other servers may not at all):
  without the steps it cannot be reproduced, so a crossing cannot be told from a step
  count that moved with load. An error unless ``--allow-unverified``.

Prints a summary and, with ``--json PATH``, writes every figure. Exit status 1 when a
request was lost or answered out of place, or an answer crossed, is unexplained or
(without ``--allow-unverified``) unverified; with ``--fail-on-step-drift`` also when
steps drifted.

    python scripts/loadtest_http.py --url http://127.0.0.1:8000 --clients 8 --requests 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

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
    steps: int | None = None
    """``diffill.steps[0]``: the steps the middle took (None: not reported)."""
    planned: int | None = None
    """``diffill.steps_planned``: the step count it ran with (None: not reported)."""
    cid: str | None = None
    echoed: str | None = None
    latency_s: float = 0.0
    retries_429: int = 0
    error: str | None = None


@dataclass
class Verdict:
    """One verified request: its answer under load against its prompt's answers alone."""

    rid: str
    loaded: str
    loaded_steps: int | None
    loaded_planned: int | None
    alone: str | None
    """The answer alone, steps left to the server (None: the resend failed)."""
    alone_steps: int | None = None
    alone_planned: int | None = None
    same_steps: str | None = None
    """The answer alone with ``steps = loaded_planned`` (sent when that differs from
    ``alone_planned`` and the answers differ; None otherwise)."""
    kind: str = ""
    """"same", "by_steps", "differs_unverified", "crossed", "unexplained" or "failed"."""

    def own(self) -> set[str]:
        return {a for a in (self.alone, self.same_steps) if a is not None}

    def drifted(self) -> bool:
        if self.loaded_planned is not None and self.alone_planned is not None:
            return self.loaded_planned != self.alone_planned
        if self.loaded_steps is not None and self.alone_steps is not None:
            return self.loaded_steps != self.alone_steps
        return False


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
    crossed: int
    unexplained: int
    distinguishable: int
    steps_reported: bool
    steps_drifted: int
    differs_by_steps: int
    differs_unverified: int
    steps_under_load: dict[str, float] | None
    steps_alone: dict[str, float] | None
    error_rate: float
    error_samples: list[str] = field(default_factory=list)
    crossed_samples: list[str] = field(default_factory=list)


def prompt_for(rid: str, k: int) -> tuple[str, str]:
    """A prompt unique to the request (marker comment) and a suffix."""
    return f"# request {rid}\n" + TEMPLATES[k % len(TEMPLATES)], "\n"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    vs = sorted(values)
    return vs[max(0, min(len(vs) - 1, math.ceil(q / 100 * len(vs)) - 1))]


def classify(verdicts: list[Verdict]) -> tuple[int, int]:
    """Sets each verdict's ``kind``; returns (crossed, distinguishable)."""
    counts: dict[str, int] = {}
    for v in verdicts:
        if v.alone is not None:
            counts[v.alone] = counts.get(v.alone, 0) + 1
    distinguishable = sum(1 for v in verdicts if v.alone is not None and counts[v.alone] == 1)
    crossed = 0
    for v in verdicts:
        own = v.own()
        if v.alone is None:
            v.kind = "failed"
        elif v.loaded == v.alone:
            v.kind = "same"
        elif v.loaded in own:
            v.kind = "by_steps"
        elif v.loaded_planned is None:
            # the server did not tell the steps it ran with: a step count that moved
            # with load cannot be reproduced, so a crossing cannot be told from it
            v.kind = "differs_unverified"
        elif v.same_steps is None:
            v.kind = "failed"
        elif any(o is not v and v.loaded in o.own() for o in verdicts):
            v.kind = "crossed"
            crossed += 1
        else:
            v.kind = "unexplained"
    return crossed, distinguishable


def _steps_of(data: Any) -> tuple[int | None, int | None]:
    """(steps taken, steps planned) from an answer's ``diffill`` object."""
    d = data.get("diffill") if isinstance(data, dict) else None
    if not isinstance(d, dict):
        return None, None
    steps = d.get("steps")
    taken = int(steps[0]) if isinstance(steps, list) and steps else None
    planned = d.get("steps_planned")
    return taken, int(planned) if isinstance(planned, int) else None


async def one(session: aiohttp.ClientSession, url: str, rid: str, k: int, args: argparse.Namespace,
              headers: dict[str, str], steps: int | None = None) -> Result:
    prompt, suffix = prompt_for(rid, k)
    body: dict[str, Any] = {"prompt": prompt, "suffix": suffix, "max_tokens": args.max_tokens,
                            "temperature": 0, "user": rid}
    if args.model:
        body["model"] = args.model
    if steps is not None:
        body["steps"] = steps
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
                    res.steps, res.planned = _steps_of(data)
                else:
                    res.error = f"HTTP {r.status}: {str(data)[:200]}"
                break
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
            res.error = f"{type(e).__name__}: {e}"
            break
    res.latency_s = time.perf_counter() - t0
    return res


async def client(session: aiohttp.ClientSession, url: str, c: int, args: argparse.Namespace,
                 headers: dict[str, str], out: list[Result], run: str) -> None:
    for i in range(args.requests):
        out.append(await one(session, url, f"{run}-c{c}-r{i}", c + i, args, headers))


async def verify(session: aiohttp.ClientSession, url: str, sample: list[Result],
                 args: argparse.Namespace, headers: dict[str, str]) -> list[Verdict]:
    """The sampled requests again, one at a time: as sent, then (when the answer differs
    and the server told the steps it used under load) with those steps."""
    out = []
    for r in sample:
        assert r.text is not None
        alone = await one(session, url, r.rid, r.k, args, headers)
        v = Verdict(r.rid, r.text, r.steps, r.planned,
                    alone.text if alone.status == 200 else None, alone.steps, alone.planned)
        if v.alone is not None and v.alone != r.text and r.planned is not None:
            if r.planned == alone.planned:
                v.same_steps = v.alone
            else:
                again = await one(session, url, r.rid, r.k, args, headers, steps=r.planned)
                v.same_steps = again.text if again.status == 200 else None
        out.append(v)
    return out


def _used(planned: int | None, taken: int | None) -> int | None:
    return planned if planned is not None else taken


def _spread(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


async def main_async(args: argparse.Namespace) -> Report:
    url = args.url.rstrip("/") + "/v1/completions"
    headers = {}
    if args.token_env:
        headers["Authorization"] = f"Bearer {os.environ[args.token_env]}"
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    connector = aiohttp.TCPConnector(limit=args.clients)
    results: list[Result] = []
    run = uuid.uuid4().hex[:8]
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session, url, c, args, headers, results, run)
                               for c in range(args.clients)))
        wall = time.perf_counter() - t0
        ok = [r for r in results if r.status == 200 and r.text is not None]
        step = max(1, len(ok) // args.verify) if args.verify else 0
        sample = ok[::step][: args.verify] if step else []
        verdicts = await verify(session, url, sample, args, headers)
    crossed, distinguishable = classify(verdicts)
    for v in verdicts:
        if v.kind in ("crossed", "unexplained", "failed"):
            print(f"{v.kind.upper()} {v.rid} (steps {v.loaded_steps}, planned {v.loaded_planned}): "
                  f"under load {v.loaded!r}, alone {v.alone!r}, alone with the load's steps "
                  f"{v.same_steps!r}", file=sys.stderr)
    reported = [v for v in verdicts if v.loaded_steps is not None or v.loaded_planned is not None]
    drifted = [v for v in verdicts if v.drifted()]
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
        verified=len(verdicts), crossed=crossed,
        unexplained=sum(v.kind in ("unexplained", "failed") for v in verdicts),
        distinguishable=distinguishable,
        steps_reported=bool(reported),
        steps_drifted=len(drifted),
        differs_by_steps=sum(v.kind == "by_steps" for v in verdicts),
        differs_unverified=sum(v.kind == "differs_unverified" for v in verdicts),
        steps_under_load=_spread([_used(r.planned, r.steps) for r in ok
                                  if _used(r.planned, r.steps) is not None]),
        steps_alone=_spread([_used(v.alone_planned, v.alone_steps) for v in verdicts
                             if _used(v.alone_planned, v.alone_steps) is not None]),
        error_rate=round(len(errors) / total, 4) if total else 0.0,
        error_samples=[r.error or "" for r in errors[:5]],
        crossed_samples=[f"{v.rid}: {v.loaded!r} (alone {v.alone!r})"
                         for v in verdicts if v.kind == "crossed"][:5],
    )


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
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
    p.add_argument("--fail-on-step-drift", action="store_true",
                   help="exit 1 when a verified request got other steps under load than alone")
    p.add_argument("--allow-unverified", action="store_true",
                   help="exit 0 although answers differed from alone without a reported step "
                        "count to reproduce them (a load-dependent step policy)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here")
    return p.parse_args(argv)


def summary(rep: Report) -> str:
    drift = (f"steps drifted under load {rep.steps_drifted} of {rep.verified} (answer changed by "
             f"it {rep.differs_by_steps}, changed with other steps but not reproducible "
             f"{rep.differs_unverified}; steps under load {rep.steps_under_load}, alone "
             f"{rep.steps_alone})" if rep.steps_reported else "steps not reported by the server")
    return (f"{rep.total} requests ({rep.clients} clients x {rep.requests_per_client}) in {rep.wall_s} s: "
            f"{rep.requests_per_s} req/s sustained\n"
            f"  latency p50 {rep.p50_ms} ms, p95 {rep.p95_ms} ms, p99 {rep.p99_ms} ms, max {rep.max_ms} ms\n"
            f"  429s {rep.rejected_429} (retried); errors {rep.errors} (rate {rep.error_rate}); "
            f"lost {rep.lost}; duplicate ids {rep.duplicate_ids}; wrong X-Request-Id "
            f"{rep.wrong_request_id}\n"
            f"  verified alone {rep.verified} ({rep.distinguishable} distinguishable): crossed "
            f"{rep.crossed}, unexplained {rep.unexplained}\n"
            f"  {drift}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rep = asyncio.run(main_async(args))
    print(summary(rep))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(rep), f, indent=2)
    bad = (rep.lost or rep.duplicate_ids or rep.wrong_request_id or rep.crossed or rep.unexplained
           or (rep.differs_unverified and not args.allow_unverified)
           or (args.fail_on_step_drift and rep.steps_drifted))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
