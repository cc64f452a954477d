"""From ranked chunks to ranked notes, and how sure the answer is.

Results are notes, not fragments: a note is ranked by its best chunk, and one note's six
matching chunks take one place in the list (shown as "+5 more in this note") instead of
crowding out the other notes. Long notes (a changelog, an index page) match some words of
almost any question; their score is damped by the log of their chunk count (LENGTH_DAMPING,
tuned on the dev set and SciFact train together: docs/quality.md). Its whole text adds its own
BM25 score as one document (note_evidence).

Confidence: the share of the query's distinctive vocabulary (its content words, weighted by
IDF) that the best notes contain. A question the notes answer shares its rare words with the
answer; a near-domain question they do not answer ("sync with Google Calendar") has rare words
(calendar, google) that no top note holds. Below LOW_CONFIDENCE the reply is flagged.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field

from ragd.index import store
from ragd.search import bm25
from ragd.search.fusion import minmax
from ragd.text import (chunk_rows, content_terms, doc_freq, note_terms, sign_word, symbols,
                       word_tokens)

LENGTH_DAMPING = 0.03
LOW_CONFIDENCE = 0.25
# Below this, and with a weak best match by meaning (hybrid.WEAK_MEANING), also low-confidence
WEAK_CONFIDENCE = 0.35
CONFIDENCE_NOTES = 3  # the best notes whose words count for the confidence


@dataclass
class Note:
    file_id: int
    score: float
    chunks: list = field(default_factory=list)  # its Candidates, best first

    @property
    def best(self):
        return self.chunks[0]


def group(db: sqlite3.Connection, ranked: list, reranked: bool = False,
          overlay=None, evidence: dict | None = None) -> list[Note]:
    """Group ranked chunk Candidates by note; a note scores its best chunk's score, damped by
    its length, plus what its whole text adds (`evidence`: hybrid.note_evidence). Reranked:
    the reranker's order stands (its scores are on another scale than the fused ones after
    them), notes in the order of their first chunk."""
    if not ranked:
        return []
    info = store.chunk_files(db, [c.chunk_id for c in ranked])
    for c in ranked:  # an unsaved buffer's chunks: its note has a negative id
        if store.unsaved(c.chunk_id) and overlay is not None and (hit := overlay.chunk(c.chunk_id)):
            info[c.chunk_id] = (hit[0].note_id, len(hit[0].chunks))
    notes: dict[int, Note] = {}
    for c in ranked:
        if c.chunk_id not in info:  # deleted meanwhile
            continue
        fid, n = info[c.chunk_id]
        note = notes.get(fid)
        if note is None:
            damping = 1.0 if reranked else 1 + LENGTH_DAMPING * math.log(max(n, 1))
            extra = evidence[fid][0] if evidence and fid in evidence and not reranked else 0.0
            note = notes[fid] = Note(fid, c.score / damping + extra)
        note.chunks.append(c)
    if reranked:
        return list(notes.values())
    return sorted(notes.values(), key=lambda n: -n.score)


def after(first: list[Note], wider: list[Note]) -> list[Note]:
    """The notes of a search's first candidates, in their order and with their scores, then
    those that only more candidates found (a widened search), in its order and scored no
    higher than the last of the first. Each ranking scales its scores over its own list, so a
    longer list moves them, and the widened order would reorder the notes a smaller k showed:
    a larger k shows more notes, never another order of those."""
    have = {n.file_id for n in first}
    out = list(first)
    for n in wider:
        if n.file_id not in have:
            if first:
                n.score = min(n.score, first[-1].score)
            out.append(n)
    return out


def firsts(db: sqlite3.Connection, ranked: list, m: int, overlay=None) -> list:
    """The best chunk of each of the first m notes of a ranked chunk list."""
    seen: set[int] = set()
    out = []
    files = files_of(db, [c.chunk_id for c in ranked[:max(m * 20, 200)]], overlay)
    for c in ranked:
        fid = files.get(c.chunk_id)
        if fid is None or fid in seen:
            continue
        seen.add(fid)
        out.append(c)
        if len(out) == m:
            break
    return out


def bm25_stems(db: sqlite3.Connection, text: str) -> list[str]:
    """The index tokenizer's stems of a text."""
    doc_freq(db, '"x"')  # makes sure this connection has the stemming table
    db.execute("DELETE FROM temp.stem_q")
    db.execute("INSERT INTO temp.stem_q (x) VALUES (?)", (text,))
    return [t for (t,) in db.execute("SELECT term FROM temp.stem_v")]


def files_of(db: sqlite3.Connection, ids: list[int], overlay=None) -> dict[int, int]:
    """chunk id -> its note's file id (an unsaved buffer's chunk: its note's negative id)."""
    out: dict[int, int] = {}
    for cid in ids:
        if store.unsaved(cid) and overlay is not None and (hit := overlay.chunk(cid)):
            out[cid] = hit[0].note_id
    out.update({cid: fid for cid, (fid, _) in store.chunk_files(db, ids).items()})
    return out


