"""Soak: 10,000+ completion requests with random edits, supersession, cancellation
and typed-ahead against ONE ``diffill serve`` process (the scripted checkpoint, which
suggests something after every template, 1 step, tiny holes). Measures the server's RSS (mean of the samples taken during the first
1,000 requests vs the last 1,000) and checks that every answer is fresh.

Freshness: the document is a fixed filler, then a line ``# rev <version>`` unique to
each document version, then one of several templates with the cursor at its end.
After each answered request ``diffill/status`` reports ``last_context``: the uri,
version and a digest of the prefix/suffix windows of the last model run. The
version must be the latest one and the digest must be that of a window of the
latest text that contains its ``# rev`` line -- a model run on a stale text could
not match. A request superseded by a newer edit must come back empty or with the
older version's run (never after the newer one), a cancelled one as
RequestCancelled (-32800) or an answer; typing the first character of a suggestion
is answered from the typed-ahead cache (no model run) with the rest of it.
"""

from __future__ import annotations

import hashlib
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from _lsp_raw import SERVE, RawClient, end_position, rss_kib
from support.scripts import load_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REQUESTS = int(os.environ.get("DIFFILL_SOAK_REQUESTS", "10000"))
OPTIONS = {"diffill": {"steps": 1, "maxTokens": 4, "numCandidates": 1, "contextTokens": 96}}
FILLER = "".join(f"# filler line {i}: constants = [{i}, {i * 7 % 13}]\n" for i in range(40))
TEMPLATES = load_script("loadtest_http").TEMPLATES[:6]  # the load test's buffers, its first six
CANCELLED = -32800


