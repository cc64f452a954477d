"""The SQLite index: files, chunks and the FTS5 index over chunk text.

One database per data dir, in WAL mode: one writer (the indexer thread) and any number of
readers (search requests, each on its own connection) work at once without blocking each other.

Schema changes are migrations: functions named ``mNNN_what`` appended to :data:`MIGRATIONS`,
applied in order, each in one transaction with the ``PRAGMA user_version`` bump that records it.
Never edit a migration that has shipped; add a new one.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ragd.text import note_keywords, symbol_words, with_symbols

log = logging.getLogger("ragd.store")

MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []
migration = MIGRATIONS.append


class StoreError(Exception):
    """The index database cannot be used (newer schema, corrupt file)."""


def run_script(db: sqlite3.Connection, sql: str) -> None:
    """Run a multi-statement script inside the caller's transaction (executescript would
    commit it first)."""
    stmt = ""
    for line in sql.splitlines(keepends=True):
        stmt += line
        if sqlite3.complete_statement(stmt):
            db.execute(stmt)
            stmt = ""
    if stmt.strip():
        raise StoreError(f"incomplete SQL statement in a migration: {stmt.strip()[:60]}")


@migration
def m001_initial(db: sqlite3.Connection) -> None:
    run_script(db, """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

        -- One row per file ragd has seen, whatever became of it.
        -- status: 'indexed' | 'skipped' (not indexable, reason says why) | 'failed' (an error).
        CREATE TABLE files (
            id          INTEGER PRIMARY KEY,
            source      TEXT NOT NULL,
            relpath     TEXT NOT NULL,
            size        INTEGER NOT NULL,
            mtime_ns    INTEGER NOT NULL,
            hash        TEXT,
            status      TEXT NOT NULL,
            reason      TEXT,
            indexed_at  REAL NOT NULL,
            UNIQUE (source, relpath)
        );

        -- line_start/line_end: 1-based, inclusive, in the file as it was when indexed.
        CREATE TABLE chunks (
            id          INTEGER PRIMARY KEY,
            file_id     INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
            ordinal     INTEGER NOT NULL,
            heading     TEXT NOT NULL DEFAULT '',
            line_start  INTEGER NOT NULL,
            line_end    INTEGER NOT NULL,
            text        TEXT NOT NULL,
            text_hash   TEXT NOT NULL
        );
        CREATE INDEX chunks_file ON chunks (file_id, ordinal);
        CREATE INDEX chunks_text_hash ON chunks (text_hash);

        CREATE VIRTUAL TABLE chunks_fts USING fts5 (
            heading, text,
            content = 'chunks', content_rowid = 'id',
            tokenize = 'porter unicode61 remove_diacritics 2'
        );
        -- External-content FTS: these triggers are the only thing keeping it in step.
        CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
            INSERT INTO chunks_fts (rowid, heading, text) VALUES (new.id, new.heading, new.text);
        END;
        CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
            INSERT INTO chunks_fts (chunks_fts, rowid, heading, text)
                VALUES ('delete', old.id, old.heading, old.text);
        END;
        CREATE TRIGGER chunks_au AFTER UPDATE ON chunks BEGIN
            INSERT INTO chunks_fts (chunks_fts, rowid, heading, text)
                VALUES ('delete', old.id, old.heading, old.text);
            INSERT INTO chunks_fts (rowid, heading, text) VALUES (new.id, new.heading, new.text);
        END;
    """)


@migration
def m002_embeddings(db: sqlite3.Connection) -> None:
    run_script(db, """
        -- A vector space: one embedding model as configured (file hash + pooling + prefixes)
        -- and the vector it gave for a fixed probe sentence when the space was created.
        CREATE TABLE spaces (
            id          INTEGER PRIMARY KEY,
            fingerprint TEXT NOT NULL,
            model       TEXT NOT NULL,
            dims        INTEGER NOT NULL,
            probe       BLOB NOT NULL,
            created_at  REAL NOT NULL,
            last_used   REAL NOT NULL
        );
        CREATE INDEX spaces_fingerprint ON spaces (fingerprint);

        -- The embedding cache, content-addressed: the vector of one input text in one space.
        -- text_hash is chunks.embed_hash; the same text anywhere is embedded once per space.
        CREATE TABLE embeddings (
            space       INTEGER NOT NULL REFERENCES spaces(id),
            text_hash   TEXT NOT NULL,
            vector      BLOB NOT NULL,
            tokens      INTEGER NOT NULL,
            truncated   INTEGER NOT NULL DEFAULT 0,
            created_at  REAL NOT NULL,
            PRIMARY KEY (space, text_hash)
        ) WITHOUT ROWID;

        -- Inputs the engine refused: not retried until the text or the space changes.
        CREATE TABLE embed_failures (
            space       INTEGER NOT NULL,
            text_hash   TEXT NOT NULL,
            reason      TEXT NOT NULL,
            attempts    INTEGER NOT NULL,
            last_try    REAL NOT NULL,
            PRIMARY KEY (space, text_hash)
        ) WITHOUT ROWID;

        ALTER TABLE chunks ADD COLUMN embed_hash TEXT NOT NULL DEFAULT '';
    """)
    # Assume the text to embed of existing chunks is their heading and text, as chunker.embed_text
    # builds it for new ones.
    from ragd.ingest.chunker import embed_text, text_hash
    rows = db.execute("SELECT id, heading, text FROM chunks").fetchall()
    db.executemany("UPDATE chunks SET embed_hash = ? WHERE id = ?",
                   [(text_hash(embed_text(r[1], r[2])), r[0]) for r in rows])
    db.execute("CREATE INDEX chunks_embed_hash ON chunks (embed_hash)")


@migration
def m003_search_text_and_note_metadata(db: sqlite3.Connection) -> None:
    """Chunks get the text that is searched (body: Obsidian syntax made readable) beside the
    text shown (text), and the note's searchable words (keywords: aliases, tags); files get
    their metadata (title, aliases, tags, links, embeds, block ids, warnings) as JSON."""
    run_script(db, """
        ALTER TABLE chunks ADD COLUMN body TEXT NOT NULL DEFAULT '';
        ALTER TABLE chunks ADD COLUMN keywords TEXT NOT NULL DEFAULT '';
        ALTER TABLE files ADD COLUMN meta TEXT;
        UPDATE chunks SET body = text;
        DROP TRIGGER chunks_ai;
        DROP TRIGGER chunks_ad;
        DROP TRIGGER chunks_au;
        DROP TABLE chunks_fts;
        CREATE VIRTUAL TABLE chunks_fts USING fts5 (
            heading, keywords, body,
            content = 'chunks', content_rowid = 'id',
            tokenize = 'porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
            INSERT INTO chunks_fts (rowid, heading, keywords, body)
                VALUES (new.id, new.heading, new.keywords, new.body);
        END;
        CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
            INSERT INTO chunks_fts (chunks_fts, rowid, heading, keywords, body)
                VALUES ('delete', old.id, old.heading, old.keywords, old.body);
        END;
        CREATE TRIGGER chunks_au AFTER UPDATE ON chunks BEGIN
            INSERT INTO chunks_fts (chunks_fts, rowid, heading, keywords, body)
                VALUES ('delete', old.id, old.heading, old.keywords, old.body);
            INSERT INTO chunks_fts (rowid, heading, keywords, body)
                VALUES (new.id, new.heading, new.keywords, new.body);
        END;
        INSERT INTO chunks_fts (chunks_fts) VALUES ('rebuild');
    """)


@migration
def m004_cache_gc(db: sqlite3.Connection) -> None:
    """When an embedding cache entry was first found unused (NULL: in use); see index/gc.py."""
    run_script(db, """
        ALTER TABLE embeddings ADD COLUMN orphaned_at REAL;
        CREATE INDEX embeddings_orphaned ON embeddings (orphaned_at) WHERE orphaned_at IS NOT NULL;
    """)


@migration
def m005_file_chunk_counts(db: sqlite3.Connection) -> None:
    """Per-file chunk counts and per-source totals kept by triggers, so that status and file
    listings cost O(1) in the number of chunks (they counted every chunk on each call)."""
    run_script(db, """
        ALTER TABLE files ADD COLUMN chunks INTEGER NOT NULL DEFAULT 0;
        UPDATE files SET chunks = (SELECT COUNT(*) FROM chunks c WHERE c.file_id = files.id);

        -- (source, key) -> n, where key is a file status ('indexed', 'skipped', 'failed') or
        -- 'chunks'. Only the triggers below write it.
        CREATE TABLE counts (
            source  TEXT NOT NULL,
            key     TEXT NOT NULL,
            n       INTEGER NOT NULL,
            PRIMARY KEY (source, key)
        ) WITHOUT ROWID;
        INSERT INTO counts (source, key, n) SELECT source, status, COUNT(*) FROM files
            GROUP BY source, status;
        INSERT INTO counts (source, key, n) SELECT source, 'chunks', SUM(chunks) FROM files
            GROUP BY source;

        CREATE TRIGGER files_counts_ai AFTER INSERT ON files BEGIN
            INSERT INTO counts (source, key, n) VALUES (new.source, new.status, 1)
                ON CONFLICT (source, key) DO UPDATE SET n = n + 1;
            INSERT INTO counts (source, key, n) VALUES (new.source, 'chunks', new.chunks)
                ON CONFLICT (source, key) DO UPDATE SET n = n + excluded.n;
        END;
        CREATE TRIGGER files_counts_ad AFTER DELETE ON files BEGIN
            UPDATE counts SET n = n - 1 WHERE source = old.source AND key = old.status;
            UPDATE counts SET n = n - old.chunks WHERE source = old.source AND key = 'chunks';
        END;
        CREATE TRIGGER files_counts_au AFTER UPDATE OF source, status, chunks ON files BEGIN
            UPDATE counts SET n = n - 1 WHERE source = old.source AND key = old.status;
            UPDATE counts SET n = n - old.chunks WHERE source = old.source AND key = 'chunks';
            INSERT INTO counts (source, key, n) VALUES (new.source, new.status, 1)
                ON CONFLICT (source, key) DO UPDATE SET n = n + 1;
            INSERT INTO counts (source, key, n) VALUES (new.source, 'chunks', new.chunks)
                ON CONFLICT (source, key) DO UPDATE SET n = n + excluded.n;
        END;
    """)


@migration
def m006_notes_fts(db: sqlite3.Connection) -> None:
    """Each note as one document beside its chunks (notes_fts, rowid = file id: its title,
    aliases and tags, headings and whole body), for search/notes.py's note-level BM25. Triggers
    on chunks mark a file whose chunks changed (notes_dirty); whoever writes chunks rebuilds
    those notes' rows before committing (refresh_notes), so a snapshot's notes_fts is always its
    chunks'."""
    run_script(db, """
        CREATE VIRTUAL TABLE notes_fts USING fts5 (
            title, keywords, headings, body,
            tokenize = 'porter unicode61 remove_diacritics 2'
        );
        CREATE TABLE notes_dirty (file_id INTEGER PRIMARY KEY);
        CREATE TRIGGER notes_chunks_ai AFTER INSERT ON chunks BEGIN
            INSERT OR IGNORE INTO notes_dirty (file_id) VALUES (new.file_id);
        END;
        CREATE TRIGGER notes_chunks_ad AFTER DELETE ON chunks BEGIN
            INSERT OR IGNORE INTO notes_dirty (file_id) VALUES (old.file_id);
        END;
        CREATE TRIGGER notes_chunks_au AFTER UPDATE OF file_id, heading, keywords, body
        ON chunks BEGIN
            INSERT OR IGNORE INTO notes_dirty (file_id) VALUES (old.file_id);
            INSERT OR IGNORE INTO notes_dirty (file_id) VALUES (new.file_id);
        END;
        DELETE FROM meta WHERE key = 'notes_format';
    """)  # the rows are built by check_notes, right after the migrations


@migration
def m007_symbol_words(db: sqlite3.Connection) -> None:
    """A chunk's keywords end with the symbols of its text as words FTS5 keeps (⛔ -> sym26d4:
    with_symbols), so that FTS5 finds a symbol as tantivy does — FTS5 ranks while
    tantivy fills, and whenever an editor's unsaved buffer is searched. The triggers bring
    chunks_fts (and tantivy's and Milvus's outboxes) along; the notes touched are rebuilt."""
    rows = [(new, cid) for cid, heading, kw, body in db.execute(
        "SELECT id, heading, keywords, body FROM chunks")
        if any(ch > "\x7f" for ch in heading + kw + body)
        and (new := with_symbols(heading, kw, body)) != kw]
    tantivy = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'text_outbox'").fetchone()
    waiting = {r[0] for r in db.execute("SELECT chunk_id FROM text_outbox")} if tantivy else ()
    db.executemany("UPDATE chunks SET keywords = ? WHERE id = ?", rows)
    if tantivy:  # what tantivy holds of them is unchanged (textindex.indexed_texts): not sent
        # again, which would leave each old document counted in its statistics
        db.executemany("DELETE FROM text_outbox WHERE chunk_id = ?",
                       [(cid,) for _, cid in rows if cid not in waiting])
    refresh_notes(db)


@migration
def m008_removed_sources(db: sqlite3.Connection) -> None:
    """A source removed from the config is set aside, not deleted: its files' rows, each with
    its chunks (as JSON), wait here for the GC grace period, so that a bad save of the config
    (empty, cut short) loses nothing: added back, the source is restored as it was, and
    scanned. GC deletes what has waited out the grace period."""
    run_script(db, """
        CREATE TABLE removed_sources (
            source      TEXT PRIMARY KEY,
            reading     TEXT,           -- how its files were read (store.reading), as JSON
            removed_at  REAL NOT NULL
        );
        CREATE TABLE removed_files (
            id          INTEGER PRIMARY KEY,
            source      TEXT NOT NULL,
            relpath     NOT NULL,       -- as files.relpath: TEXT, or a BLOB (not UTF-8)
            size        INTEGER NOT NULL,
            mtime_ns    INTEGER NOT NULL,
            hash        TEXT,
            status      TEXT NOT NULL,
            reason      TEXT,
            indexed_at  REAL NOT NULL,
            meta        TEXT,
            chunks      TEXT NOT NULL   -- JSON: [ChunkRecord fields, in order]
        );
        CREATE INDEX removed_files_source ON removed_files (source);
    """)


SCHEMA_VERSION = len(MIGRATIONS)


# -- file names that are not UTF-8 -----------------------------------------------------------
# os.scandir gives such a name as a str holding lone surrogates (surrogateescape), which
# SQLite cannot store as TEXT. Such a relpath is stored as a BLOB of its raw bytes instead:
# SQLite never finds a BLOB equal to a TEXT, so the two spellings cannot collide, and the
# round trip is exact.

def db_rel(rel: str) -> str | bytes:
    """A relative path as stored in files.relpath."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(rel)
    return rel


def fs_rel(value: str | bytes) -> str:
    """files.relpath back to the path as os functions take it."""
    return os.fsdecode(value) if isinstance(value, bytes) else value


# -- writing ---------------------------------------------------------------------------------

TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN",
             "SQLITE_PROTOCOL")


def transient(e: BaseException) -> bool:
    """Is this an error of the database's situation (busy, disk full, I/O), which passes,
    rather than of the statement? A writer retries those later and loses nothing."""
    if not isinstance(e, sqlite3.OperationalError):
        return False
    name = getattr(e, "sqlite_errorname", "") or ""
    if name:
        return name.startswith(TRANSIENT)
    msg = str(e)
    return any(t in msg for t in ("locked", "busy", "disk is full", "disk I/O error"))


def busy(e: BaseException) -> bool:
    name = getattr(e, "sqlite_errorname", "") or ""
    return isinstance(e, sqlite3.OperationalError) and (
        name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or (not name and "locked" in str(e)))


def begin(db: sqlite3.Connection, stop: threading.Event | None = None) -> None:
    """BEGIN IMMEDIATE, waiting out a busy database.

    busy_timeout already makes BEGIN wait up to 10 s for another writer; past that it is tried
    again, with a warning, until it gets the lock or `stop` is set (then the error is raised).
    """
    delay = 0.05
    while True:
        try:
            db.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as e:
            if not busy(e) or (stop is not None and stop.is_set()):
                raise
            log.warning("the index is busy (%s); waiting for the write lock", e)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def rollback(db: sqlite3.Connection) -> None:
    """Roll back the open transaction, if any (after an error: never raises)."""
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def script_statements(script: str) -> list[str]:
    """A SQL script's statements, split on the ';' that end them, not those inside a trigger's
    BEGIN ... END (executescript would commit the caller's transaction)."""
    out, cur = [], []
    for line in script.strip().splitlines():
        cur.append(line)
        s = line.strip()
        if s.endswith(";") and (s == "END;" or not any("BEGIN" in c for c in cur)):
            out.append("\n".join(cur))
            cur = []
    return out


@contextmanager
def transaction(db: sqlite3.Connection, stop: threading.Event | None = None):
    """A write transaction that waits out a busy database (see begin). Any error inside the
    block rolls it back and is raised to the caller, whose work stays queued."""
    begin(db, stop)
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        rollback(db)
        raise


def connect(path: Path | str, readonly: bool = False) -> sqlite3.Connection:
    """Open the index with the pragmas every connection needs; the one place they are set.

    busy_timeout lets a reader wait out the writer's brief checkpoint locks instead of failing.
    synchronous=NORMAL is safe in WAL mode (a power cut may lose the last commits, never
    corrupt the file), and much faster than FULL for per-file commits.
    """
    if readonly:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False,
                             isolation_level=None)
    else:
        db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA busy_timeout = 10000")
    db.execute("PRAGMA foreign_keys = ON")
    if not readonly:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
    return db


def migrate(db: sqlite3.Connection) -> int:
    """Bring the schema up to date; returns the version found before migrating."""
    found = db.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise StoreError(f"the index was written by a newer ragd (schema {found}, this ragd "
                         f"knows {SCHEMA_VERSION}); upgrade ragd or move the data dir aside")
    for version in range(found, SCHEMA_VERSION):
        db.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version](db)
            db.execute(f"PRAGMA user_version = {version + 1}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return found


def reading(db: sqlite3.Connection) -> dict:
    """How each source's files were last read in full: {source: {chunk_tokens, chunk_overlap,
    kind, include, exclude}} as save_reading left it ({} before it ever did)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'reading'").fetchone()
    try:
        value = json.loads(row[0]) if row else {}
    except ValueError:  # (not ours: nothing known, recorded anew)
        return {}
    return value if isinstance(value, dict) else {}


def save_reading(db: sqlite3.Connection, sources: dict) -> None:
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('reading', ?)",
               (json.dumps(sources, sort_keys=True),))


NOTES_FORMAT = "3"  # of notes_fts's rows (note_row): another rebuilds them (2: symbol words;
# 3: those of the title, aliases, tags and headings too)


def check_notes(db: sqlite3.Connection) -> None:
    """Build every note's notes_fts row when they are of another format (or were never built:
    after store.m006), in one transaction."""
    row = db.execute("SELECT value FROM meta WHERE key = 'notes_format'").fetchone()
    if row is not None and row[0] == NOTES_FORMAT:
        return
    t0 = time.monotonic()
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("INSERT OR IGNORE INTO notes_dirty (file_id) SELECT DISTINCT file_id "
                   "FROM chunks")
        n = refresh_notes(db)
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('notes_format', ?)",
                   (NOTES_FORMAT,))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    if n:
        log.info("note index built: %d notes (%.1fs)", n, time.monotonic() - t0)


def open_store(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        db = connect(path)
        migrate(db)
        check_notes(db)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"cannot open the index {path}: {e}") from e
    return db


@dataclass
class FileRow:
    id: int
    source: str
    relpath: str
    size: int
    mtime_ns: int
    hash: str | None
    status: str
    reason: str | None
    indexed_at: float


@dataclass
class ChunkRecord:
    ordinal: int
    heading: str
    line_start: int
    line_end: int
    text: str
    text_hash: str
    embed_hash: str
    body: str = ""
    keywords: str = ""


@dataclass
class Changes:
    """Chunk rows a transaction removed and added, for whoever mirrors them (the vectors),
    who drops every removed id and then takes every added one. So `added` holds only the
    rows still there: a row added and removed again in the same transaction (a file written
    twice in one batch) is dropped from it, where it would have been mirrored for a chunk
    that no longer exists. (An id removed and then added again is in both: SQLite reuses the
    largest ids.) `gone` holds the embed hashes of the removed rows, so the vectors can drop
    from their queue the texts no chunk has any more (a source purged while its texts were
    still waiting for a vector: status counted them to embed)."""
    removed: list[int]
    gone: set[str]
    _added: dict[int, tuple[int, str, int]]

    def __init__(self, live: bool = False):
        self.removed, self.gone, self._added = [], set(), {}
        self.live = live  # a few files' edits, heard live (their new texts embed first)

    @property
    def added(self) -> list[tuple[int, str, int]]:
        """(chunk id, embed_hash, file id) of the rows added and still there."""
        return list(self._added.values())

    def remove(self, rows: Iterable[tuple[int, str]]) -> None:
        """(chunk id, embed_hash) of rows removed."""
        for cid, h in rows:
            self.removed.append(cid)
            self.gone.add(h)
            self._added.pop(cid, None)

    def add(self, rows: Iterable[tuple[int, str, int]]) -> None:
        for row in rows:
            self._added[row[0]] = row

    def extend(self, other: "Changes") -> None:
        """Another's changes, made after these."""
        for cid in other.removed:
            self.removed.append(cid)
            self._added.pop(cid, None)
        self.gone |= other.gone
        self.add(other._added.values())


