"""File selection, reading and the provisional chunker, on real notes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import VAULTS
from ragd.config import Source
from ragd.ingest import chunker, sources
from ragd.ingest.chunker import HEADING


@pytest.mark.parametrize("pattern, path, ok", [
    ("**/*.md", "a.md", True),
    ("**/*.md", "x/y/a.md", True),
    ("**/*.md", "a.txt", False),
    ("*.md", "x/a.md", False),
    ("Templates/**", "Templates/a.md", True),
    ("Templates/**", "Other/Templates/a.md", False),
    ("**/Templates/**", "Other/Templates/a.md", True),
    ("notes/?.md", "notes/a.md", True),
    ("notes/?.md", "notes/ab.md", False),
    ("a+b (1).md", "a+b (1).md", True),
])
def test_globs(pattern, path, ok):
    assert sources.matches(path, (pattern,)) is ok


def test_scan_skips_dot_folders_and_follows_globs(tmp_path):
    for rel in ["a.md", "b.txt", ".obsidian/app.md", "sub/.git/x.md", "sub/c.md", ".hidden.md",
                "Templates/t.md"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path)  # a folder symlink is not followed: no loop
    src = Source("s", tmp_path, "obsidian", ("**/*.md",), ("Templates/**",))
    assert sorted(s.relpath for s in sources.scan(src)) == ["a.md", "sub/c.md"]


def test_read_reasons(tmp_path):
    (tmp_path / "bin.md").write_bytes(b"abc\x00def")
    (tmp_path / "big.md").write_text("x" * 100)
    (tmp_path / "bad.md").write_bytes(b"ok \xff\xfe ok")
    (tmp_path / "bom.md").write_bytes("\ufeffhello".encode())
    (tmp_path / "dangling.md").symlink_to(tmp_path / "nowhere.md")
    (tmp_path / "loop.md").symlink_to(tmp_path / "loop.md")
    for name, reason in [("bin.md", "binary file (contains NUL bytes)"),
                         ("big.md", "too large (100 bytes; the limit is "
                                    "index.max_file_bytes = 50)"),
                         ("dangling.md", "broken symlink"), ("loop.md", "symlink loop"),
                         ("gone.md", "file vanished")]:
        with pytest.raises(sources.Unreadable) as e:
            sources.read(tmp_path / name, 50)
        assert str(e.value) == reason
    c = sources.read(tmp_path / "bad.md", 50)
    assert c.text == "ok \ufffd\ufffd ok" and c.warning.startswith("invalid UTF-8 at byte 3")
    assert sources.read(tmp_path / "bom.md", 50).text == "hello"


@pytest.mark.skipif(os.getuid() == 0, reason="root reads every file")
def test_read_permission_denied(tmp_path):
    p = tmp_path / "secret.md"
    p.write_text("x")
    p.chmod(0)
    with pytest.raises(sources.Unreadable, match="permission denied"):
        sources.read(p, 50)


def test_chunks_follow_headings_and_keep_fences_whole():
    text = ("# Title\n\nFirst para.\n\n## Section\n\n```python\n# not a heading\n\nx = 1\n```\n"
            "\nLast para\ncontinues.\n")
    chunks = chunker.chunk_text(text, max_words=10, title="Note")  # the fence: 9 words
    assert [(c.heading, c.line_start, c.line_end) for c in chunks] == [
        ("Note > Title", 3, 3),
        ("Note > Title > Section", 7, 11),
        ("Note > Title > Section", 13, 14),
    ]
    assert chunks[1].text == "```python\n# not a heading\n\nx = 1\n```"


def all_notes():
    for vault in ("obsidian-tasks-docs", "dwarvesf-brain"):
        for p in sorted((VAULTS / vault).rglob("*.md")):
            if not any(part.startswith(".") for part in p.relative_to(VAULTS / vault).parts):
                yield p


def test_every_line_range_maps_back_and_covers_each_line_once():
    notes = 0
    for path in all_notes():
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        chunks = chunker.chunk_text(text, max_words=120)
        covered: dict[int, int] = {}
        for c in chunks:
            assert 1 <= c.line_start <= c.line_end <= len(lines), path
            assert "\n".join(lines[c.line_start - 1:c.line_end]).strip() == c.text, path
            for i in range(c.line_start, c.line_end + 1):
                covered[i] = covered.get(i, 0) + 1
        assert all(n == 1 for n in covered.values()), path  # no overlap in this chunker
        in_fence = False
        for i, line in enumerate(lines, 1):
            if chunker.FENCE.match(line):
                in_fence = not in_fence
            if line.strip() and not (HEADING.match(line) and not in_fence):
                assert i in covered, f"{path}:{i} not in any chunk"
        notes += 1
    assert notes > 900
