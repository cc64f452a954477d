"""Chunks: sections of a document, packed to a token budget, with exact line ranges.

A chunk never crosses a heading. A section's blocks are packed greedily up to the budget; a block
over the budget is cut at its lines, a line over the budget at its sentences, a sentence over it
at its words. Code fences, tables and callouts are never cut unless they alone exceed the budget.
When a section needs several chunks, each starts with the last piece of the one before (if that
piece is small): a little overlap so that no sentence loses its neighbour.

Each chunk keeps three texts:
- ``text``: what is shown — the source lines themselves (line_start..line_end, 1-based,
  inclusive), or the exact sentences when a long line had to be cut;
- ``body``: what is searched and embedded — ``text`` with Obsidian syntax made readable;
- the contextual header (``heading``: "Note title > H1 > H2") goes before the body when
  embedding, so a chunk saying "these patients…" still carries its topic.

Tokens are estimated without the engine: 1.25 x the word-and-punctuation pieces, the 90th
percentile of WordPiece tokens per piece measured on the shared vaults (median 1.16).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ragd.ingest.markdown import HTML_COMMENT, Block, Doc, clean_text
from ragd.text import with_symbols

TOKENS_PER_PIECE = 1.25
_PIECE = re.compile(r"\w+|[^\w\s]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


def est_tokens(text: str) -> int:
    return _tokens(len(_PIECE.findall(text)))


def _tokens(pieces: int) -> int:
    """est_tokens of a text from its count of _PIECE matches."""
    return int(pieces * TOKENS_PER_PIECE + 0.999)


_SPACE = re.compile(r"\s+")


def text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


# An address in a text: a URL, up to the space, quote, bracket or parenthesis that ends it
_ADDRESS = re.compile(r"""\b[a-z][a-z0-9+.-]*://[^\s<>()\[\]"']+""", re.IGNORECASE)


def read_hash(text: str) -> str:
    """The hash of a chunk's text as a reader takes it in: its addresses (URLs) left out and
    its spaces as one. Two chunks of one hash say the same thing (search/boilerplate.py): a
    footer that links each note's own page ("[Edit In GitHub](https://…/<this note>.md)"),
    a template's line citing each note's source, are one text copied into every note, and
    with their addresses in were as many different texts."""
    if "://" in text:  # (most texts hold no URL: they skip the pattern's scan)
        text = _ADDRESS.sub("", text)
    return text_hash(" ".join(text.split()))


def embed_text(heading: str, body: str) -> str:
    """What the embedding model sees: the contextual header, then the body. (The model's
    document prefix is added by the embedder: it belongs to the vector space.)"""
    return f"{heading}\n\n{body}" if heading else body


@dataclass
class Chunk:
    heading: str
    line_start: int
    line_end: int
    text: str
    body: str = ""
    keywords: str = ""

    @property
    def text_hash(self) -> str:
        """(What chunks.text_hash holds: see read_hash.)"""
        return read_hash(self.text)

    @property
    def embed_hash(self) -> str:
        return text_hash(embed_text(self.heading, self.body))


@dataclass
class _Piece:
    start: int  # 0-based line
    end: int
    text: str  # the exact source text of the piece
    tokens: int
    whole: bool  # whole lines (True) or a part of one line (False)
    col: int = 0  # a part of a line: its character span in that line
    col_end: int = 0
    context: str = ""  # read before it when it starts a chunk: a table row's header row


def _spans(text: str, pattern: re.Pattern, offset: int) -> list[tuple[int, int]]:
    """Character spans of the parts of text between matches of pattern (shifted by offset)."""
    out, pos = [], 0
    for m in pattern.finditer(text):
        out.append((offset + pos, offset + m.start()))
        pos = m.end()
    out.append((offset + pos, offset + len(text)))
    return [(a, b) for a, b in out if b > a]


def _split_line(line_text: str, line: int, budget: int) -> list[_Piece]:
    """A line over the budget: its sentences (a sentence over the budget: groups of words),
    each with its exact span in the line."""
    out: list[_Piece] = []
    lead = len(line_text) - len(line_text.lstrip())
    for a, b in _spans(line_text.strip(), _SENTENCE_END, lead):
        sentence = line_text[a:b]
        if est_tokens(sentence) <= budget:
            out.append(_Piece(line, line, sentence, est_tokens(sentence), False, a, b))
            continue
        # cut at spaces, up to the budget. The count of line_text[start:end] is kept as the
        # words come (no _PIECE match spans a space): counted again at each word, cutting a
        # long line was quadratic in its pieces, and the indexer's lane waited on it
        start = end = a
        count = 0
        for wa, wb in _spans(sentence, _SPACE, a):
            n = len(_PIECE.findall(line_text, wa, wb))
            if end > start and _tokens(count + n) > budget:
                out.append(_Piece(line, line, line_text[start:end], _tokens(count), False,
                                  start, end))
                start, count = wa, 0
            end = wb
            count += n
        out.append(_Piece(line, line, line_text[start:end], _tokens(count), False, start, end))
    return out