def file_rows(db: sqlite3.Connection, source: str) -> dict[str, FileRow]:
    rows = db.execute("SELECT id, source, relpath, size, mtime_ns, hash, status, reason, "
                      "indexed_at FROM files WHERE source = ?", (source,))
    out = {}
    for r in rows:
        row = FileRow(*r)
        row.relpath = fs_rel(row.relpath)
        out[row.relpath] = row
    return out


def file_row(db: sqlite3.Connection, source: str, relpath: str):
    """(id, hash, status) of one file, or None."""
    return db.execute("SELECT id, hash, status FROM files WHERE source = ? AND relpath = ?",
                      (source, db_rel(relpath))).fetchone()


def put_file(db: sqlite3.Connection, source: str, relpath: str, size: int, mtime_ns: int,
             hash_: str | None, status: str, reason: str | None,
             chunks: Iterable[ChunkRecord] | None, changes: Changes | None = None,
             meta: str | None = None) -> int:
    """Record one file and (when chunks is not None) replace its chunks. Caller holds the
    transaction, so the file row, its chunks and their FTS rows change together."""
    now = time.time()
    chunks = list(chunks) if chunks is not None else None
    row = file_row(db, source, relpath)
    n = len(chunks) if chunks is not None else None
    if row is None:
        file_id = db.execute(
            "INSERT INTO files (source, relpath, size, mtime_ns, hash, status, reason, "
            "indexed_at, meta, chunks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (source, db_rel(relpath), size, mtime_ns, hash_, status, reason, now, meta,
             n or 0)).lastrowid
    else:
        file_id = row[0]
        db.execute("UPDATE files SET size = ?, mtime_ns = ?, hash = ?, status = ?, reason = ?, "
                   "indexed_at = ?, meta = ?, chunks = COALESCE(?, chunks) WHERE id = ?",
                   (size, mtime_ns, hash_, status, reason, now, meta, n, file_id))
    if chunks is not None:
        if changes is not None:
            changes.remove(db.execute("SELECT id, embed_hash FROM chunks WHERE file_id = ?",
                                      (file_id,)))
        db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
        db.executemany(
            "INSERT INTO chunks (file_id, ordinal, heading, line_start, line_end, text, "
            "text_hash, embed_hash, body, keywords) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(file_id, c.ordinal, c.heading, c.line_start, c.line_end, c.text, c.text_hash,
              c.embed_hash, c.body, c.keywords) for c in chunks])
        if changes is not None:
            changes.add((r[0], r[1], file_id) for r in db.execute(
                "SELECT id, embed_hash FROM chunks WHERE file_id = ?", (file_id,)))
    return file_id