def digest(prefix: str, suffix: str) -> str:
    """The server's ``last_context.digest`` of a prefix/suffix window pair."""
    return hashlib.sha256((prefix + "\x00" + suffix).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def suggestions(res: dict[str, Any], inline: bool) -> tuple[str, ...] | None:
    """Insert texts of an answer; None for RequestCancelled."""
    if "error" in res:
        assert res["error"]["code"] == CANCELLED, res
        return None
    items = res["result"]["items"]
    return tuple(i["insertText"] if inline else i["textEdit"]["newText"] for i in items)


class Doc:
    """The client's copy of the soak document."""

    def __init__(self, client: RawClient, uri: str) -> None:
        self.c = client
        self.uri = uri
        self.version = 1
        self.text = FILLER + "# rev 1\n" + TEMPLATES[0]
        client.open(uri, self.text)

    def switch(self, j: int) -> None:
        """New version: replace everything after the filler by a fresh ``# rev`` line and
        template j (one incremental change)."""
        start = FILLER.count("\n")
        end_line, end_char = end_position(self.text)
        self.version += 1
        body = f"# rev {self.version}\n" + TEMPLATES[j]
        self.c.change(self.uri, self.version, [{
            "range": {"start": {"line": start, "character": 0},
                      "end": {"line": end_line, "character": end_char}}, "text": body}])
        self.text = FILLER + body

    def type(self, s: str) -> None:
        line, char = end_position(self.text)
        self.version += 1
        self.c.change(self.uri, self.version, [{
            "range": {"start": {"line": line, "character": char}, "end": {"line": line, "character": char}},
            "text": s}])
        self.text += s

    def ask(self, inline: bool) -> int:
        line, char = end_position(self.text)
        return (self.c.inline_async if inline else self.c.completion_async)(self.uri, line, char)

    def windows(self) -> set[str]:
        """Digests of every line-aligned prefix window (cursor at the end, empty suffix)
        that holds this version's ``# rev`` line."""
        marker = self.text.index("# rev ")
        starts = [0] + [i + 1 for i, ch in enumerate(self.text) if ch == "\n" and i < marker]
        return {digest(self.text[a:], "") for a in starts}


def test_soak(model_dir: Path, tmp_path: Path, capsys):
    rng = random.Random(20261129)
    c = RawClient([*SERVE, "--model", str(model_dir)], stderr_path=tmp_path / "server.err")
    counts = {"requests": 0, "fresh_checked": 0, "superseded_empty": 0, "cancelled": 0,
              "typeahead": 0, "non_empty": 0}
    rss: list[tuple[int, int]] = []
    try:
        c.initialize(OPTIONS)
        assert c.wait_loaded()["loaded"]
        doc = Doc(c, "file:///soak/doc.py")

        def status() -> dict[str, Any]:
            return c.request("diffill/status")["result"]

        def check_fresh() -> dict[str, Any]:
            st = status()
            last = st["last_context"]
            assert (last["uri"], last["version"]) == (doc.uri, doc.version), (last, doc.version)
            assert last["digest"] in doc.windows(), "the model ran on a text that is not the latest"
            counts["fresh_checked"] += 1
            return st

        t0 = time.perf_counter()
        while counts["requests"] < REQUESTS:
            op = rng.random()
            inline = rng.random() < 0.5
            j = rng.randrange(len(TEMPLATES))
            doc.switch(j)
            if op < 0.55:  # edit, ask, wait
                got = suggestions(c.wait_for(doc.ask(inline)), inline)
                counts["non_empty"] += bool(got)
                st = check_fresh()
                counts["requests"] += 1
                # typed-ahead: type the suggestion's first character, the rest comes from the cache
                if got and inline and got[0][1:].strip() and rng.random() < 0.5:
                    hits = st.get("cache_hits", 0)
                    doc.type(got[0][0])
                    again = suggestions(c.wait_for(doc.ask(True)), True)
                    assert again == (got[0][1:],), (again, got)
                    assert status().get("cache_hits", 0) == hits + 1
                    counts["typeahead"] += 1
                    counts["requests"] += 1
            elif op < 0.8:  # ask, edit again before the answer: the first one is stale
                old = doc.ask(inline)
                doc.switch(rng.randrange(len(TEMPLATES)))
                new = doc.ask(inline)
                stale = suggestions(c.wait_for(old), inline)
                counts["superseded_empty"] += stale == ()
                suggestions(c.wait_for(new), inline)
                check_fresh()
                counts["requests"] += 2
            else:  # ask and cancel at once
                rid = doc.ask(inline)
                c.notify("$/cancelRequest", {"id": rid})
                got = suggestions(c.wait_for(rid), inline)
                if got is None:
                    counts["cancelled"] += 1
                counts["requests"] += 1
            if counts["requests"] // 100 > len(rss):
                rss.append((counts["requests"], rss_kib(c.pid)))
        elapsed = time.perf_counter() - t0
        final = status()
        assert c.shutdown() == 0
    finally:
        c.kill()

    n = counts["requests"]
    first = [kib for k, kib in rss if k <= 1000]
    last = [kib for k, kib in rss if k > n - 1000]
    first_mib, last_mib = statistics.mean(first) / 1024, statistics.mean(last) / 1024
    counters = {k: v for k, v in final.items() if isinstance(v, int) and not isinstance(v, bool)}
    with capsys.disabled():
        print(f"\n[soak] {n} completion requests in {elapsed:.1f} s ({n / elapsed:.0f} req/s, "
              f"plus {counts['fresh_checked']} status checks); fresh: {counts['fresh_checked']} "
              f"model runs checked against the latest version; {counts['superseded_empty']} "
              f"superseded answered empty; {counts['cancelled']} RequestCancelled; "
              f"{counts['typeahead']} typed-ahead cache answers; {counts['non_empty']} non-empty "
              f"answers; server RSS mean over the first 1000 requests {first_mib:.1f} MiB, "
              f"last 1000 {last_mib:.1f} MiB (growth {last_mib - first_mib:+.1f} MiB); RSS every 1000 requests (MiB): "
              f"{[round(kib / 1024, 1) for k, kib in rss if k % 1000 < 100]}; "
              f"status counters {counters}")
    assert counts["superseded_empty"] > 0 and counts["cancelled"] > 0
    assert counts["non_empty"] > 0 and counts["typeahead"] > 0
    assert final["in_flight"] == 0  # no handler future left behind (pygls kept one per didChange)
    assert last_mib - first_mib < max(32.0, 0.15 * first_mib), "server memory keeps growing"
