"""The write of one file (or one move) inside its batch's transaction, in a savepoint of its own.

Part of the Indexer (a mixin it is made of): runs on the indexer thread, inside the
transaction _write began, and uses its state (cfg, stats, _db, listener) and its _emit,
_records and source_state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ragd.config import Source
from ragd.index import store
from ragd.ingest import chunker, loader, sources

log = logging.getLogger("ragd.indexer")


@dataclass
class Prepared:
    """A path read and chunked (or found unreadable) before its transaction.

    kind: "index" (content + records), "unchanged" (content), "skipped" (reason: not
    indexable), "vanished" (its name does not exist), "failed" (reason: an unexpected error).
    """
    kind: str
    content: loader.Loaded | None = None
    records: list[store.ChunkRecord] | None = None
    vectors: tuple[int, list] | None = None  # (space, rows) for the listener's put_vectors
    reason: str | None = None
    stat: tuple[int, int] = (-1, 0)
    retry: bool = False  # skipped for an error of access, not of the content: try again


@dataclass
class Item:
    """One unit of a batch: a path (source, rel, force) or a move (source, old, new)."""
    source: str
    rel: str
    force: bool = False
    old: str | None = None  # set for a move: old -> rel
    prepared: Prepared | None = None
    old_prepared: Prepared | None = None


class Writes:
    def _apply(self, item: Item, changes: store.Changes | None) -> None:
        """Write one item in a savepoint of its own: an error of its own is recorded against
        the file and the batch goes on; an error of the database is raised (the batch rolls
        back and is retried)."""
        src = self._source(item.source)
        if src is None or item.prepared.kind == "dropped":
            return
        db = self._db
        mine = store.Changes() if changes is not None else None
        db.execute("SAVEPOINT item")
        try:
            if item.old is not None:
                self._move_one(src, item, mine)
            else:
                self._index_one(src, item.rel, item.prepared, mine)
            db.execute("RELEASE item")
        except Exception as e:
            # An error of the database itself (disk full, I/O) may have rolled the whole
            # transaction back already: the batch is retried, not this file recorded.
            if store.transient(e) or not db.in_transaction:
                raise
            db.execute("ROLLBACK TO item")
            db.execute("RELEASE item")
            log.exception("failed to index %s/%s", src.name, sources.printable(item.rel))
            self._record_failed(src, item.rel, f"{type(e).__name__}: {e}", mine)
        if changes is not None:
            changes.extend(mine)

    def _record_failed(self, src: Source, rel: str, reason: str,
                       changes: store.Changes | None) -> None:
        db = self._db
        size, mtime_ns = sources.stat_of(src.root / rel)
        mine = store.Changes() if changes is not None else None
        db.execute("SAVEPOINT failed")
        try:
            store.put_file(db, src.name, rel, size, mtime_ns, None, "failed", reason, [], mine)
            db.execute("RELEASE failed")
        except Exception as e:
            if store.transient(e) or not db.in_transaction:
                raise
            db.execute("ROLLBACK TO failed")
            db.execute("RELEASE failed")
            log.exception("cannot record %s/%s as failed; it is left out",
                          src.name, sources.printable(rel))
            return
        if changes is not None:
            changes.extend(mine)
        self.stats.files_failed += 1
        self.source_state(src.name).last_error = f"{sources.printable(rel)}: {reason}"
        self._emit("failed", src.name, rel, reason=reason)

    def _move_one(self, src: Source, item: Item, changes: store.Changes | None) -> None:
        """item.old was renamed or moved to item.rel. If the content is the same, the file row
        and its chunks move with it (ids, embed hashes and so vectors unchanged: nothing is
        embedded); only the heading path and keywords are refreshed. Otherwise: index the new
        path, and forget the old one if it is gone."""
        db = self._db
        old, new, p = item.old, item.rel, item.prepared
        row = store.file_row(db, src.name, old)
        if row is not None and row["status"] == "indexed" and p.content is not None \
                and p.content.hash == row["hash"]:
            pieces = chunker.chunk_doc(p.content.doc, self.cfg.chunk_tokens,
                                       self.cfg.chunk_overlap)
            olds = store.chunk_bodies(db, row["id"])
            if _same_chunks(olds, pieces):
                target = store.file_row(db, src.name, new)
                if target is not None and target["id"] != row["id"]:  # moved over a file
                    store.delete_file(db, target["id"], changes)
                store.move_file(db, row["id"], new, p.content.size, p.content.mtime_ns,
                                json.dumps(p.content.doc.meta(), ensure_ascii=False))
                store.set_headings(db, [(q.heading, q.keywords, o["id"])
                                        for o, q in zip(olds, pieces)])
                self.stats.files_moved += 1
                self._emit("moved", src.name, new,
                           from_path=sources.printable(str(src.root / old)))
                return
        if row is None and p.content is not None:
            target = store.file_row(db, src.name, new)
            if target is not None and target["status"] == "indexed" \
                    and target["hash"] == p.content.hash:
                return  # this move was applied already (its item read before that)
        if p.kind == "unchanged" and row is not None:
            # unchanged against a row already at the new path, while the old row is there
            # too: indexed afresh. (No old row: this move was applied already; nothing to do.)
            p = Prepared("index", p.content, self._records(p.content))
        self._index_one(src, new, p, changes)
        self._index_one(src, old, item.old_prepared, changes)  # removed if it is gone

    def _index_one(self, src: Source, rel: str, p: Prepared,
                   changes: store.Changes | None) -> None:
        # The stat stored is the one the content was read with: a file that changed again
        # since is read again at its next event or scan.
        db = self._db
        row = store.file_row(db, src.name, rel)
        if p.kind == "vanished":
            if row is not None and not src.root.is_dir():
                # Its source's folder is gone: moved away (inotify still reports what happens
                # in it, under the old path) or unmounted. Not a sign that the file is gone:
                # kept, and the scan says why.
                self.request_scan(src.name)
                return
            if row is not None:
                store.delete_file(db, row["id"], changes)
                self.stats.files_removed += 1
                self._emit("removed", src.name, rel)
            return
        if p.kind == "skipped" and p.retry and row is not None and row["status"] == "indexed":
            # It could not be read just now (permission, I/O, a helper program): what was
            # indexed stays searchable; the next change or scan tries again.
            why = f"kept from an earlier read; reading it now failed: {p.reason}"
            if row["reason"] != why:  # (said once, not at each retry)
                store.set_reason(db, row["id"], why)
                log.info("%s/%s could not be read (%s); keeping what was indexed", src.name,
                         sources.printable(rel), p.reason)
            self._emit("skipped", src.name, rel, reason=p.reason, kept=True)
            return
        if p.kind in ("skipped", "failed"):
            size, mtime_ns = p.stat
            store.put_file(db, src.name, rel, size, mtime_ns, None, p.kind, p.reason, [],
                           changes)
            if p.kind == "skipped":
                self.stats.files_skipped += 1
                if row is None or (row["status"], row["reason"]) != ("skipped", p.reason):
                    # (a file tried again, a permission still missing: said once)
                    log.info("skipped %s/%s: %s", src.name, sources.printable(rel), p.reason)
            else:
                self.stats.files_failed += 1
                self.source_state(src.name).last_error = f"{sources.printable(rel)}: {p.reason}"
            self._emit(p.kind, src.name, rel, reason=p.reason)
            return
        content = p.content
        if p.kind == "unchanged":
            if row is not None:
                store.touch_file(db, row["id"], content.size, content.mtime_ns)
            self.stats.files_unchanged += 1
            return
        doc = content.doc
        records = p.records if p.records is not None else self._records(content)
        embedded = None
        if p.vectors is not None:
            self.listener.put_vectors(db, *p.vectors)  # in this transaction
            embedded = len(p.vectors[1])
        meta = json.dumps(doc.meta(), ensure_ascii=False)
        same = row is not None and store.same_chunks(db, row["id"], records, meta)
        store.put_file(db, src.name, rel, content.size, content.mtime_ns, content.hash,
                       "indexed", "; ".join(doc.warnings) or None, None if same else records,
                       changes, meta=meta)
        self.stats.files_indexed += 1
        if not same:
            self.stats.chunks_written += len(records)
        if embedded is None:
            self._emit("indexed", src.name, rel, chunks=len(records))
        else:  # its vectors committed with it
            self._emit("indexed", src.name, rel, chunks=len(records), embedded=embedded)


def _same_chunks(old: list, new: list) -> bool:
    return len(old) == len(new) and all(
        (o["body"], o["line_start"], o["line_end"]) == (n.body, n.line_start, n.line_end)
        for o, n in zip(old, new))