NOTES_BATCH = 500  # notes rebuilt per statement by refresh_notes


def note_row(chunks: list[tuple[str, str, str]]) -> tuple[str, str, str, str]:
    """A note's notes_fts columns (title, keywords, headings, body) from its chunks' (heading
    path, keywords, body) in order: the title is the first part of the heading path, each
    heading once, the bodies joined."""
    title, keywords = (chunks[0][0].split(" > ")[0],
                       note_keywords(*chunks[0])) if chunks else ("", "")
    headings: list[str] = []
    for heading, _, _ in chunks:
        headings.extend(h for h in heading.split(" > ")[1:] if h not in headings)
    body = "\n".join(c[2] for c in chunks)
    # FTS5 drops ⛔ 📅: each becomes a word of its own (of the title and headings too)
    signs = symbol_words("\n".join([title, keywords, *headings, body]))
    return title, keywords, "\n".join(headings), body + ("\n" + signs if signs else "")


def refresh_notes(db: sqlite3.Connection) -> int:
    """Rebuild the notes_fts rows of the files whose chunks changed in this transaction (marked
    in notes_dirty by triggers); returns how many. Call inside the writer's transaction, before
    its COMMIT. A note's row is note_row of its chunks (of NOTES_FORMAT: check_notes)."""
    dirty = [r[0] for r in db.execute("SELECT file_id FROM notes_dirty")]
    for i in range(0, len(dirty), NOTES_BATCH):
        part = dirty[i:i + NOTES_BATCH]
        marks = ",".join("?" * len(part))
        db.execute(f"DELETE FROM notes_fts WHERE rowid IN ({marks})", part)
        chunks: dict[int, list[tuple[str, str, str]]] = {}
        for fid, heading, keywords, body in db.execute(
                f"SELECT file_id, heading, keywords, body FROM chunks WHERE file_id IN ({marks}) "
                "ORDER BY file_id, ordinal", part):
            chunks.setdefault(fid, []).append((heading, keywords, body))
        db.executemany("INSERT INTO notes_fts (rowid, title, keywords, headings, body) "
                       "VALUES (?, ?, ?, ?, ?)",
                       [(fid, *note_row(cs)) for fid, cs in chunks.items()])
    if dirty:
        db.execute("DELETE FROM notes_dirty")
    return len(dirty)


