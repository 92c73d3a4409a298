"""Draft sources: the analogy and typeahead sources and :func:`propose` over all of them, exact
drafts for concrete buffers (``|`` marks the cursor); the lookups: test_lookup.py."""

from __future__ import annotations

from diffill.lsp_server.drafting.drafts import DEFAULT_SOURCES, Analogy, Typeahead, propose
from diffill.lsp_server.drafting.query import Draft, DraftQuery
from support.drafting import LOOK, SIBLINGS, SOURCES, query, texts


def test_default_sources_in_fixed_order():
    assert [s.name for s in DEFAULT_SOURCES] == ["lookup", "suffix", "analogy", "typeahead"]


# --- analogy --------------------------------------------------------------------------------


def test_analogy_source_wraps_the_rules():
    pre = "def f(xs):\n    for x in xs:\n        print(x)\n    total = 0\n    for y in xs:\n"
    q = DraftQuery(pre + "\n    return total\n", len(pre))
    assert Analogy().propose(q) == [Draft("        print(x)", "analogy")]
    multi = DraftQuery(q.text, q.offset, multiline=True)
    assert Analogy().propose(multi) == [Draft("        print(x)\n    total = 0", "analogy")]
    # the cursor after the indentation: not repeated
    q = DraftQuery(pre + "        \n    return total\n", len(pre) + 8)
    assert Analogy().propose(q) == [Draft("print(x)", "analogy")]
    # nothing applies -> no draft
    assert Analogy().propose(DraftQuery("x = 1\n\n", 6)) == []


# --- typeahead ------------------------------------------------------------------------------


def test_typeahead_overlap():
    src = "def f(xs):\n    for x in xs:\n        tot|\n"
    assert [d.text for d in Typeahead().propose(query(src, recalled=["total += x"]))] == ["al += x"]
    # the whole suggestion where it was shown (line left of the cursor blank)
    src = "def f(xs):\n    for x in xs:\n        |\n"
    assert [d.text for d in Typeahead().propose(query(src, recalled=["total += x"]))] == [
        "total += x"
    ]
    # shown at column 0 with its indentation; the indentation typed since is not repeated
    assert [d.text for d in Typeahead().propose(query(src, recalled=["        total += x"]))] == [
        "total += x"
    ]
    # a span suggestion whose first line was typed: the rest (one line for a line hole)
    src = "a = 1\n|\n"
    rec = ["a = 1\nb = 2\nc = 3"]
    assert [d.text for d in Typeahead().propose(query(src, recalled=rec))] == ["b = 2"]
    assert [d.text for d in Typeahead().propose(query(src, recalled=rec, multiline=True))] == [
        "b = 2\nc = 3"
    ]


def test_typeahead_reindents_a_recalled_block_for_the_line_it_lands_on():
    """A two-line suggestion shown at depth 8 (under ``if __name__ == "__main__":`` in a
    nested block) came back at depth 4 with its second line still 8 spaces in: an
    IndentationError once accepted. The server's cache keeps a multi-line suggestion
    relative to its first line's depth (``scheduler.relative_block``); the source re-indents
    it as a block where it lands."""
    from diffill.lsp_server.protocol.scheduler import relative_block

    shown = relative_block("main()\n        sys.exit(0)", "        ")
    assert shown == "main()\nsys.exit(0)"
    got = Typeahead().propose(query("def f():\n    |\n", recalled=[shown], multiline=True))
    assert [d.text for d in got] == ["main()\n    sys.exit(0)"]
    # its first line typed on a line at depth 4: the rest at that line's depth
    got = Typeahead().propose(query("def f():\n    mai|\n", recalled=[shown], multiline=True))
    assert [d.text for d in got] == ["n()\n    sys.exit(0)"]
    # and across the newline, typed at depth 4 ("main()" Enter and the indentation)
    got = Typeahead().propose(query("def f():\n    main()\n    |\n", recalled=[shown],
                                    multiline=True))
    assert [d.text for d in got] == ["sys.exit(0)"]
    # a later line left of the first line's depth: only the first line is kept
    assert relative_block("x = 1\n  y = 2", "    ") == "x = 1"


def test_typeahead_without_overlap_gives_nothing():
    src = "def f(xs):\n    for x in xs:\n        cou|\n"
    assert Typeahead().propose(query(src, recalled=["total += x"])) == []
    # nor inside an identifier ("subtot" does not continue "total")
    assert Typeahead().propose(query("subtot|\n", recalled=["total += x"])) == []
    # typed in full: nothing left
    assert Typeahead().propose(query("total += x|\n", recalled=["total += x"])) == []
    assert Typeahead().propose(query("x = |\n")) == []


def test_typeahead_order_and_dedupe():
    rec = ["total += x", "tally = 0", "total += x", "count = 1"]
    got = Typeahead().propose(query("    t|\n", recalled=rec))
    assert [d.text for d in got] == ["otal += x", "ally = 0"]


# --- propose --------------------------------------------------------------------------------


def test_propose_dedupes_across_sources_first_wins():
    src = 'log.info("start", user=user, n=3)\nx = 1\nlog.info("start", |)\n'
    q = query(src, recalled=['log.info("start", user=user, n=3)', 'log.info("start", n=4)'])
    # lookup, analogy and typeahead all say "user=user, n=3": one draft, from lookup; the
    # typeahead's second guess does not take the freed slot
    assert texts(propose(q, sources=SOURCES)) == [("lookup", "user=user, n=3")]
    assert texts(propose(q, per_source=2, sources=SOURCES)) == [
        ("lookup", "user=user, n=3"),
        ("typeahead", "n=4"),
    ]


def test_propose_one_per_source_in_order_and_limit():
    src = "acc = fetch(x, y, z)\nb = 1\nacc = fetch(p, q)\nc = 2\nacc = fetch(|, z)\n"
    q = query(src, recalled=["acc = fetch(r, z)"])
    assert texts(propose(q, sources=SOURCES)) == [
        ("lookup", "x, y"),
        ("analogy", "p, q)"),
        ("typeahead", "r"),
    ]
    assert texts(propose(q, limit=2, sources=SOURCES)) == [("lookup", "x, y"), ("analogy", "p, q)")]
    assert texts(propose(q, limit=1, sources=SOURCES)) == [("lookup", "x, y")]
    assert texts(propose(q, per_source=2, limit=3, sources=SOURCES)) == [
        ("lookup", "x, y"),
        ("lookup", "p, q)"),
        ("typeahead", "r"),
    ]
    assert propose(q, sources=[]) == []
    # sources in the order given
    assert texts(propose(q, sources=[Typeahead(), LOOK])) == [
        ("typeahead", "r"),
        ("lookup", "x, y"),
    ]


def test_propose_is_deterministic():
    q = query(SIBLINGS, multiline=True, recalled=["    assert calc.sub(1, 2) == -1"])
    assert propose(q, sources=SOURCES) == propose(q, sources=SOURCES) == propose(query(SIBLINGS, multiline=True,
                                                     recalled=["    assert calc.sub(1, 2) == -1"]), sources=SOURCES)
