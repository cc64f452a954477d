"""BM25 over the FTS5 index.

SQLite's FTS5 ``bm25()`` is Okapi BM25 (k1 = 1.2, b = 0.75) computed inside the index, so a
query costs a posting-list walk, not a pass over the corpus; tests/test_bm25_reference.py checks
its ranking against rank_bm25 on the same tokens.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

# A query is free text: quoted "phrases" are kept as phrases, everything else becomes terms.
# Terms are OR-ed (BM25 semantics: every matching term adds to the score).
_PHRASE = re.compile(r'"([^"]+)"')
_WORD = re.compile(r"\w+", re.UNICODE)

# Weights of the FTS columns (heading, keywords, body) in bm25(): a word of the heading path or
# of the note's aliases and tags counts a little more than one in the body.
HEADING_WEIGHT = 1.5
KEYWORDS_WEIGHT = 1.5
TEXT_WEIGHT = 1.0
WEIGHTS = f"{HEADING_WEIGHT}, {KEYWORDS_WEIGHT}, {TEXT_WEIGHT}"


def query_parts(text: str) -> list[str]:
    """The quoted FTS5 phrases of a free-text query: "phrases" as given, then each distinct
    word."""
    parts: list[str] = []
    for phrase in _PHRASE.findall(text):
        words = _WORD.findall(phrase)
        if words:
            parts.append('"' + " ".join(words) + '"')
    rest = _PHRASE.sub(" ", text)
    seen: set[str] = set()
    for word in _WORD.findall(rest):
        w = word.lower()
        if w not in seen:
            seen.add(w)
            parts.append(f'"{w}"')
    return parts


def fts_query(text: str) -> str:
    """Turn free text into a safe FTS5 MATCH expression ('' when nothing is searchable)."""
    return " OR ".join(query_parts(text))


def _prepare(db: sqlite3.Connection) -> None:
    # Per connection, in its temp schema: a one-row FTS5 table with the index's tokenizer, to
    # stem query words exactly as the index did, and vocabulary views to read their counts.
    # NOTE: the tokenizer must match chunks_fts in ragd/index/store.py.
    db.executescript("""
        CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_q USING fts5(
            x, tokenize = 'porter unicode61 remove_diacritics 2');
        CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_v USING fts5vocab(temp, stem_q, row);
        CREATE VIRTUAL TABLE IF NOT EXISTS temp.chunks_v USING fts5vocab(main, chunks_fts, row);
    """)


def doc_freq(db: sqlite3.Connection, phrase: str) -> int:
    """Rows of the index containing the rarest token of the phrase (as the index tokenizes)."""
    db.execute("DELETE FROM temp.stem_q")
    db.execute("INSERT INTO temp.stem_q (x) VALUES (?)", (phrase.strip('"'),))
    counts = [db.execute("SELECT doc FROM temp.chunks_v WHERE term = ?", (t,)).fetchone()
              for (t,) in db.execute("SELECT term FROM temp.stem_v").fetchall()]
    return min((c[0] if c else 0) for c in counts) if counts else 0


def prune_common(db: sqlite3.Connection, parts: list[str]) -> list[str]:
    """Drop words found in over half the rows, unless nothing else is left.

    FTS5 clamps such a word's IDF to 1e-6, so it adds nothing to any score, yet every row
    containing it is visited and scored: dropping it leaves the ranking as it was (up to rows
    whose score was ~0) and halves the median query time on obsidian-hub.
    """
    if len(parts) < 2:
        return parts
    _prepare(db)
    rows = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    kept = [p for p in parts if doc_freq(db, p) <= rows / 2]
    return kept or parts


@dataclass
class Hit:
    chunk_id: int
    score: float  # higher is better (FTS5's bm25() negated)


def search(db: sqlite3.Connection, query: str, limit: int,
           sources: list[str] | None = None) -> list[Hit]:
    parts = query_parts(query)
    if not parts:
        return []
    match = " OR ".join(prune_common(db, parts))
    sql, params = _matching(f"chunks_fts.rowid, bm25(chunks_fts, {WEIGHTS}) AS s", match, sources)
    return [Hit(r[0], -r[1]) for r in db.execute(sql + " ORDER BY s LIMIT ?", [*params, limit])]


def _matching(columns: str, match: str, sources: list[str] | None) -> tuple[str, list]:
    """SELECT columns of the FTS rows matching, optionally only in these sources."""
    sql = f"SELECT {columns} FROM chunks_fts"
    if not sources:
        return sql + " WHERE chunks_fts MATCH ?", [match]
    sql += (" JOIN chunks c ON c.id = chunks_fts.rowid JOIN files f ON f.id = c.file_id "
            f"WHERE chunks_fts MATCH ? AND f.source IN ({','.join('?' * len(sources))})")
    return sql, [match, *sources]


def all_terms_match(db: sqlite3.Connection, query: str, sources: list[str] | None = None) -> bool:
    """Does some chunk contain every word (and phrase) of the query?"""
    parts = query_parts(query)
    if not parts:
        return False
    sql, params = _matching("chunks_fts.rowid", " AND ".join(parts), sources)
    return db.execute(sql + " LIMIT 1", params).fetchone() is not None
