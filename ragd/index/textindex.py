"""The BM25 index: a tantivy index of the chunks' words, which serves the keyword ranking of
hybrid and BM25 search (``[search] bm25_index = "tantivy"``, the default).

Why a second full-text index beside FTS5: FTS5's ``bm25()`` scores every row a query word
matches, so a natural question ("how do I ...") costs a walk of most of the index, growing
with it. tantivy's top-k skips what cannot enter the top (block-max WAND), so its cost stays
near flat (docs/scaling.md). One field, one BM25 (k1 1.2, b 0.75) over the chunk's heading, aliases and
tags (twice: see search_text) and body.

The words are FTS5's own: ``index_tokens`` gives each text as the porter tokenizer of
chunks_fts sees it (stems, diacritics folded), tantivy only splits them on whitespace, and a
query is tokenized the same way — so a word matches here exactly when it matches in FTS5. One
addition: the symbols FTS5's tokenizer drops (emoji, dingbats: ``symbols``), each a
token of its own, so that a search for ⛔ finds the task lines holding it, as grep would. (FTS5
finds them by the words a chunk's keywords end with: ``with_symbols``.)

SQLite stays the record, FTS5 included: it serves the keyword ranking while this index is being
filled (the first start, or after its folder was lost) or is behind the search's snapshot (see
below), for searches over unsaved editor buffers (their scores are on FTS5's scale), and for
the literal and content-word checks. Filters are applied in tantivy, as a set of file ids.

Keeping it in step — a transactional outbox, as the Milvus store does. Triggers on ``chunks``
write the ids of chunks inserted, updated or deleted to ``text_outbox`` inside the writer's own
transaction. One supervised thread (``text-sync``), woken after each of the indexer's commits,
reads a batch, deletes those ids from tantivy, adds the ones that still exist, commits, and
publishes the new searcher under the next generation number; then, in one SQLite transaction,
removes the batch's rows (not those marked again meanwhile) and records that generation. A
crash between the tantivy commit and that transaction redoes the batch: delete-then-add by id
is idempotent.

Never stale, never ahead: a search reads one SQLite snapshot, and it reads tantivy only when
that snapshot's outbox is empty, through the searcher published under the snapshot's recorded
generation (the last few are kept) — whose content is then exactly the snapshot's chunks. A
commit not yet pushed (the few hundred ms after an edit, a move, or all through a bulk
indexing) is answered by FTS5, which is always in the snapshot; the reply's ``bm25_index``
says which answered.

The notes' index beside it (``bm25-notes``): each note's notes_fts row (title, aliases and tags,
headings, its whole text) as one document, for the note-level BM25 of hybrid search
(search/notes.py), which FTS5 answers only by scoring every note a query word is in. Its
documents go through the same outbox, by the note's file id negated (a trigger on notes_dirty,
where the chunks' triggers mark a note whose chunks changed), and both indexes are published
under one generation: a snapshot's notes are as current as its chunks.

The folder's identity (a random name in a file beside the index) is recorded in SQLite's meta
when a fill begins and marked complete when the fill ends; a folder that is missing,
unreadable, of another format or not the one recorded is rebuilt from SQLite, and a fill a
crash interrupted starts over.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import uuid
from pathlib import Path

from ragd.index import outbox, store
from ragd.text import (COMMON_SHARE, index_tokens, note_keywords, query_parts, symbols,
                       word_tokens)

log = logging.getLogger("ragd.textindex")

BATCH = 2048  # chunks per commit while in sync (an edit's chunks are far fewer)
FILL_BATCH = 32768  # chunks per commit while filling: each commit writes a segment to merge
HEAP_BYTES = 64_000_000
KEEP_SEARCHERS = 4  # generations kept for searches whose snapshot is a commit or two behind
IDLE_CHECK = 60.0  # seconds between looks at the outbox when no commit woke the thread
# tantivy's BM25 counts a deleted document — each chunk an edit, a move or a delete replaced —
# in its statistics (the number of documents, each word's document frequency, the average
# length) until a merge drops it, and its merges seldom take the large segment a fill wrote.
# The ranking drifts as they pile up, and a word no chunk holds any more still counts. Once the documents deleted since the fill reach this
# share of those there (and REFILL_MIN), the index is filled anew (FTS5 answers meanwhile).
REFILL_SHARE = 0.2
REFILL_MIN = 200

TRIGGERS = """
    CREATE TABLE IF NOT EXISTS text_outbox (chunk_id INTEGER NOT NULL UNIQUE);
    CREATE TRIGGER IF NOT EXISTS text_chunks_ai AFTER INSERT ON chunks BEGIN
        INSERT OR REPLACE INTO text_outbox (chunk_id) VALUES (new.id);
    END;
    CREATE TRIGGER IF NOT EXISTS text_chunks_au AFTER UPDATE OF heading, keywords, body
    ON chunks BEGIN
        INSERT OR REPLACE INTO text_outbox (chunk_id) VALUES (new.id);
    END;
    CREATE TRIGGER IF NOT EXISTS text_chunks_ad AFTER DELETE ON chunks BEGIN
        INSERT OR REPLACE INTO text_outbox (chunk_id) VALUES (old.id);
    END;
    CREATE TRIGGER IF NOT EXISTS text_notes_dirty AFTER INSERT ON notes_dirty BEGIN
        INSERT OR REPLACE INTO text_outbox (chunk_id) VALUES (-new.file_id);
    END;
