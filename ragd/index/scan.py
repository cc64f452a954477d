"""The scan of a source: what is on disk against the files table, and what a listing shows gone.

Part of the Indexer (a mixin it is made of): runs on the indexer thread and uses its state
(cfg, stats, _cv and the queues it fills: _scans, _paths, _moves) and its commit (_commit,
_abort, _emit, _paused, _resumed, call_later, request_scan).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ragd.config import Source
from ragd.index import store
from ragd.ingest import sources

log = logging.getLogger("ragd.indexer")

GONE_RESCAN = 1.0  # a source scanned while folders were deleted is scanned again after this
RESCAN_START = 30.0  # a source with folders that could not be listed is scanned again after this


@dataclass
class SourceState:
    last_scan: float | None = None
    last_error: str | None = None
    scanning: bool = False
    unlisted: dict[str, str] = field(default_factory=dict)  # folder -> why it was not listed
    rescan_delay: float = RESCAN_START


class Scans:
    def _scan(self, name: str, force: bool) -> None:
        state = self.source_state(name)
        try:
            self._scan_source(name, force, state)
        except Exception as e:
            if store.transient(e):
                with self._cv:  # do it again once the database is back
                    self._scans[name] = self._scans.get(name, False) or force
                self._paused(e)
                return
            state.last_error = f"scan failed: {type(e).__name__}: {e}"
            log.exception("scan of source %s failed", name)
        finally:
            with self._cv:
                state.scanning = name in self._scans

    def _scan_source(self, name: str, force: bool, state: SourceState) -> None:
        src = self._source(name)
        if src is None:  # no longer configured
            return
        t0 = time.monotonic()
        if not src.root.is_dir():
            # An unmounted disk or a renamed folder is not "every file deleted".
            missing = f"source folder {src.root} is missing; its files are kept"
            if state.last_error != missing:  # said once, not at each scan while it lasts
                state.last_error = missing
                log.warning("source %s: %s", name, missing)
                if self.events is not None:
                    self.events.publish("error", source=name, message=missing)
            return
        if state.last_error and "is missing" in state.last_error:
            state.last_error = None  # it is back
        known = store.file_stats(self._db, name)
        listing = sources.scan(src)
        on_disk = listing.files
        self._note_unlisted(src, state, listing)
        known_rels = {k[0] for k in known}
        changed = list(on_disk) if force else [s.relpath for s in
                                               set(on_disk.values()).difference(known)]
        # The most recently modified first: people search what they work on, and during a
        # first index the notes indexed (and embedded) first are the ones found first.
        changed.sort(key=lambda rel: -on_disk[rel].mtime_ns)
        # Only what a listing that succeeded shows gone is gone.
        gone = store.file_rows_of(self._db, name, [
            rel for rel in known_rels.difference(on_disk) if listing.covers(rel)])
        gone_rels = set(gone)
        new_rels = [rel for rel in changed if rel not in known_rels]
        if gone_rels and new_rels:  # renamed or moved while we were not watching?
            by_hash = {gone[rel].hash: rel for rel in gone_rels
                       if gone[rel].hash and gone[rel].status == "indexed"}
            for rel in new_rels:
                try:
                    h = sources.read_bytes(src.root / rel, self.cfg.max_file_bytes,
                                           src.root).hash
                except sources.Unreadable:
                    continue
                old = by_hash.pop(h, None)
                if old is not None:
                    gone_rels.discard(old)
                    changed.remove(rel)
                    with self._cv:
                        self._moves.append((name, old, rel))
        if gone_rels:
            changes = store.Changes() if self._tracking else None
            store.begin(self._db, self._stop)
            try:
                for rel in gone_rels:
                    store.delete_file(self._db, gone[rel].id, changes)
                    self._emit("removed", name, rel)
                self._commit(changes)
            except BaseException:
                self._abort()
                raise
            self.stats.files_removed += len(gone_rels)
        with self._cv:
            for rel in changed:
                self._paths[(name, rel)] = self._paths.get((name, rel), False) or force
        self._resumed()
        # the first scan and any that found something are news; a periodic one that found
        # nothing is not (a quiet daemon logs nothing)
        level = (logging.INFO if state.last_scan is None or changed or gone_rels
                 or listing.unlisted else logging.DEBUG)
        state.last_scan = time.time()
        log.log(level, "scan %s: %d files, %d to index, %d removed%s (%.2fs)", name,
                len(on_disk), len(changed), len(gone_rels),
                f", {len(listing.unlisted)} unlisted kept" if listing.unlisted else "",
                time.monotonic() - t0)

    def _note_unlisted(self, src: Source, state: SourceState, listing: sources.Listing) -> None:
        """Folders that could not be listed: their files are kept, the source is flagged, and
        it is scanned again with a backoff until they can be."""
        was = state.unlisted
        state.unlisted = dict(listing.unlisted)
        if not listing.unlisted:
            if was:
                log.info("source %s: every folder can be listed again", src.name)
                if state.last_error and "could not be listed" in state.last_error:
                    state.last_error = None
            state.rescan_delay = RESCAN_START
            return
        n = len(listing.unlisted)
        folders = f"{n} folder{'s' if n != 1 else ''}"
        if not any((src.root / d).exists() for d in listing.unlisted):
            # Folders deleted (or moved away) while the scan walked them: nothing is wrong. Their
            # files are kept until a listing shows them gone: the next scan, in a second.
            state.unlisted = was
            log.info("source %s: %s went away while it was scanned; scanning again",
                     src.name, folders)
            self.call_later(GONE_RESCAN, lambda: self.request_scan(src.name))
            return
        where, why = next(iter(sorted(listing.unlisted.items())))
        state.last_error = (f"{folders} could not be listed, e.g. "
                            f"{sources.printable(where) or src.root}: {why}; the files under "
                            f"them are kept; retrying in {state.rescan_delay:.0f} s")
        if set(listing.unlisted) != set(was):
            log.warning("source %s: %s", src.name, state.last_error)
        self.call_later(state.rescan_delay, lambda: self.request_scan(src.name))
        state.rescan_delay = min(state.rescan_delay * 2, max(RESCAN_START,
                                                             self.cfg.scan_interval))