def confidence(db: sqlite3.Connection, query: str, notes: list[Note],
               overlay=None, text=None) -> float | None:
    """The IDF-weighted share of the query's content words (and symbols) found in one of the
    best notes (0..1); None when the query has neither. `text`: (the tantivy index, the
    searcher of this snapshot), when it serves: its document frequencies and per-note lookups
    skip, where FTS5's walk a word's whole doclist (16 ms a query at 100k chunks, tantivy
    0.6)."""
    text, searcher = text if text is not None else (None, None)
    words = [w for w in content_terms(query) if not w.startswith('"')]
    signs = list(dict.fromkeys(symbols(query)))
    stems = ([t.split() for t in word_tokens(db, words)] + [[s] for s in signs]
             if searcher is not None else None)
    # a symbol: itself to tantivy, the word FTS5 holds it by to FTS5 (sign_word)
    words += signs if searcher is not None else [sign_word(s) for s in signs]
    if not words or not notes:
        return None if not words else 0.0
    rows = chunk_rows(db)
    weights, held = {}, {}
    for i, w in enumerate(words):
        if stems is not None:
            df = min((text.doc_freq(searcher, t) for t in stems[i]), default=0)
        else:
            df = doc_freq(db, f'"{w}"')
        weights[w] = math.log((rows + 1) / (df + 0.5)) if df else math.log(rows + 1)
        held[w] = df > 0
    total = sum(weights.values())
    # the heaviest words first: a note that misses them is given up on soonest (below)
    first: dict[str, int] = {}
    for i, w in enumerate(words):  # (a word counts once)
        first.setdefault(w, i)
    order = sorted(first.values(), key=lambda i: -weights[words[i]])
    best = 0.0
    for note in notes[:CONFIDENCE_NOTES]:
        have, left = 0.0, total
        buffered = None
        if store.unsaved(note.file_id) and overlay is not None:  # an unsaved buffer: its own words
            hit = overlay.chunk(note.best.chunk_id)
            buffered = set().union(*(c.stems for c in hit[0].chunks)) if hit else set()
        for i in order:
            if have + left <= best * total:  # this note cannot be the best one any more
                break
            w = words[i]
            left -= weights[w]
            if buffered is not None:
                found = bool(set(bm25_stems(db, w)) & buffered)
            elif not held[w]:  # no chunk holds it: none of this note's
                found = False
            elif stems is not None:
                found = bool(stems[i]) and text.in_file(searcher, stems[i], note.file_id)
            else:
                found = db.execute("SELECT 1 FROM chunks_fts WHERE chunks_fts MATCH ? AND rowid "
                                   "IN (SELECT id FROM chunks WHERE file_id = ?) LIMIT 1",
                                   (f'"{w}"', note.file_id)).fetchone() is not None
            if found:
                have += weights[w]
        best = max(best, have / total)
        if best >= 1.0:  # (no note can hold more than every word)
            break
    return round(best, 3)


NOTE_CANDIDATES = 100  # notes the note-level BM25 scores (then scaled 0..1 over them)


def note_evidence(db: sqlite3.Connection, query: str, weight: float, dfs: dict | None = None,
                  overlay=None, bufs=(), exclude=(), text=None
                  ) -> dict[int, tuple[float, float, int]]:
    """A note's words as one document: file id -> (what it adds to the note's score, its BM25
    score, its rank), for the best NOTE_CANDIDATES notes by the BM25 of their whole text; the
    score scaled 0..1 over them, times `weight`. group adds it to notes ranked by their
    chunks (a note no chunk brought gains nothing: it has no chunk to show). An editor's
    unsaved buffer (`bufs`, of the BufferStore `overlay`) is scored as its note would be, in
    place of its file (`exclude`).

    Why: a chunk is scored on its own words, so a note whose sections each hold some words of
    the question ranks below one chunk holding most of them. Callan ("Passage-level evidence in
    document retrieval", SIGIR 1994) found the best passage and the whole document together
    better than either. FTS5 scores every note holding a word it is given, so only the rarer
    words are (text.note_terms). `text`: (the tantivy index, the Searchers of this snapshot),
    when it serves and no buffer is scored: the notes' tantivy index answers (its top-k skips
    the notes that cannot enter it), else FTS5's notes_fts."""
    if text is not None and not bufs:
        index, searchers = text

        def toks(part: str) -> list[str]:  # a part's index tokens (FTS5 syntax: '"a b"')
            return word_tokens(db, [part.strip('"')])[0].split()
        parts = note_terms(db, query, dfs, lambda p: index.note_freq(searchers, toks(p)))
        scores = index.note_search(searchers, [toks(p) for p in parts],
                                   NOTE_CANDIDATES + len(exclude))
    else:
        parts = note_terms(db, query, dfs)
        scores = bm25.note_search(db, parts, NOTE_CANDIDATES + len(exclude))
    for fid in exclude:  # files an unsaved buffer stands in for: the buffer is scored instead
        scores.pop(fid, None)
    if bufs and overlay is not None:
        scores.update(overlay.note_scores(db, parts, bufs))
    scores = dict(sorted(scores.items(), key=lambda x: -x[1])[:NOTE_CANDIDATES])
    if not scores:
        return {}
    scaled = dict(zip(scores, minmax(list(scores.values()))))
    return {fid: (weight * scaled[fid], round(x, 6), rank)
            for rank, (fid, x) in enumerate(scores.items(), 1)}