"""
UNINSTALL = """
    DROP TRIGGER IF EXISTS text_chunks_ai;
    DROP TRIGGER IF EXISTS text_chunks_au;
    DROP TRIGGER IF EXISTS text_chunks_ad;
    DROP TRIGGER IF EXISTS text_notes_dirty;
    DROP TABLE IF EXISTS text_outbox;
    DELETE FROM meta WHERE key IN ('text_index', 'text_synced', 'text_deleted');
"""


def install(db: sqlite3.Connection) -> None:
    """The outbox and its triggers (idempotent)."""
    outbox.apply(db, TRIGGERS)


def uninstall(db: sqlite3.Connection) -> None:
    """No tantivy index (bm25_index = "fts5", or the Milvus store): SQLite pays nothing for it,
    and a later install refills the folder from scratch."""
    outbox.apply(db, UNINSTALL)


# The text a chunk is indexed as: its heading path and its note's aliases and tags twice, then
# its body. FTS5 weighs a word of the heading or keywords columns 1.5 times one of the body;
# tantivy has no such weights in one field, and a field each, their scores summed, ranked worse;
# twice ranked best of the ways tried (docs/quality.md).
FORMAT = "4"  # of the indexed text and schema: another format rebuilds the folder
# (1 -> 2: symbol tokens; 2 -> 3: the notes' index beside it; 3 -> 4: the notes' without
# positions)


def search_text(heading: str, keywords: str, body: str) -> str:
    return "\n".join(p for p in (heading, keywords, heading, keywords, body) if p)


def indexed_texts(db: sqlite3.Connection, rows) -> list[str]:
    """What the index holds of each chunk row (id, file_id, heading, keywords, body): FTS5's
    tokens, then its symbols — themselves, not the words FTS5 holds them by at the end of
    the keywords (with_symbols: here they would only lengthen the chunk)."""
    texts = [search_text(r[2], note_keywords(r[2], r[3], r[4]), r[4]) for r in rows]
    return [" ".join([tokens, *signs]) if (signs := symbols(text)) else tokens
            for tokens, text in zip(index_tokens(db, texts), texts)]


def note_text(title: str, keywords: str, headings: str, body: str) -> str:
    """The text a note is indexed as (its notes_fts row): its title, aliases and tags,
    headings and whole body, each once. FTS5 weighs the first three 1.5 times the body
    (NOTE_COLUMN_WEIGHTS); here, in one field, repeating them (as the chunks' heading and
    keywords are) ranked no better (docs/quality.md). The symbols are the words notes_fts holds
    them by (note_row): the note-level query's parts are FTS5's."""
    return "\n".join(p for p in (title, keywords, headings, body) if p)


def _schema(note: bool = False):
    """The chunks' schema, or the notes' (`note`: their id is the file id)."""
    import tantivy
    sb = tantivy.SchemaBuilder()
    sb.add_integer_field("id", stored=False, indexed=True, fast=True)
    if not note:
        sb.add_integer_field("file_id", stored=False, indexed=True, fast=False)
    # The notes' index keeps no positions: a phrase of the query is asked of a note as its
    # words (note_search). Positions would double its size, and the pages of them a search
    # reads count in the daemon's memory.
    sb.add_text_field("text", stored=False, tokenizer_name="whitespace",
                      index_option="freq" if note else "position")
    return sb.build()


class Searchers:
    """One generation's searchers, published together: the chunks' and the notes'."""
    __slots__ = ("chunks", "notes")

    def __init__(self, chunks, notes):
        self.chunks, self.notes = chunks, notes


