"""Watching sources (watchdog: inotify on Linux) and turning events into indexer work.

Events are coalesced per path over a quiet window (``watch.quiet_ms``, 250 ms): an editor's save
burst (write a temp file, rename it over the note, chmod) becomes one update of the note. A file
moved or renamed becomes a move for the indexer, which keeps its chunks and vectors (nothing is
embedded); a folder moved becomes a move of each file under it. When the watcher cannot follow
(the queue overflows, or inotify runs out of watches) it falls back to a reconciliation scan of
the source, and a periodic scan (``watch.scan_interval``) catches whatever was missed anyway.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from ragd.config import Source
from ragd.ingest.sources import Rules

log = logging.getLogger("ragd.watcher")

MAX_PENDING = 20000  # more distinct paths than this waiting: rescan the source instead
INOTIFY_HINT = ("raise the inotify watch limit, e.g. `sudo sysctl fs.inotify.max_user_watches="
                "524288` (and add it to /etc/sysctl.conf)")


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: "Watcher", source: Source):
        self.watcher = watcher
        self.source = source

    def dispatch(self, event: FileSystemEvent) -> None:
        try:
            self.watcher.on_event(self.source, event)
        except Exception:  # an odd event must not stop the observer thread
            log.exception("watch event %r", event)


class Watcher:
    def __init__(self, sources: list[Source], indexer, quiet: float = 0.25,
                 scan_interval: float = 600.0):
        self.sources = sources
        self.indexer = indexer
        self.quiet = quiet
        self.scan_interval = scan_interval
        self.rules = {s.name: Rules(s) for s in sources}
        self.observer = Observer()
        self.errors: dict[str, str] = {}  # source -> why it is not watched (periodic scans only)
        self.last_event: dict[str, float] = {}
        self._due: dict[tuple[str, str], float] = {}  # (source, rel) -> time it settles
        self._seen: dict[tuple[str, str], float] = {}  # (source, rel) -> first event (wall time)
        self._moves: list[tuple[float, str, str, str]] = []  # (due, source, old rel, new rel)
        self._lock = threading.Lock()
        self._inflight = 0  # taken off the queues, not yet handed to the indexer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)

    def start(self) -> None:
        for s in self.sources:
            try:
                self.observer.schedule(_Handler(self, s), str(s.root), recursive=True)
            except OSError as e:
                self._unwatched(s, e)
        try:
            self.observer.start()
        except OSError as e:
            for s in self.sources:
                self._unwatched(s, e)
        self._thread.start()

    def _unwatched(self, s: Source, e: OSError) -> None:
        if e.errno == errno.ENOSPC:
            why = f"inotify watch limit reached: {INOTIFY_HINT}; falling back to periodic scans"
        else:
            why = f"cannot watch {s.root}: {e}; falling back to periodic scans"
        self.errors[s.name] = why
        log.warning("source %s: %s", s.name, why)

    def stop(self) -> None:
        self._stop.set()
        try:
            self.observer.stop()
            self.observer.join(5)
        except RuntimeError:
            pass
        self._thread.join(5)

    # -- events (observer threads) ---------------------------------------------------------------

    def _rel(self, s: Source, path) -> str | None:
        path = os.fsdecode(path)
        try:
            rel = Path(path).relative_to(s.root).as_posix()
        except ValueError:
            return None
        return rel if rel != "." else None

    def on_event(self, s: Source, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        now = time.monotonic()
        self.last_event[s.name] = time.time()
        rules = self.rules[s.name]
        if os.fsdecode(event.src_path) == str(s.root):
            return
        if event.event_type == "moved":
            old, new = self._rel(s, event.src_path), self._rel(s, event.dest_path)
            if event.is_directory:
                self._dir_moved(s, old, new, now)
                return
            old_ok = old is not None and rules.wanted(old)
            new_ok = new is not None and rules.wanted(new)
            with self._lock:
                if old_ok and new_ok:
                    self._moves.append((now + self.quiet, s.name, old, new))
                    return
                for rel, ok in ((old, old_ok), (new, new_ok)):
                    if ok:
                        self._due[(s.name, rel)] = now + self.quiet
            return
        rel = self._rel(s, event.src_path)
        if rel is None:
            return
        if event.is_directory:
            if event.event_type == "deleted":
                self.indexer.request_scan(s.name)  # whatever was under it is gone
            elif event.event_type == "created":
                self._walk(s, rel, now)  # files may have arrived before the watch did
            return
        if rules.wanted(rel):
            with self._lock:
                self._due[(s.name, rel)] = now + self.quiet
                self._seen.setdefault((s.name, rel), time.time())
                overflow = len(self._due) > MAX_PENDING
            if overflow:
                self._overflow(s)

    def _dir_moved(self, s: Source, old: str | None, new: str | None, now: float) -> None:
        if new is None:  # moved out of the source: like a deletion
            self.indexer.request_scan(s.name)
            return
        rules = self.rules[s.name]
        root = s.root / new
        with self._lock:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                for f in filenames:
                    rel_new = (Path(dirpath) / f).relative_to(s.root).as_posix()
                    if not rules.wanted(rel_new):
                        continue
                    if old is not None:
                        rel_old = old + rel_new[len(new):]
                        self._moves.append((now + self.quiet, s.name, rel_old, rel_new))
                    else:
                        self._due[(s.name, rel_new)] = now + self.quiet

    def _walk(self, s: Source, rel_dir: str, now: float) -> None:
        rules = self.rules[s.name]
        with self._lock:
            for dirpath, dirnames, filenames in os.walk(s.root / rel_dir):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                for f in filenames:
                    rel = (Path(dirpath) / f).relative_to(s.root).as_posix()
                    if rules.wanted(rel):
                        self._due[(s.name, rel)] = now + self.quiet

    def _overflow(self, s: Source) -> None:
        log.warning("source %s: more than %d changed paths waiting; reconciling with a scan",
                    s.name, MAX_PENDING)
        with self._lock:
            self._due = {k: v for k, v in self._due.items() if k[0] != s.name}
        self.indexer.request_scan(s.name)

    # -- the flusher ------------------------------------------------------------------------------

    def _run(self) -> None:
        next_scan = time.monotonic() + self.scan_interval
        while not self._stop.wait(min(0.05, self.quiet / 2)):
            now = time.monotonic()
            with self._lock:
                moves = [m for m in self._moves if m[0] <= now]
                self._moves = [m for m in self._moves if m[0] > now]
                ready = [k for k, due in self._due.items() if due <= now]
                for k in ready:
                    del self._due[k]
                self._inflight = len(moves) + len(ready)
            for _, name, old, new in moves:
                self.indexer.request_move(name, old, new)
            for key in ready:
                with self._lock:
                    since = self._seen.pop(key, None)
                self.indexer.request_path(*key, since=since)
            with self._lock:
                self._inflight = 0
            if now >= next_scan:
                self.indexer.request_scan()
                next_scan = now + self.scan_interval

    def oldest_pending(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with self._lock:
            for (source, _), t in self._seen.items():
                out[source] = min(out.get(source, t), t)
        return out

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._due) + len(self._moves) + self._inflight
