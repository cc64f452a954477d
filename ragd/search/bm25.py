"""BM25 over the FTS5 index.

SQLite's FTS5 ``bm25()`` is Okapi BM25 (k1 = 1.2, b = 0.75) computed inside the index, so a
query costs a posting-list walk, not a pass over the corpus; tests/test_bm25_reference.py checks
its ranking against rank_bm25 on the same tokens.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from ragd.protocol import OPERATOR_RUN, fold
from ragd.search.filters import Filters
from ragd.text import (COMMON_SHARE, NOTE_WEIGHTS, PHRASE, WEIGHTS, content_terms,
                       fts_parts, names, prune_common, symbol_parts, symbols, word_tokens)

@dataclass
class Hit:
    chunk_id: int
    score: float  # higher is better (FTS5's bm25() negated)


def search(db: sqlite3.Connection, query: str, limit: int,
           filters: Filters | None = None, share: float = COMMON_SHARE,
           dfs: dict | None = None) -> list[Hit]:
    parts = fts_parts(query)
    if not parts:
        return []
    match = " OR ".join(prune_common(db, parts, share, dfs))
    sql, params = _matching(f"chunks_fts.rowid, bm25(chunks_fts, {WEIGHTS}) AS s", match, filters)
    return [Hit(r[0], -r[1]) for r in db.execute(sql + " ORDER BY s LIMIT ?", [*params, limit])]


def note_search(db: sqlite3.Connection, parts: list[str], limit: int) -> dict[int, float]:
    """BM25 of whole notes (notes_fts, one row per file: store.m006) for the parts note_terms
    kept: file id -> score, the best `limit`."""
    if not parts:
        return {}
    return {r[0]: -r[1] for r in db.execute(
        f"SELECT rowid, bm25(notes_fts, {NOTE_WEIGHTS}) AS s FROM notes_fts "
        "WHERE notes_fts MATCH ? ORDER BY s LIMIT ?", (" OR ".join(parts), limit))}


def _matching(columns: str, match: str, filters: Filters | None) -> tuple[str, list]:
    """SELECT columns of the FTS rows matching, only in the files the filters let through."""
    sql = f"SELECT {columns} FROM chunks_fts"
    if filters is None or not filters.active:
        return sql + " WHERE chunks_fts MATCH ?", [match]
    cond, params = filters.where("f")
    sql += (" JOIN chunks c ON c.id = chunks_fts.rowid JOIN files f ON f.id = c.file_id "
            f"WHERE chunks_fts MATCH ? AND {cond}")
    return sql, [match, *params]


def all_terms_match(db: sqlite3.Connection, query: str, filters: Filters | None = None) -> bool:
    """Does some chunk contain every word (and phrase, and symbol) of the query?"""
    parts = fts_parts(query)
    if not parts:
        return False
    sql, params = _matching("chunks_fts.rowid", " AND ".join(parts), filters)
    return db.execute(sql + " LIMIT 1", params).fetchone() is not None


def unknown_names(db: sqlite3.Connection, query: str) -> list[str]:
    """The names of the query (`names`) that no chunk of the index holds: a question about
    something no note mentions is one the notes likely do not answer. An identifier of
    several words ("pg_upgrade") is looked for as those words in a row: each may be common."""
    found = names(query)
    if not found:
        return []
    out = []
    for w, df in zip(found, held(db, found)):
        if df and "_" in w:
            df = _any(db, w)
        if not df:
            out.append(w)
    return out


def unheld_words(db: sqlite3.Connection, query: str, text=None) -> list[str]:
    """The query's content words (outside its quoted phrases) that no chunk of the index
    holds: with nothing close in meaning either, a question about something no note mentions
    ("sourdough starter" where only "starter" is in the notes). `text`: as for `held`."""
    words = [w for w in content_terms(query) if not w.startswith('"')]
    return [w for w, df in zip(words, held(db, words, text)) if not df]


def held(db: sqlite3.Connection, words: list[str], text=None) -> list[bool]:
    """Does some chunk hold each of these words (each of its tokens, in any chunk: as
    doc_freq > 0)? Asked as a match of one row, not counted: FTS5 counts a word's rows by
    walking its whole list, which for a common word in a large index outlasts the search.
    `text`: (the tantivy index, the searcher of this snapshot), when it serves: its document
    frequencies of the words' index tokens are read (it keeps one for each term), not matched."""
    index, searcher = text if text is not None else (None, None)
    if searcher is not None:
        stems = [t.split() for t in word_tokens(db, words)]
        return [bool(ts) and all(index.doc_freq(searcher, t) > 0 for t in ts) for ts in stems]
    tokens = [TOKEN.findall(w) for w in words]
    return [bool(ts) and all(_any(db, t) for t in ts) for ts in tokens]


def _any(db: sqlite3.Connection, phrase: str) -> bool:
    return db.execute("SELECT 1 FROM chunks_fts WHERE chunks_fts MATCH ? LIMIT 1",
                      ('"' + phrase.replace('"', '""') + '"',)).fetchone() is not None


