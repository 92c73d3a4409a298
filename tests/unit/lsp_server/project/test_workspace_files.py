"""The workspace's files: gitignore rules and the text a file must hold to be indexed."""

from __future__ import annotations

from diffill.lsp_server.project.workspace_files import IgnoreRules, parse_ignore, usable_text


def ignored(patterns: str, rel: str, is_dir: bool = False) -> bool:
    return IgnoreRules().child("", parse_ignore(patterns)).ignored(rel, is_dir)


def test_gitignore_rules():
    assert ignored("*.log\n", "a/b/x.log")
    assert not ignored("*.log\n", "a/b/x.logs")
    assert ignored("build/\n", "src/build", is_dir=True)
    assert not ignored("build/\n", "src/build")  # a file named build: dir-only pattern
    assert ignored("/top.txt\n", "top.txt") and not ignored("/top.txt\n", "a/top.txt")
    assert ignored("docs/*.md\n", "docs/a.md") and not ignored("docs/*.md\n", "docs/x/a.md")
    assert ignored("docs/**/*.md\n", "docs/x/y/a.md") and ignored("docs/**/*.md\n", "docs/a.md")
    assert ignored("**/gen\n", "a/b/gen", is_dir=True)
    assert ignored("*.py\n!keep.py\n", "x.py") and not ignored("*.py\n!keep.py\n", "keep.py")
    assert ignored("data?.csv\n", "data1.csv") and not ignored("data?.csv\n", "data12.csv")
    assert ignored("[ab].txt\n", "a.txt") and not ignored("[ab].txt\n", "c.txt")
    assert ignored("[!ab].txt\n", "c.txt") and not ignored("[!ab].txt\n", "a.txt")
    assert not ignored("# a comment\n\n", "# a comment")
    assert ignored("\\#hash\n", "#hash")


def test_nested_gitignore_is_relative_to_its_folder():
    rules = IgnoreRules().child("", parse_ignore("*.tmp\n")).child("sub", parse_ignore("/only.py\n"))
    assert rules.ignored("sub/only.py", False) and not rules.ignored("only.py", False)
    assert rules.ignored("sub/x.tmp", False)


def test_usable_text():
    assert usable_text(b"x = 1\r\ny = 2\r\n") == "x = 1\ny = 2\n"
    assert usable_text(b"\xff\xfe") is None
    assert usable_text(b"a\0b") is None
