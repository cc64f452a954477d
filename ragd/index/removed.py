"""Sources the config no longer names: their rows set aside, and put back when one is added again.

Part of the Indexer (a mixin it is made of): these run as jobs on the indexer thread, on its
connection, and use its state (cfg, stats, unconfigured, _stop) and its commit (_commit,
_abort, _tracking).
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import Future

from ragd.index import store

log = logging.getLogger("ragd.indexer")


class RemovedSources:
    def purge(self) -> Future:
        """Set aside the rows of every source the config does not name (a source removed or
        renamed): its files and chunks leave the index (and FTS, the vectors) for
        removed_files, in batches, where they wait out the GC grace period. Added back
        under its name within it, the source is restored as it was (restore): a config saved
        empty or cut short loses nothing. Its vectors stay cached as long, so adding the
        folder again under another name embeds nothing either."""
        return self.run_job(self._purge)

    def _purge(self, db) -> int:
        keep = {s.name for s in self.cfg.sources}
        present = store.sources_present(db)
        self.unconfigured = present - keep
        removed = 0
        for name in sorted(self.unconfigured):
            t0 = time.monotonic()
            n = 0
            with store.transaction(db, self._stop):
                store.note_removed(db, name, store.reading(db).get(name), time.time())
            while True:
                ids = store.source_file_ids(db, name, 500)
                if not ids:
                    break
                changes = store.Changes() if self._tracking else None
                store.begin(db, self._stop)
                try:
                    store.set_aside(db, name, ids, changes)
                    self._commit(changes)
                except BaseException:
                    self._abort()
                    raise
                n += len(ids)
            store.forget_counts(db, name)
            self.stats.per_source.pop(name, None)
            log.info("source %s is no longer configured: %d files set aside (%.1fs), kept for "
                     "the GC grace period with their embeddings: added back under this name, "
                     "it is restored as it was", name, n, time.monotonic() - t0)
            removed += n
        self.unconfigured = set()
        return removed

    def restore(self, names: list[str]) -> Future:
        """Put back the set-aside rows of these sources (configured again: a removal undone)
        before they are scanned (a job runs before queued scans): their files as they were
        indexed, chunks and vectors (from the cache) included; the scan then reads what
        changed meanwhile. The future holds {name: files restored}."""
        return self.run_job(functools.partial(self._restore, names=list(names)))

    def _restore(self, db, names: list[str]) -> dict[str, int]:
        out = {}
        waiting = store.removed_sources(db)
        for name in names:
            if name not in waiting or self.cfg.source(name) is None:
                continue
            t0 = time.monotonic()
            n = 0
            while True:
                changes = store.Changes() if self._tracking else None
                store.begin(db, self._stop)
                try:
                    done = store.restore(db, name, 500, changes)
                    if not done:
                        store.forget_removed(db, name)
                    self._commit(changes)
                except BaseException:
                    self._abort()
                    raise
                n += done
                if not done:
                    break
            out[name] = n
            log.info("source %s is configured again: %d files restored as they were (%.1fs); "
                     "a scan reads what changed since", name, n, time.monotonic() - t0)
        return out