def _stem(word: str) -> str:
    """A rough stem for marking matches in shown text (FTS5 matched with porter: 'repeating'
    matched 'repeat'): common suffixes cut, at least 3 letters kept."""
    w = word.lower()
    for suffix in ("ations", "ation", "ings", "ing", "edly", "ed", "ies", "es", "ly", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            return w[: -len(suffix)]
    return w


# A text's words as FTS5's unicode61 splits them: '_' parts words too, so that the lines shown
# are those FTS5 matched ("reverse_proxy" holds the phrase "reverse proxy"; "proxy" is a word
# of "proxy_pass").
TOKEN = re.compile(r"[^\W_]+")


# A query word this short is not cut by _stem and is matched whole, as the index matches it: as
# a prefix, 'y' (or 'ÿ') would mark every word starting with y
SHORT = 3


def _same(word: str, stem: str) -> bool:
    """Does a text word (stemmed) stand for a query word's stem, as FTS5's porter stems
    matched them ('reversed' for 'reverse', 'proxies' for 'proxy')?"""
    if len(stem) < SHORT:
        return word == stem
    return word.startswith(stem) or (len(word) >= 4 and stem.startswith(word))


# A link's target: the (url) of a Markdown link or image, a bare URL. Matched words in it do
# not make its line a match worth jumping to, while another line holds the match.
TARGET = re.compile(r"(?<=\])\([^)\n]*\)|<?\b[a-z][a-z0-9+.-]*://[^\s)>]*>?", re.IGNORECASE)


def _blank(m: re.Match) -> str:
    """The match's characters as spaces (its line breaks kept: the lines keep their numbers)."""
    return re.sub(r"[^\n]", " ", m.group())


class LineMatcher:
    """Which lines of a text hold a query's match (its `lines`): each quoted phrase where its
    words stand in a row (every line of one that runs across lines), a content word of the
    query, a symbol. A line holding only some words of a phrase does not match it: so a code
    block is among the lines shown only when the match is in it ("proxy_pass" is no line of
    "reverse proxy"). Made once per query and used for every result: a word is stemmed and
    compared once, however many lines and results hold it."""

    def __init__(self, query: str):
        # words compared as the index compares them: diacritics folded ('cafe' is 'café')
        self.stems = {_stem(fold(w)) for w in content_terms(query) if not w.startswith('"')}
        phrases = [[_stem(fold(w)) for w in TOKEN.findall(p)] for p in PHRASE.findall(query)]
        self.phrases = [p for p in phrases if p]
        self.signs = set(symbols(query))
        self._operators = {sign for sign in self.signs if len(sign) > 1}
        self._word: dict[str, bool] = {}  # a text word -> it stands for a content word
        # _same against every stem at once: a stem the word starts with (str.startswith of
        # a tuple), or a word of 4 letters or more that a stem starts with (its prefixes); a
        # short stem only as the word itself
        self._starts = tuple(s for s in self.stems if len(s) >= SHORT)
        self._whole = {s for s in self.stems if len(s) < SHORT}
        self._prefixes = {s[:i] for s in self.stems for i in range(4, len(s) + 1)}
        # A word that matches starts with the first 4 letters of a stem (it starts with the
        # stem, or is a prefix of it of 4 letters or more): only those are looked at
        self._heads = tuple({s[:4] for s in self.stems})

    def _matches(self, word: str) -> bool:
        hit = self._word.get(word)
        if hit is None:
            stem = _stem(word)
            hit = self._word[word] = stem in self._whole or bool(self._starts) and (
                stem.startswith(self._starts) or stem in self._prefixes)
        return hit

    def lines(self, text: str, line_start: int) -> list[int]:
        """The (1-based, counted from line_start) lines of text that hold the match: those
        that hold it outside a link's target when there are any (an image's file name
        "new-member-onboarding-2023.webp" is no place to jump to for "onboarding"), else
        those that hold it at all."""
        if not self.stems and not self.signs and not self.phrases:
            return []
        if "://" in text or "](" in text:
            found = self._lines(TARGET.sub(_blank, text), line_start)
            if found:
                return found
        return self._lines(text, line_start)

    def _lines(self, text: str, line_start: int) -> list[int]:
        out: set[int] = set()
        if self.phrases:
            lines = text.split("\n")
            words = [(i, _stem(fold(w))) for i, line in enumerate(lines)
                     for w in TOKEN.findall(line)]
            for p in self.phrases:
                for at in range(len(words) - len(p) + 1):
                    if all(_same(words[at + j][1], s) for j, s in enumerate(p)):
                        out.update(range(words[at][0], words[at + len(p) - 1][0] + 1))
        if self._heads:
            # each place a head stands at the start of a word (lowercased, as stems are): the
            # word there as TOKEN finds it, and its line if it matches
            low = fold(text.lower())
            for head in self._heads:
                at = low.find(head)
                while at >= 0:
                    if at == 0 or not low[at - 1].isalnum():
                        word = TOKEN.match(low, at)
                        if word is not None and self._matches(word.group()):
                            out.add(low.count("\n", 0, at))
                    at = low.find(head, at + 1)
        for ch in self.signs:
            if len(ch) > 1:  # an operator: a whole run of signs ('->' is not in '-->')
                continue
            at = text.find(ch)
            while at >= 0:
                out.add(text.count("\n", 0, at))
                at = text.find(ch, at + len(ch))
        if self._operators:
            for m in OPERATOR_RUN.finditer(text):
                if m.group() in self._operators:
                    out.add(text.count("\n", 0, m.start()))
        return [line_start + i for i in sorted(out)]


def matching_lines(text: str, line_start: int, query: str) -> list[int]:
    """LineMatcher(query).lines(text, line_start), for one text."""
    return LineMatcher(query).lines(text, line_start)


def content_match(db: sqlite3.Connection, query: str, filters: Filters | None = None) -> bool:
    """Does some chunk contain a content word (or a phrase, or a symbol) of the query?"""
    parts = [w if w.startswith('"') else f'"{w}"' for w in content_terms(query)] + \
        symbol_parts(query)
    if not parts:
        return False
    sql, params = _matching("chunks_fts.rowid", " OR ".join(parts), filters)
    return db.execute(sql + " LIMIT 1", params).fetchone() is not None