def touch_file(db: sqlite3.Connection, file_id: int, size: int, mtime_ns: int) -> None:
    """Same content, new stat: remember the stat so the next scan does not hash it again."""
    db.execute("UPDATE files SET size = ?, mtime_ns = ? WHERE id = ?", (size, mtime_ns, file_id))


def delete_file(db: sqlite3.Connection, file_id: int, changes: Changes | None = None) -> None:
    if changes is not None:
        changes.remove(db.execute("SELECT id, embed_hash FROM chunks WHERE file_id = ?",
                                  (file_id,)))
    db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
    db.execute("DELETE FROM files WHERE id = ?", (file_id,))


CHUNK_FIELDS = ("ordinal", "heading", "line_start", "line_end", "text", "text_hash",
                "embed_hash", "body", "keywords")


def set_aside(db: sqlite3.Connection, source: str, file_ids: list[int],
              changes: Changes | None = None) -> None:
    """Move files of a removed source, with their chunks, out of the index into
    removed_files (in the caller's transaction): no longer searched or listed, and restored
    as they were by restore()."""
    for fid in file_ids:
        chunks = [list(r) for r in db.execute(
            f"SELECT {', '.join(CHUNK_FIELDS)} FROM chunks WHERE file_id = ? ORDER BY ordinal",
            (fid,))]
        db.execute("INSERT INTO removed_files (source, relpath, size, mtime_ns, hash, status, "
                   "reason, indexed_at, meta, chunks) SELECT ?, relpath, size, mtime_ns, hash, "
                   "status, reason, indexed_at, meta, ? FROM files WHERE id = ?",
                   (source, json.dumps(chunks, ensure_ascii=False), fid))
        delete_file(db, fid, changes)