NOTE_PUSH = 256  # notes read and tokenized at a time (a note's row holds its whole text)


class TextIndex(outbox.OutboxSync):
    """The tantivy indexes (their folders, their sync thread) and the BM25 rankings read from
    them: the chunks' and, beside it, the notes' (each note's notes_fts row as one document,
    for the note-level BM25: search/notes.py). Their ids share one outbox: a note's is its
    file id, negated; both are committed, then published as one generation."""

    def __init__(self, db_path: Path, data_dir: Path):
        super().__init__("text-sync", backoff_max=60.0, db_path=db_path)
        self.dir = data_dir / "bm25"
        self.notes_dir = data_dir / "bm25-notes"
        self.index = None
        self.notes_index = None
        self.notes_schema = None
        self.notes_pushed = 0
        self.schema = None
        self.ident: str | None = None
        # generation -> searcher, the last few published (replaced in one assignment)
        self._published: dict[int, object] = {}
        self._gen = 0
        self._filled_here = False  # a fill begun by this run (not one a crash interrupted)
        self.serving = False  # filled: search may read it (when in step with its snapshot)
        self._writer = None
        self._notes_writer = None

    # -- life ---------------------------------------------------------------------------------

    def stop(self) -> None:
        super().stop()
        # (dropping the writers releases tantivy's locks)
        self._writer = self._notes_writer = None

    def status(self) -> dict:
        out = {"engine": "tantivy", "path": str(self.dir), "notes_path": str(self.notes_dir),
               "state": self.state,
               "serving": self.serving, "pending": self._pending, "pushed": self.pushed,
               "notes_pushed": self.notes_pushed}
        if self.error:
            out["error"] = self.error
        return out

    # -- the sync thread ----------------------------------------------------------------------

    def _open(self, db: sqlite3.Connection) -> None:
        """Open the folders, or make new ones (a new identity: the next step fills them). The
        identity is the chunks' folder's; the notes' folder goes with it (one of them lost or
        unreadable: both are made anew)."""
        import tantivy
        self.schema, self.notes_schema = _schema(), _schema(note=True)
        ident_file = self.dir / "ragd-ident"
        bad = self.dir  # (the folder being looked at, for the log)
        try:
            ident = ident_file.read_text().strip()
            if not ident.startswith(f"{FORMAT}:"):
                raise ValueError(f"format {ident.split(':')[0]!r}, not {FORMAT!r}")
            index = tantivy.Index(self.schema, path=str(self.dir), reuse=True)
            bad = self.notes_dir
            if not (self.notes_dir / "meta.json").exists():
                raise ValueError("missing")
            notes = tantivy.Index(self.notes_schema, path=str(self.notes_dir), reuse=True)
        except (OSError, ValueError) as e:
            if self.dir.exists():
                log.warning("text index: %s is unreadable or of another format (%s); "
                            "rebuilding %s and %s from the index", bad, e, self.dir,
                            self.notes_dir)
            for d in (self.dir, self.notes_dir):
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True, exist_ok=True)
            index = tantivy.Index(self.schema, path=str(self.dir), reuse=False)
            notes = tantivy.Index(self.notes_schema, path=str(self.notes_dir), reuse=False)
            ident = f"{FORMAT}:{uuid.uuid4().hex}"
            tmp = ident_file.with_suffix(".tmp")
            tmp.write_text(ident)
            tmp.replace(ident_file)
        self.index, self.notes_index, self.ident = index, notes, ident
        self._writer = index.writer(HEAP_BYTES, 1)
        self._notes_writer = notes.writer(HEAP_BYTES, 1)
        index.reload()
        notes.reload()
        row = db.execute("SELECT value FROM meta WHERE key = 'text_synced'").fetchone()
        self._gen = int(row[0]) if row else 0
        self._publish(self._gen)

    def _publish(self, gen: int) -> None:
        searcher = Searchers(self.index.searcher(), self.notes_index.searcher())
        kept = {g: s for g, s in self._published.items() if g > gen - KEEP_SEARCHERS}
        kept[gen] = searcher
        self._published = kept

    def _ready(self, db: sqlite3.Connection) -> None:
        if self._writer is None:
            self.state = "opening"
            self._open(db)

    def _drop(self) -> None:
        writers = (self._writer, self._notes_writer)
        self._writer = self._notes_writer = None
        for writer in writers:
            if writer is not None:
                try:
                    writer.rollback()
                except Exception:  # the writer may be what failed
                    pass

    def _step(self, db: sqlite3.Connection) -> None:
        seen = self._begin_step()  # what an empty outbox below proves synced
        row = db.execute("SELECT value FROM meta WHERE key = 'text_index'").fetchone()
        recorded = row[0] if row else None
        if recorded != self.ident and not (recorded == f"{self.ident} filling"
                                           and self._filled_here):
            self._begin_fill(db)
            recorded = f"{self.ident} filling"
        filling = recorded.endswith("filling")
        batch = db.execute("SELECT rowid, chunk_id FROM text_outbox ORDER BY rowid LIMIT ?",
                           (FILL_BATCH if filling else BATCH,)).fetchall()
        if batch:
            self.state = "filling" if filling else "syncing"
            self._push(db, batch, counted=not filling)
            self._set_pending(self._left(db))
            return
        if filling:
            with store.transaction(db, self._stop):
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('text_index', ?)",
                           (self.ident,))
            log.info("text index: %s has every chunk and %s every note (%d chunks and %d "
                     "notes pushed since ragd started)", self.dir, self.notes_dir, self.pushed,
                     self.notes_pushed)
        deleted = int(db.execute("SELECT COALESCE((SELECT value FROM meta WHERE key = "
                                 "'text_deleted'), 0)").fetchone()[0])
        live = self.index.searcher().num_docs + self.notes_index.searcher().num_docs
        if deleted >= max(REFILL_MIN, REFILL_SHARE * live):
            log.info("text index: %d documents deleted since it was filled still count in its "
                     "statistics (%d there); filling it anew", deleted, live)
            self._begin_fill(db)
            return
        self.serving = True
        self.state = "in sync"
        self._set_pending(0, seen)
        self._sleep(IDLE_CHECK)

    def _begin_fill(self, db: sqlite3.Connection) -> None:
        """Mark every chunk and note for the folders' indexes, then empty them; search reads
        FTS5 meanwhile (the meta says filling first: a crash in between starts the fill
        over)."""
        self.serving = False
        with store.transaction(db, self._stop):
            db.execute("INSERT OR REPLACE INTO text_outbox (chunk_id) SELECT id FROM chunks")
            db.execute("INSERT OR REPLACE INTO text_outbox (chunk_id) SELECT -id FROM files")
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('text_index', ?)",
                       (f"{self.ident} filling",))
            db.execute("DELETE FROM meta WHERE key = 'text_deleted'")
        for w in (self._writer, self._notes_writer):
            w.delete_all_documents()
            w.commit()
        self._filled_here = True
        # (what is left to push, counted before status says "filling": not the 1 that stands
        # for "not looked yet" through the whole first batch)
        self._set_pending(self._left(db))
        self.state = "filling"
        log.info("text index: filling %s and %s", self.dir, self.notes_dir)

    @staticmethod
    def _left(db: sqlite3.Connection) -> int:
        """The outbox's rows, counted up to BATCH * 4 (status says "8192+")."""
        return db.execute("SELECT COUNT(*) FROM (SELECT 1 FROM text_outbox LIMIT ?)",
                          (BATCH * 4,)).fetchone()[0]

    def _push(self, db: sqlite3.Connection, batch, counted: bool = True) -> None:
        """Delete the batch's ids, add those that exist (a chunk, or a note: a negative id),
        commit once each index; then unmark the batch. `counted`: the deleted documents count
        towards a new fill (not while filling: an id gone meanwhile was never added)."""
        gone = 0
        chunks = notes = 0
        for i in range(0, len(batch), BATCH):
            if self._stop.is_set():
                # ragd is stopping: what this batch added is dropped, and its outbox rows
                # stay, so the next start pushes it again (a fill: starts it over)
                self._writer.rollback()
                self._notes_writer.rollback()
                log.info("text index: stopping; %d chunks of this batch are pushed at the next "
                         "start", len(batch))
                return
            ids = [cid for _, cid in batch[i:i + BATCH]]
            chunk_ids = [c for c in ids if c > 0]
            gone += self._push_chunks(db, chunk_ids, counted)
            note_ids = [-c for c in ids if c < 0]
            for j in range(0, len(note_ids), NOTE_PUSH):
                gone += self._push_notes(db, note_ids[j:j + NOTE_PUSH], counted)
            chunks += len(chunk_ids)
            notes += len(note_ids)
        for n, writer, index in ((chunks, self._writer, self.index),
                                 (notes, self._notes_writer, self.notes_index)):
            if n:
                writer.commit()
                index.reload()
        self._gen += 1  # never reused: a failed transaction below leaves a gap
        gen = self._gen
        self._publish(gen)
        with store.transaction(db, self._stop):
            for i in range(0, len(batch), BATCH):
                rowids = [r for r, _ in batch[i:i + BATCH]]
                db.execute(f"DELETE FROM text_outbox WHERE rowid IN "
                           f"({','.join('?' * len(rowids))})", rowids)
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('text_synced', ?)",
                       (str(gen),))
            if gone and counted:
                db.execute("INSERT INTO meta (key, value) VALUES ('text_deleted', ?) ON CONFLICT "
                           "(key) DO UPDATE SET value = CAST(value AS INTEGER) + excluded.value",
                           (gone,))
        self.pushed += chunks
        self.notes_pushed += notes

    def _push_chunks(self, db: sqlite3.Connection, ids: list[int], counted: bool) -> int:
        """Replace these chunks' documents by their rows' (none: deleted); returns how many
        documents this leaves deleted (see REFILL_SHARE): those of chunks no longer there, and
        those of chunks updated in place (a moved note's new heading), which the index held."""
        import tantivy
        if not ids:
            return 0
        rows = db.execute(
            f"SELECT id, file_id, heading, keywords, body FROM chunks "
            f"WHERE id IN ({','.join('?' * len(ids))})", ids).fetchall()
        return self._replace(self._writer, self.index, self.schema, ids, rows, counted, [
            tantivy.Document(id=cid, file_id=fid, text=text)
            for (cid, fid, *_), text in zip(rows, indexed_texts(db, rows))])

    def _push_notes(self, db: sqlite3.Connection, ids: list[int], counted: bool) -> int:
        """As _push_chunks, for notes (these file ids): their notes_fts rows."""
        import tantivy
        if not ids:
            return 0
        rows = db.execute(
            f"SELECT rowid, title, keywords, headings, body FROM notes_fts "
            f"WHERE rowid IN ({','.join('?' * len(ids))})", ids).fetchall()
        texts = index_tokens(db, [note_text(*r[1:]) for r in rows])
        return self._replace(self._notes_writer, self.notes_index, self.notes_schema, ids,
                             rows, counted, [tantivy.Document(id=r[0], text=text)
                                             for r, text in zip(rows, texts)])

    @staticmethod
    def _replace(writer, index, schema, ids: list[int], rows, counted: bool, docs) -> int:
        """Delete the documents of `ids` and add `docs` (those of `rows`, the ids still
        there); returns how many documents that leaves deleted."""
        import tantivy
        gone = len(ids) - len(rows)
        if counted and rows:
            gone += index.searcher().search(tantivy.Query.term_set_query(
                schema, "id", [r[0] for r in rows]), 1, count=True).count
        for i in ids:
            writer.delete_documents_by_term("id", i)
        for doc in docs:
            writer.add_document(doc)
        return gone

    # -- search -------------------------------------------------------------------------------

    def view(self, db: sqlite3.Connection):
        """(the Searchers whose content is exactly the chunks and notes of db's snapshot,
        "tantivy"), or (None, why FTS5 answers instead)."""
        if not self.serving:
            return None, f"fts5 (the tantivy index is {self.state})"
        recorded, gen, behind = db.execute(
            "SELECT (SELECT value FROM meta WHERE key = 'text_index'), "
            "(SELECT value FROM meta WHERE key = 'text_synced'), "
            "EXISTS (SELECT 1 FROM text_outbox)").fetchone()
        if recorded != self.ident:
            return None, "fts5 (the tantivy index is being filled)"
        searcher = self._published.get(int(gen or 0))
        if behind or searcher is None:
            return None, "fts5 (the tantivy index is catching up with the last commit)"
        return searcher, "tantivy"

    @staticmethod
    def doc_freq(searcher: Searchers, token: str) -> int:
        """Chunks holding an index token (a stem, as index_tokens gives it)."""
        return searcher.chunks.doc_freq("text", token)

    @staticmethod
    def note_freq(searcher: Searchers, tokens: list[str]) -> int:
        """Notes holding a word (its index tokens: the rarest one's count)."""
        return min((searcher.notes.doc_freq("text", t) for t in tokens), default=0)

    def note_search(self, searcher: Searchers, parts: list[list[str]], limit: int
                    ) -> dict[int, float]:
        """BM25 of whole notes for these query parts (each its index tokens: one word, or a
        phrase), as bm25.note_search of notes_fts: file id -> score, the best `limit`. A
        phrase is its words, all in the note (the notes' index keeps no positions)."""
        import tantivy

        def part(toks):
            terms = [tantivy.Query.term_query(self.notes_schema, "text", t) for t in toks]
            return terms[0] if len(terms) == 1 else tantivy.Query.boolean_query(
                [(tantivy.Occur.Must, t) for t in terms])
        clauses = [(tantivy.Occur.Should, part(toks)) for toks in parts if toks]
        if not clauses:
            return {}
        s = searcher.notes
        hits = s.search(tantivy.Query.boolean_query(clauses), limit, count=False).hits
        ids = s.fast_field_values("id", [a for _, a in hits])
        return {int(fid): float(score) for (score, _), fid in zip(hits, ids)
                if fid is not None}

    def _only_in(self, query, files):
        """The query, only over the chunks of these file ids (None: every chunk); the file
        clause adds nothing to the scores."""
        import tantivy
        if files is None:
            return query
        return tantivy.Query.boolean_query([
            (tantivy.Occur.Must, query),
            (tantivy.Occur.Must, tantivy.Query.const_score_query(
                tantivy.Query.term_set_query(self.schema, "file_id", [int(f) for f in files]),
                0.0))])

    def holds_any(self, searcher, tokens: list[str], files=None) -> bool:
        """Does a chunk (of these file ids, when given) hold one of these tokens?"""
        import tantivy
        q = self._only_in(tantivy.Query.boolean_query([
            (tantivy.Occur.Should, tantivy.Query.term_query(self.schema, "text", t))
            for t in tokens]), files)
        return bool(searcher.chunks.search(q, 1, count=False).hits)

    def holds_all(self, searcher, terms: list, files=None) -> bool:
        """Does a chunk (of these file ids, when given) hold every part of `terms` (as `terms`
        gives them: words, phrases, symbols)?"""
        import tantivy
        if not terms or any(df == 0 for _, _, df in terms):
            return False
        q = self._only_in(tantivy.Query.boolean_query([
            (tantivy.Occur.Must, self._part(toks)) for _, toks, _ in terms]), files)
        return bool(searcher.chunks.search(q, 1, count=False).hits)

    def _part(self, tokens: list[str]):
        """The query of one part of a query: a token, or a phrase of several."""
        import tantivy
        return (tantivy.Query.term_query(self.schema, "text", tokens[0]) if len(tokens) == 1
                else tantivy.Query.phrase_query(self.schema, "text", tokens))

    def in_file(self, searcher, tokens: list[str], file_id: int) -> bool:
        """Does a chunk of the file hold these tokens (one token, or a phrase)?"""
        import tantivy
        q = tantivy.Query.boolean_query([
            (tantivy.Occur.Must, self._part(tokens)),
            (tantivy.Occur.Must, tantivy.Query.term_query(self.schema, "file_id", file_id))])
        return bool(searcher.chunks.search(q, 1, count=False).hits)

    @staticmethod
    def terms(searcher, db: sqlite3.Connection, query: str,
              dfs: dict | None = None) -> list[tuple[str, list[str], int]]:
        """The query's parts and symbols as the index holds them: (part, its tokens, the
        chunks holding it: its rarest token's count), for `search`. `dfs`, when given, gets
        each part's count, as doc_freqs gives it (read from the searcher: nothing walked)."""
        parts = query_parts(query)
        signs = list(dict.fromkeys(symbols(query)))
        if not (parts or signs) or searcher is None:
            return []
        words = word_tokens(db, [p.strip('"') for p in parts]) + signs
        out = []
        for part, toks in zip(parts + signs, words):
            toks = toks.split()
            if not toks:
                continue
            df = min(searcher.chunks.doc_freq("text", t) for t in toks)
            if dfs is not None:
                dfs[part] = df
            out.append((part, toks, df))
        return out

    def search(self, searcher, db: sqlite3.Connection, query: str, n: int,
               share: float = COMMON_SHARE, files=None, dfs: dict | None = None,
               terms: list | None = None) -> list[tuple[int, float]]:
        """The top n chunks by BM25 (higher is better) for a free-text query, read from a
        searcher `view` gave; its words dropped as prune_common drops them (found in over
        `share` of the chunks); `files`: only chunks of these file ids. `dfs`, when given, gets
        each query part's chunk count (as doc_freqs gives it); `terms`: what `terms` gave for
        this query and searcher, when it was asked already."""
        import tantivy
        if searcher is None:
            return []
        if terms is None:
            terms = self.terms(searcher, db, query, dfs)
        s = searcher.chunks
        total = max(s.num_docs, 1)
        clauses, kept = [], []
        for _, toks, df in terms:
            common = df > total * share
            q = self._part(toks)
            clauses.append(q)
            if not common:
                kept.append(q)
        if not clauses:
            return []
        kept = kept or clauses  # only common words: keep them all (as prune_common does)
        query_ = self._only_in(
            tantivy.Query.boolean_query([(tantivy.Occur.Should, q) for q in kept]), files)
        hits = s.search(query_, n, count=False).hits
        if not hits:
            return []
        ids = s.fast_field_values("id", [a for _, a in hits])
        return [(int(cid), float(s)) for (s, _), cid in zip(hits, ids) if cid is not None]