def _pieces(doc: Doc, b: Block, budget: int) -> list[_Piece]:
    """A block as one piece when it fits the budget; else its lines, and the sentences of a
    line that does not fit. The packer groups them again up to the budget."""
    text = "\n".join(doc.lines[b.start:b.end + 1])
    tokens = est_tokens(text)
    if tokens <= budget:
        return [_Piece(b.start, b.end, text, tokens, True)]
    out: list[_Piece] = []
    # Rows of a table cut into several chunks keep their header row (its first line): a row
    # reads as "| 2.3.0 | ... |" without it.
    header = doc.lines[b.start].strip() if b.kind == "table" else ""
    for i in range(b.start, b.end + 1):
        line = doc.lines[i]
        if not line.strip():
            continue
        t = est_tokens(line)
        pieces = _split_line(line, i, budget) if t > budget else [_Piece(i, i, line, t, True)]
        if header and i > b.start + 1:  # after the header and its |---| line
            for p in pieces:
                p.context = header
        out += pieces
    return out


def _display(doc: Doc, pieces: list[_Piece]) -> str:
    if all(p.whole for p in pieces):  # the source lines themselves, blank lines and all
        return "\n".join(doc.lines[pieces[0].start:pieces[-1].end + 1]).strip()
    parts: list[str] = []
    run: _Piece | None = None  # consecutive parts of one line are shown as its exact slice
    for p in pieces:
        if p.whole:
            parts.append(p.text.strip())
            run = None
        elif run is not None and p.start == run.start:
            parts[-1] = doc.lines[p.start][run.col:p.col_end].strip()
        else:
            parts.append(p.text.strip())
            run = p
    return "\n".join(parts)


# A number padded to three digits or more: "0008", "012" (not the "03" of a date)
PADDED = re.compile(r"(?<![\d.,:])0+(\d+)(?!\d)")


def unpadded(*names: str) -> list[str]:
    """The names holding a zero-padded number ("pep-0008", "ADR-0012 Use Postgres"), with
    the zeros dropped: they are looked up as "pep 8" and "ADR 12", and the padded and the plain
    number are different words."""
    out = []
    for name in names:
        plain = PADDED.sub(lambda m: m.group(1) if len(m.group(0)) >= 3 else m.group(0),
                           name)
        if plain != name and plain not in out:
            out.append(plain)
    return out


def chunk_doc(doc: Doc, budget: int = 256, overlap: int = 48) -> list[Chunk]:
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    section: list[_Piece] = []
    keywords = " ".join([*doc.aliases, *(t.replace("/", " ") for t in doc.tags),
                         *unpadded(doc.title, *doc.aliases)])

    def heading_path() -> str:
        names = [h for _, h in path]
        if names and doc.title and names[0].strip().lower() == doc.title.strip().lower():
            names = names[1:]  # "# Title" under a note of that title: say it once
        return " > ".join([doc.title] * bool(doc.title) + names)

    def emit(pieces: list[_Piece]) -> None:
        text = _display(doc, pieces)
        if not text or ("<!--" in text and not HTML_COMMENT.sub("", text).strip()):
            return  # (a section of nothing but an HTML comment: nothing to show or find)
        start, end = pieces[0].start, pieces[-1].end
        if doc.pages is not None:  # PDFs: pages, not lines
            start, end = doc.pages[start] - 1, doc.pages[end] - 1
        body = clean_text(text, doc.obsidian)
        if pieces[0].context:
            body = clean_text(pieces[0].context, doc.obsidian) + "\n" + body
        chunks.append(Chunk(heading_path(), start + 1, end + 1, text, body,
                            with_symbols(heading_path(), keywords, body)))

    def flush() -> None:
        nonlocal section
        cur: list[_Piece] = []
        size = 0
        for p in section:
            if cur and size + p.tokens > budget:
                emit(cur)
                last = cur[-1]
                cur, size = ([last], last.tokens) if (last.tokens <= overlap and
                                                      last.tokens + p.tokens <= budget) else ([], 0)
            cur.append(p)
            size += p.tokens
        if cur:
            emit(cur)
        section = []

    for b in doc.blocks:
        if b.kind == "comment":
            continue
        if b.kind == "page":  # a PDF's page break: a section break without a heading
            flush()
            continue
        if b.kind == "heading":
            flush()
            while path and path[-1][0] >= b.level:
                path.pop()
            path.append((b.level, clean_text(b.title, doc.obsidian)))
            continue
        pieces = _pieces(doc, b, budget)
        section += pieces
    flush()
    if not chunks and doc.pages is None and (keywords or any(
            b.kind == "heading" for b in doc.blocks)):
        # a stub (frontmatter or headings only, a link target to fill later): one chunk of
        # its lines, so that its title, aliases and tags find it
        filled = [i for i, line in enumerate(doc.lines) if line.strip()]
        if filled:
            text = "\n".join(doc.lines[:filled[-1] + 1]).strip()
            chunks.append(Chunk(heading_path(), 1, filled[-1] + 1, text, "",
                                with_symbols(heading_path(), keywords, "")))
    if not chunks and doc.pages is None and doc.title and not any(
            line.strip() for line in doc.lines):
        # an empty note (made to be filled later, or a link's target): its title alone, so
        # that a search for its name finds it (names.py), as `ls` would
        chunks.append(Chunk(heading_path(), 1, 1, "", "",
                            with_symbols(heading_path(), keywords, "")))
    return chunks