def restore(db: sqlite3.Connection, source: str, limit: int,
            changes: Changes | None = None) -> int:
    """Put back up to `limit` set-aside files of `source` (in the caller's transaction), as
    they were indexed, oldest first (a path set aside twice: the later one stays); returns
    how many."""
    rows = db.execute("SELECT id, relpath, size, mtime_ns, hash, status, reason, indexed_at, "
                      "meta, chunks FROM removed_files WHERE source = ? ORDER BY id LIMIT ?",
                      (source, limit)).fetchall()
    for r in rows:
        records = [ChunkRecord(**dict(zip(CHUNK_FIELDS, c))) for c in json.loads(r["chunks"])]
        fid = put_file(db, source, fs_rel(r["relpath"]), r["size"], r["mtime_ns"], r["hash"],
                       r["status"], r["reason"], records, changes, meta=r["meta"])
        db.execute("UPDATE files SET indexed_at = ? WHERE id = ?", (r["indexed_at"], fid))
        db.execute("DELETE FROM removed_files WHERE id = ?", (r["id"],))
    return len(rows)


def removed_sources(db: sqlite3.Connection) -> dict[str, dict]:
    """Sources set aside: {name: {"reading", "removed_at", "files"}}."""
    files = dict(db.execute("SELECT source, COUNT(*) FROM removed_files GROUP BY source"))
    out = {}
    for name, reading, at in db.execute("SELECT source, reading, removed_at "
                                        "FROM removed_sources"):
        try:
            how = json.loads(reading) if reading else None
        except ValueError:
            how = None
        out[name] = {"reading": how, "removed_at": at, "files": files.get(name, 0)}
    return out


def source_counts(db: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """Per source: files by status, and chunks (kept by triggers: no counting)."""
    out: dict[str, dict[str, int]] = {}
    for source, key, n in db.execute("SELECT source, key, n FROM counts"):
        out.setdefault(source, {})[key] = n
    return out


def shared_text_counts(db: sqlite3.Connection, chunk_ids: Iterable[int]) -> dict[int, int]:
    """chunk id -> how many files of its source hold a chunk of exactly its text (1: its own
    file only). Chunk ids of no row are left out."""
    ids = [c for c in dict.fromkeys(chunk_ids) if c > 0]
    out: dict[int, int] = {}
    for i in range(0, len(ids), 500):
        part = ids[i:i + 500]
        out.update(db.execute(
            "SELECT c.id, (SELECT COUNT(DISTINCT c2.file_id) FROM chunks c2 JOIN files f2 ON "
            "f2.id = c2.file_id WHERE c2.text_hash = c.text_hash AND f2.source = f.source) "
            f"FROM chunks c JOIN files f ON f.id = c.file_id WHERE c.id IN "
            f"({','.join('?' * len(part))})", part).fetchall())
    return out
