"""The index's schema: its migrations, and the rows derived from the chunks (each note's
notes_fts row). store.py opens the database and migrates it with these.

Schema changes are migrations: functions named ``mNNN_what`` appended to :data:`MIGRATIONS`,
applied in order, each in one transaction with the ``PRAGMA user_version`` bump that records it.
Never edit a migration that has shipped; add a new one.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from typing import Callable

from ragd.text import name_key, note_keywords, symbol_words, with_symbols

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
    scanned. GC deletes what has waited out the grace period. (IF NOT EXISTS: an index whose
    user_version was set back, as the tests of older migrations do, keeps its tables.)"""
    run_script(db, """
        CREATE TABLE IF NOT EXISTS removed_sources (
            source      TEXT PRIMARY KEY,
            reading     TEXT,           -- how its files were read (store.reading), as JSON
            removed_at  REAL NOT NULL
        );
        CREATE TABLE IF NOT EXISTS removed_files (
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
        CREATE INDEX IF NOT EXISTS removed_files_source ON removed_files (source);
    """)


@migration
def m009_note_dates(db: sqlite3.Connection) -> None:
    """Files get the note's own date (ragd/dates.py: its frontmatter's, its headers', a daily
    note's file name), in nanoseconds as mtime_ns; NULL when it states none, and a date
    filter reads mtime_ns then. Rows indexed before are NULL until read again (the parser
    version does that: loader.PARSER). (A column already there, as in an index whose
    user_version was set back, is kept.)"""
    if not any(r[1] == "note_date_ns" for r in db.execute("PRAGMA table_info(files)")):
        db.execute("ALTER TABLE files ADD COLUMN note_date_ns INTEGER")


@migration
def m010_chunks_generation(db: sqlite3.Connection) -> None:
    """A count of every change to the chunks table (a chunk added or removed, or its text hash
    or file changed), bumped by triggers in the writer's own transaction. A vector snapshot
    records it: equal at the next start, the chunks are those the snapshot was taken of, and
    nothing needs to be read back to check it (a million rows of ids and hashes, 1.4 s).
    (IF NOT EXISTS: an index whose user_version was set back keeps its triggers.)"""
    run_script(db, """
        INSERT OR IGNORE INTO meta (key, value) VALUES ('chunks_gen', 0);
        CREATE TRIGGER IF NOT EXISTS chunks_gen_ai AFTER INSERT ON chunks BEGIN
            UPDATE meta SET value = value + 1 WHERE key = 'chunks_gen';
        END;
        CREATE TRIGGER IF NOT EXISTS chunks_gen_ad AFTER DELETE ON chunks BEGIN
            UPDATE meta SET value = value + 1 WHERE key = 'chunks_gen';
        END;
        CREATE TRIGGER IF NOT EXISTS chunks_gen_au AFTER UPDATE OF file_id, embed_hash
                ON chunks BEGIN
            UPDATE meta SET value = value + 1 WHERE key = 'chunks_gen';
        END;
    """)



@migration
def m011_note_names(db: sqlite3.Connection) -> None:
    """Each note's names — its title and aliases, as text.name_key gives them — for a search
    that is a note's name (search/names.py). Kept with notes_fts by refresh_notes; filled for
    the notes there are by check_notes (NOTES_FORMAT 4)."""
    run_script(db, """
        CREATE TABLE IF NOT EXISTS note_names (
            key     TEXT NOT NULL,
            file_id INTEGER NOT NULL,
            PRIMARY KEY (key, file_id)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS note_names_file ON note_names (file_id);
    """)


