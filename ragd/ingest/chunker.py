"""Provisional chunker: paragraph groups under markdown headings.

Each chunk holds whole paragraphs of one section, up to about ``max_words`` words (a paragraph
longer than that is split at line boundaries), and keeps its exact 1-based inclusive line
range. The Obsidian-aware chunker of the ingest issue replaces this module.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Chunk:
    heading: str
    line_start: int
    line_end: int
    text: str

    @property
    def text_hash(self) -> str:
        return text_hash(self.text)

    @property
    def embed_hash(self) -> str:
        return text_hash(embed_text(self.heading, self.text))


def text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def embed_text(heading: str, text: str) -> str:
    """What the embedding model sees for a chunk: its heading path, then its text, so that a
    chunk saying "these patients..." still carries its topic. (The model's document prefix is
    added by the embedder; it is part of the vector space, not of the text.)"""
    return f"{heading}\n\n{text}" if heading else text


def _blocks(lines: list[str]):
    """Yield (kind, start, end) over 0-based line indexes: 'heading' lines and 'para' runs.
    Fenced code stays inside one paragraph, blank lines and all."""
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if HEADING.match(line):
            yield "heading", i, i
            i += 1
            continue
        start, in_fence = i, False
        while i < n:
            line = lines[i]
            if FENCE.match(line):
                in_fence = not in_fence
            elif not in_fence and (not line.strip() or HEADING.match(line)):
                break
            i += 1
        yield "para", start, i - 1


def chunk_text(text: str, max_words: int = 200, title: str = "") -> list[Chunk]:
    lines = text.split("\n")
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []  # (level, heading) stack
    group: list[tuple[int, int]] = []  # line spans of the paragraphs in the current chunk
    words = 0

    def heading_path() -> str:
        return " > ".join([title] * bool(title) + [h for _, h in path])

    def flush() -> None:
        nonlocal group, words
        if group:
            start, end = group[0][0], group[-1][1]
            body = "\n".join(lines[start:end + 1]).strip()
            if body:
                chunks.append(Chunk(heading_path(), start + 1, end + 1, body))
        group, words = [], 0

    for kind, start, end in _blocks(lines):
        if kind == "heading":
            flush()
            m = HEADING.match(lines[start])
            level = len(m.group(1))
            while path and path[-1][0] >= level:
                path.pop()
            path.append((level, m.group(2)))
            continue
        n = sum(len(lines[k].split()) for k in range(start, end + 1))
        if words and words + n > max_words:
            flush()
        if n <= max_words:
            group.append((start, end))
            words += n
            continue
        # One paragraph over budget: cut it at line boundaries.
        seg_start, seg_words = start, 0
        for k in range(start, end + 1):
            w = len(lines[k].split())
            if seg_words and seg_words + w > max_words:
                group.append((seg_start, k - 1))
                flush()
                seg_start, seg_words = k, 0
            seg_words += w
        group.append((seg_start, end))
        words = seg_words
    flush()
    return chunks
