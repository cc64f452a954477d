"""The SQLite index: files, chunks and the FTS5 index over chunk text.

One database per data dir, in WAL mode: one writer (the indexer thread) and any number of
readers (search requests, each on its own connection) work at once without blocking each other.

The schema, its migrations and the notes' derived rows are in schema.py; this module is the
one door to the database: connections, transactions, and named reads and writes of its rows.
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
from typing import Iterable

from ragd import dates
from ragd.index.schema import (MIGRATIONS, NOTES_FORMAT, SCHEMA_VERSION, StoreError,  # noqa: F401
                               check_notes, note_row, refresh_notes, script_statements)

log = logging.getLogger("ragd.store")

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


def open_store(path: Path, upgrading: Path | None = None) -> sqlite3.Connection:
    """The index, its schema brought up to date; `upgrading`: a file that says so while an
    existing index is migrated (protocol.upgrading_path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        db = connect(path)
        found = db.execute("PRAGMA user_version").fetchone()[0]
        marked = None
        if upgrading is not None and found == SCHEMA_VERSION:
            upgrading.unlink(missing_ok=True)  # (a daemon killed while upgrading left it)
        if 0 < found < SCHEMA_VERSION:
            log.info("upgrading the index from schema %d to %d (once; a large index takes a "
                     "minute or more)", found, SCHEMA_VERSION)
            if upgrading is not None:
                try:
                    upgrading.parent.mkdir(parents=True, exist_ok=True)
                    upgrading.write_text(f"schema {found} -> {SCHEMA_VERSION}\n")
                    marked = upgrading
                except OSError as e:  # (only ragctl's patience depends on it)
                    log.warning("cannot write %s: %s", upgrading, e)
        try:
            migrate(db)
        finally:
            if marked is not None:
                marked.unlink(missing_ok=True)
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


def file_stats(db: sqlite3.Connection, source: str) -> set[tuple[str, int, int]]:
    """(relpath, size, mtime_ns) of each file of a source: what a scan compares with."""
    return {(r if type(r) is str else fs_rel(r), size, mtime)
            for r, size, mtime in db.execute("SELECT relpath, size, mtime_ns FROM files "
                                             "WHERE source = ?", (source,))}


def file_rows_of(db: sqlite3.Connection, source: str, rels) -> dict[str, FileRow]:
    """The rows of these files of a source (those a scan found gone)."""
    # (in lists, not a query each: a source's folder gone takes all its files at once)
    by_key = {db_rel(rel): rel for rel in rels}
    out = {}
    for part, q in in_batches(by_key, IN_BATCH - 1):
        for r in db.execute("SELECT id, source, relpath, size, mtime_ns, hash, status, reason, "
                            f"indexed_at FROM files WHERE source = ? AND relpath IN ({q})",
                            (source, *part)):
            row = FileRow(*r)
            row.relpath = by_key[row.relpath]
            out[row.relpath] = row
    return out


def file_row(db: sqlite3.Connection, source: str, relpath: str):
    """(id, hash, status, reason) of one file, or None."""
    return db.execute("SELECT id, hash, status, reason FROM files WHERE source = ? AND "
                      "relpath = ?",
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
    dated = note_date_ns(meta)
    if row is None:
        file_id = db.execute(
            "INSERT INTO files (source, relpath, size, mtime_ns, hash, status, reason, "
            "indexed_at, meta, chunks, note_date_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (source, db_rel(relpath), size, mtime_ns, hash_, status, reason, now, meta,
             n or 0, dated)).lastrowid
    else:
        file_id = row[0]
        db.execute("UPDATE files SET size = ?, mtime_ns = ?, hash = ?, status = ?, reason = ?, "
                   "indexed_at = ?, meta = ?, chunks = COALESCE(?, chunks), note_date_ns = ? "
                   "WHERE id = ?",
                   (size, mtime_ns, hash_, status, reason, now, meta, n, dated, file_id))
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


def same_chunks(db: sqlite3.Connection, file_id: int, chunks: list[ChunkRecord],
                meta: str | None) -> bool:
    """Do a file's chunk rows hold exactly these records, and its row this meta (whose
    aliases name the note: refresh_notes)? A file read again whose chunks come out the same
    (every file is read again when the parser changes, and most of them chunk as before)
    keeps its rows and their ids: rewriting them would push every chunk through the text
    index again (enough of them have it filled anew, for minutes in a large index), and
    through the vectors and the notes' rows, for nothing."""
    if db.execute("SELECT meta FROM files WHERE id = ?", (file_id,)).fetchone()[0] != meta:
        return False
    old = db.execute("SELECT ordinal, heading, line_start, line_end, text, text_hash, "
                     "embed_hash, body, keywords FROM chunks WHERE file_id = ? ORDER BY ordinal",
                     (file_id,)).fetchall()
    return len(old) == len(chunks) and all(
        tuple(o) == (c.ordinal, c.heading, c.line_start, c.line_end, c.text, c.text_hash,
                     c.embed_hash, c.body, c.keywords) for o, c in zip(old, chunks))


def note_date_ns(meta: str | None) -> int | None:
    """The note's own date (its meta's `date`, as Doc.meta writes it) in nanoseconds, for
    files.note_date_ns; None when it states none."""
    try:
        when = dates.parse((json.loads(meta) or {}).get("date")) if meta else None
        t = dates.stamp(when) if when is not None else None
    except (ValueError, TypeError, AttributeError, OverflowError, OSError):
        return None
    # as far as nanoseconds in SQLite's 64-bit integers reach (1678-2262): 'date: 9999-01-01'
    # is no date to filter by, rather than a file that cannot be stored
    return int(t * 1e9) if t is not None and abs(t) < 9.2e9 else None


def move_file(db: sqlite3.Connection, file_id: int, relpath: str, size: int, mtime_ns: int,
              meta: str) -> None:
    """A file moved with its chunks unchanged: its row under the new path (and the meta
    read there: a daily note's date is its name's)."""
    db.execute("UPDATE files SET relpath = ?, size = ?, mtime_ns = ?, meta = ?, "
               "note_date_ns = ?, indexed_at = ? WHERE id = ?",
               (db_rel(relpath), size, mtime_ns, meta, note_date_ns(meta), time.time(),
                file_id))


def set_reason(db: sqlite3.Connection, file_id: int, reason: str) -> None:
    """A file's reason changed, and nothing else (kept from an earlier read)."""
    db.execute("UPDATE files SET reason = ? WHERE id = ?", (reason, file_id))


def chunk_bodies(db: sqlite3.Connection, file_id: int) -> list[sqlite3.Row]:
    """A file's chunks in order: id, body, line_start, line_end (what a move compares)."""
    return db.execute("SELECT id, body, line_start, line_end FROM chunks WHERE file_id = ? "
                      "ORDER BY ordinal", (file_id,)).fetchall()


def set_headings(db: sqlite3.Connection, rows: Iterable[tuple[str, str, int]]) -> None:
    """(heading, keywords, chunk id): a moved file's chunks under their new path."""
    db.executemany("UPDATE chunks SET heading = ?, keywords = ? WHERE id = ?", rows)


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


def sources_present(db: sqlite3.Connection) -> set[str]:
    """Sources the index holds rows of (from the counts the triggers keep)."""
    return {r[0] for r in db.execute("SELECT DISTINCT source FROM counts WHERE n > 0")}


def source_file_ids(db: sqlite3.Connection, source: str, limit: int) -> list[int]:
    return [r[0] for r in db.execute("SELECT id FROM files WHERE source = ? LIMIT ?",
                                     (source, limit))]


def note_removed(db: sqlite3.Connection, source: str, reading, at: float) -> None:
    """A source set aside: how it was last read, and when it was removed (the grace)."""
    db.execute("INSERT OR REPLACE INTO removed_sources (source, reading, removed_at) "
               "VALUES (?, ?, ?)", (source, json.dumps(reading), at))


def forget_removed(db: sqlite3.Connection, source: str) -> None:
    """A set-aside source restored in full: no longer waiting."""
    db.execute("DELETE FROM removed_sources WHERE source = ?", (source,))


def forget_counts(db: sqlite3.Connection, source: str) -> None:
    db.execute("DELETE FROM counts WHERE source = ?", (source,))


def skipped_reasons(db: sqlite3.Connection, prefix: str) -> set[str]:
    """The reasons files were skipped for that begin with prefix (a missing helper program)."""
    return {r[0] for r in db.execute("SELECT DISTINCT reason FROM files WHERE "
                                     "status = 'skipped' AND reason LIKE ?", (prefix + "%",))}


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


def unsaved(id_: int) -> bool:
    """Is this chunk (or note) id an editor's unsaved buffer's (index/buffers.py), not a row of
    the index? Buffers take negative ids: the index's rowids start at 1, so the rankings can
    merge both kinds in one list of ids, and this is the one test of which is which."""
    return id_ < 0


def indexed(ids) -> list[int]:
    """Those of the ids that are rows of the index (not unsaved buffers')."""
    return [i for i in ids if not unsaved(i)]


IN_BATCH = 900  # ids per "IN (?, ...)" list: under SQLite's 999 host parameters of old builds


def marks(n: int) -> str:
    """The "?, ?, ..." of an IN list of n values."""
    return ",".join("?" * n)


def in_batches(ids, size: int = IN_BATCH):
    """The ids in lists of at most `size`, each with its "?, ?" (for "IN ({marks})")."""
    ids = list(ids)
    for i in range(0, len(ids), size):
        part = ids[i:i + size]
        yield part, marks(len(part))


def count_files(db: sqlite3.Connection) -> int:
    return db.execute("SELECT COUNT(*) FROM files").fetchone()[0]


def chunks_gen(db: sqlite3.Connection) -> int:
    """How many changes the chunks table has had (schema.m010): equal, no chunk changed."""
    row = db.execute("SELECT value FROM meta WHERE key = 'chunks_gen'").fetchone()
    return int(row[0]) if row is not None else -1


def chunk_keys(db: sqlite3.Connection):
    """(ids, file ids, embed hashes as bytes padded with spaces to 32) of every chunk, by
    id, as numpy arrays. Read as one string of fixed-width records, not a row at a time: a
    snapshot written at a stop reads every chunk's keys and must fit in runtime.STOP_WITHIN
    at a million chunks."""
    import numpy as np  # (the store's other readers need no numpy)
    (text,) = db.execute(
        "SELECT group_concat(printf('%020d%020d%-32.32s', id, file_id, embed_hash), '') "
        "FROM (SELECT id, file_id, embed_hash FROM chunks ORDER BY id)").fetchone()
    rec = np.frombuffer((text or "").encode("ascii", "replace"),
                        dtype=[("id", "S20"), ("file", "S20"), ("hash", "S32")])
    return rec["id"].astype(np.int64), rec["file"].astype(np.int64), rec["hash"].copy()


def chunk_vectors(db: sqlite3.Connection, space: int, ids) -> dict[int, bytes]:
    """chunk id -> its vector in the space, as stored in the embedding cache (float32 bytes)."""
    out: dict[int, bytes] = {}
    for part, q in in_batches(indexed(ids)):
        # chunks by id, then each vector by its key: left to itself, the planner walked the
        # space's million cache rows to join them (13 s a search at 1M chunks)
        out.update(db.execute(
            f"SELECT c.id, (SELECT e.vector FROM embeddings e WHERE e.space = ? AND "
            f"e.text_hash = c.embed_hash) FROM chunks c WHERE c.id IN ({q})", [space, *part]))
    return {c: v for c, v in out.items() if v is not None}


def chunk_texts(db: sqlite3.Connection, ids) -> dict[int, str]:
    """chunk id -> its shown text."""
    out: dict[int, str] = {}
    for part, q in in_batches(indexed(ids)):
        out.update(db.execute(f"SELECT id, text FROM chunks WHERE id IN ({q})", part))
    return out


def chunk_files(db: sqlite3.Connection, ids) -> dict[int, tuple[int, int]]:
    """chunk id -> (its file's id, the file's chunk count)."""
    out: dict[int, tuple[int, int]] = {}
    for part, q in in_batches(indexed(ids)):
        for cid, fid, n in db.execute(
                f"SELECT c.id, c.file_id, f.chunks FROM chunks c JOIN files f ON f.id = "
                f"c.file_id WHERE c.id IN ({q})", part):
            out[cid] = (fid, n)
    return out


def chunk_spans(db: sqlite3.Connection, ids) -> dict[int, tuple]:
    """chunk id -> (id, line_start, line_end, heading)."""
    out: dict[int, tuple] = {}
    for part, q in in_batches(indexed(ids)):
        out.update({r[0]: tuple(r) for r in db.execute(
            f"SELECT id, line_start, line_end, heading FROM chunks WHERE id IN ({q})", part)})
    return out


def chunk_results(db: sqlite3.Connection, ids) -> dict[int, sqlite3.Row]:
    """chunk id -> what a search result shows of it: id, file_id, heading, line_start, line_end,
    text, and its file's source, relpath, indexed_at, size, mtime_ns, note_date_ns, and its
    meta's date and date_from (the note's date as shown, and where it came from)."""
    out: dict[int, sqlite3.Row] = {}
    for part, q in in_batches(indexed(ids)):
        out.update({r["id"]: r for r in db.execute(
            "SELECT c.id, c.file_id, c.heading, c.line_start, c.line_end, c.text, f.source, "
            "f.relpath, "
            "f.indexed_at, f.size, f.mtime_ns, f.note_date_ns, "
            "json_extract(f.meta, '$.date') AS date, "
            "json_extract(f.meta, '$.date_from') AS date_from "
            "FROM chunks c JOIN files f ON f.id = c.file_id "
            f"WHERE c.id IN ({q})", part)})
    return out


def chunk_neighbours(db: sqlite3.Connection, chunk_id: int, n: int = 3
                     ) -> tuple[list[tuple], list[tuple]]:
    """(the n chunks after it in its file, the n before it, nearest first), each as
    (id, line_start, line_end, text)."""
    row = db.execute("SELECT file_id, ordinal FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
    if row is None:
        return [], []
    fid, ordinal = row
    after = db.execute("SELECT id, line_start, line_end, text FROM chunks WHERE file_id = ? AND "
                       "ordinal > ? ORDER BY ordinal LIMIT ?", (fid, ordinal, n)).fetchall()
    before = db.execute("SELECT id, line_start, line_end, text FROM chunks WHERE file_id = ? "
                        "AND ordinal < ? ORDER BY ordinal DESC LIMIT ?",
                        (fid, ordinal, n)).fetchall()
    return after, before


def chunk_row(db: sqlite3.Connection, chunk_id: int):
    """heading, line_start, line_end, text of one chunk (None when gone)."""
    return db.execute("SELECT heading, line_start, line_end, text FROM chunks WHERE id = ?",
                      (chunk_id,)).fetchone()


def file_chunks(db: sqlite3.Connection, file_id: int, texts: bool = False) -> list[sqlite3.Row]:
    """A file's chunks in order: id, line_start, line_end, text_hash. texts: only those with a
    text (an empty note's one chunk is its title alone)."""
    return db.execute("SELECT id, line_start, line_end, text_hash FROM chunks WHERE file_id = ? "
                      + ("AND text != '' " if texts else "") + "ORDER BY ordinal",
                      (file_id,)).fetchall()


def titles(db: sqlite3.Connection, file_ids) -> dict[int, str | None]:
    """file id -> its note's title (the frontmatter's, in its meta), None when it has none."""
    out: dict[int, str | None] = {}
    for part, q in in_batches(indexed(file_ids)):
        for fid, meta in db.execute(f"SELECT id, meta FROM files WHERE id IN ({q})", part):
            try:
                out[fid] = (json.loads(meta) or {}).get("title") if meta else None
            except ValueError:
                out[fid] = None
    return out


def files_source(db: sqlite3.Connection, file_ids) -> str | None:
    """The source of the first of these files (None when there is none)."""
    ids = sorted(file_ids)
    if not ids:
        return None
    row = db.execute(f"SELECT source FROM files WHERE id IN ({marks(len(ids))})", ids).fetchone()
    return row[0] if row else None


def indexed_files(db: sqlite3.Connection, source: str | None = None) -> int:
    """Files indexed (of one source, or of all), from the counts the triggers keep."""
    return db.execute("SELECT COALESCE(SUM(n), 0) FROM counts WHERE key = 'indexed'"
                      + (" AND source = ?" if source else ""),
                      (source,) if source else ()).fetchone()[0]


def text_hash_files(db: sqlite3.Connection, hashes, source: str | None = None
                    ) -> dict[str, int]:
    """text hash -> how many files hold a chunk of that text (as read: chunker.read_hash),
    of one source or of all."""
    out: dict[str, int] = {}
    where, extra = ("AND f.source = ?", [source]) if source else ("", [])
    for part, q in in_batches(sorted(set(hashes))):
        out.update(db.execute(
            f"SELECT c.text_hash, COUNT(DISTINCT c.file_id) FROM chunks c JOIN files f ON "
            f"f.id = c.file_id WHERE c.text_hash IN ({q}) {where} GROUP BY c.text_hash",
            [*part, *extra]))
    return out


def shared_text_counts(db: sqlite3.Connection, chunk_ids: Iterable[int],
                       at_least: int = 1, cap: int = 256) -> dict[int, int]:
    """chunk id -> how many files of its source hold a chunk of its text (as read) (1: its own
    file only), counted up to `cap`, for the chunks whose text at least `at_least` files hold.
    Chunk ids of no row are left out. Each text is counted once, however many of the chunks
    hold it, and no further than `cap` files: a text in every copy of a large corpus (a
    licence footer in 35,000 files) cost half a second a search counted in full."""
    by_text: dict[tuple[str, str], list[int]] = {}
    # A text fewer than at_least chunks hold is in fewer files: left out in the same statement
    # (an index probe a chunk, stopped at the at_least-th), so that the count below runs only
    # for the few texts that repeat, not once for each of a search's ~150 candidates
    repeated = ("" if at_least <= 1 else
                " AND (SELECT COUNT(*) FROM (SELECT 1 FROM chunks d WHERE d.text_hash = "
                f"c.text_hash LIMIT {int(at_least)})) >= {int(at_least)}")
    for part, q in in_batches(indexed(dict.fromkeys(chunk_ids))):
        for cid, h, source in db.execute(
                f"SELECT c.id, c.text_hash, f.source FROM chunks c JOIN files f ON "
                f"f.id = c.file_id WHERE c.id IN ({q}){repeated}", part):
            by_text.setdefault((h, source), []).append(cid)
    out: dict[int, int] = {}
    for (h, source), cids in by_text.items():
        n = db.execute(
            "SELECT COUNT(DISTINCT file_id) FROM (SELECT c.file_id FROM chunks c JOIN files f "
            "ON f.id = c.file_id WHERE c.text_hash = ? AND f.source = ? LIMIT ?)",
            (h, source, cap)).fetchone()[0]
        if n >= at_least:
            out.update((c, n) for c in cids)
    return out