@migration
def m012_text_hash_as_read(db: sqlite3.Connection) -> None:
    """chunks.text_hash becomes the hash of the text as read (chunker.read_hash: addresses
    left out), so that a footer linking each note's own page is one text in every note, as
    boilerplate. Only the searches' weighing of shared text and related read it; nothing is
    embedded or read again.

    chunks_fts's update trigger fires from now on only when a column it indexes changes: it
    deleted and wrote again the words of every chunk updated, whatever the column, so this
    migration would have written the whole of chunks_fts again before the daemon answers."""
    from ragd.ingest.chunker import read_hash
    t0 = time.monotonic()
    run_script(db, """
        DROP TRIGGER chunks_au;
        CREATE TRIGGER chunks_au AFTER UPDATE OF heading, keywords, body ON chunks BEGIN
            INSERT INTO chunks_fts (chunks_fts, rowid, heading, keywords, body)
                VALUES ('delete', old.id, old.heading, old.keywords, old.body);
            INSERT INTO chunks_fts (rowid, heading, keywords, body)
                VALUES (new.id, new.heading, new.keywords, new.body);
        END;
    """)
    n, last = 0, -1
    while batch := db.execute("SELECT id, text, text_hash FROM chunks WHERE id > ? "
                              "ORDER BY id LIMIT 10000", (last,)).fetchall():
        changed = [(h, cid) for cid, text, old in batch if (h := read_hash(text)) != old]
        db.executemany("UPDATE chunks SET text_hash = ? WHERE id = ?", changed)
        n, last = n + len(changed), batch[-1][0]
    if n:
        log.info("text hashes of %d chunks taken as read (%.1fs)", n, time.monotonic() - t0)


@migration
def m013_embeddings_with_rowid(db: sqlite3.Connection) -> None:
    """The embedding cache as a rowid table, its (space, text_hash) key a unique index. As a
    WITHOUT ROWID table each row (a 1.5 KB vector) was a key of the tree, interior pages
    included: few to a page, the vector's rest on an overflow page, a deep tree; and a search
    reads the stored vectors of its 50-odd first candidates by that key (VectorStore.rescore).
    The table is restated here, not derived from m002's: a migration says what it builds."""
    t0 = time.monotonic()
    trigger = db.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND "
                         "tbl_name = 'embeddings'").fetchall()
    run_script(db, """
        CREATE TABLE embeddings_new (
            space       INTEGER NOT NULL REFERENCES spaces(id),
            text_hash   TEXT NOT NULL,
            vector      BLOB NOT NULL,
            tokens      INTEGER NOT NULL,
            truncated   INTEGER NOT NULL DEFAULT 0,
            created_at  REAL NOT NULL,
            orphaned_at REAL,
            PRIMARY KEY (space, text_hash)
        );
    """)
    n = db.execute("""
        INSERT INTO embeddings_new (space, text_hash, vector, tokens, truncated, created_at,
                                    orphaned_at)
            SELECT space, text_hash, vector, tokens, truncated, created_at, orphaned_at
            FROM embeddings""").rowcount
    run_script(db, """
        DROP TABLE embeddings;
        ALTER TABLE embeddings_new RENAME TO embeddings;
        CREATE INDEX embeddings_orphaned ON embeddings (orphaned_at) WHERE orphaned_at IS NOT NULL;
    """)
    for (sql,) in trigger:  # (the Milvus outbox's: dropped with the table)
        db.execute(sql)
    if n > 0:
        log.info("embedding cache of %d vectors rewritten as a rowid table (%.1fs)", n,
                 time.monotonic() - t0)


SCHEMA_VERSION = len(MIGRATIONS)


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


def note_names(db: sqlite3.Connection, titles: dict[int, str]) -> list[tuple[str, int]]:
    """(name key, file id) of each of these notes' names: its title and its aliases (the
    frontmatter's, a document's file name and number: the file's meta)."""
    out = []
    metas = dict(db.execute(f"SELECT id, meta FROM files WHERE id IN "
                            f"({','.join('?' * len(titles))})", list(titles))) if titles else {}
    for fid, title in titles.items():
        try:
            aliases = (json.loads(metas.get(fid) or "null") or {}).get("aliases") or []
        except ValueError:
            aliases = []
        for name in (title, *(a for a in aliases if isinstance(a, str))):
            if key := name_key(name):
                out.append((key, fid))
    return out


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
        rows = [(fid, *note_row(cs)) for fid, cs in chunks.items()]
        db.executemany("INSERT INTO notes_fts (rowid, title, keywords, headings, body) "
                       "VALUES (?, ?, ?, ?, ?)", rows)
        db.execute(f"DELETE FROM note_names WHERE file_id IN ({marks})", part)
        db.executemany("INSERT OR IGNORE INTO note_names (key, file_id) VALUES (?, ?)",
                       note_names(db, {row[0]: row[1] for row in rows}))
    if dirty:
        db.execute("DELETE FROM notes_dirty")
    return len(dirty)


NOTES_FORMAT = "4"  # of notes_fts's rows (note_row): another rebuilds them (2: symbol words;
# 3: those of the title, aliases, tags and headings too; 4: note_names beside them)


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
