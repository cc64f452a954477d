"""File events turned into indexer work: the flusher (``watch-flusher``).

Events are coalesced per path over a quiet window (``watch.quiet_ms``, 250 ms): an editor's save
burst (write a temp file, rename it over the note, chmod) becomes one update of the note. A file
moved or renamed becomes a move for the indexer, which keeps its chunks and vectors (nothing is
embedded); a folder moved becomes a move of each file under it. An edit of a source's own rules
(.ragignore, a vault's excluded files) is read again, and the source scanned with them.

Where events cannot be trusted to tell everything, a scan of the source reconciles instead:
more than ``MAX_PENDING`` paths waiting at once, and a storm (a ``git checkout``, a sync tool
dumping a folder) that races folder creation against watch creation: once a burst of at least
``STORM_PATHS`` changed paths has settled, its source is scanned (which reads only files whose
size or mtime differ from the index). Watching itself (the observer, lost watches, folders
moved away, queue overflows): watcher.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEvent

from ragd.config import Source
from ragd.ingest.sources import Rules
from ragd.workers import Worker

log = logging.getLogger("ragd.watcher")

# watchdog holds a file's moved-from event this long for its moved-to pair (0.5 s), plus margin
MOVE_PAIRING = 0.7
MAX_PENDING = 20000  # more distinct paths than this waiting: rescan the source instead
STORM_PATHS = 200  # a settled burst of this many paths is followed by a scan of its source

# The files holding a source's own rules (sources.Rules), relative to its root.
RULE_FILES = (".ragignore", ".obsidian/app.json")


class Changes:
    """The coalescing queues and the flusher thread that drains them (it sleeps until the
    soonest path settles). Fed by watchdog's threads (on_event). The watcher's checker is told
    of new folders (`recheck`: did they get their watch?) and of the sources each flush
    touched (`flushed`: is their folder still there?)."""

    def __init__(self, sources: list[Source], indexer, quiet: float,
                 recheck: Callable[[float], None], flushed: Callable[[set], None]):
        self.indexer = indexer
        self.quiet = quiet
        self.rules = {s.name: Rules(s) for s in sources}
        self._recheck = recheck
        self._flushed = flushed
        self._burst: dict[str, int] = {}  # source -> paths flushed in its current burst
        self.last_event: dict[str, float] = {}
        # The flusher's queues, under _lock (a Condition: an event wakes the flusher).
        self._lock = threading.Condition()
        self._due: dict[tuple[str, str], float] = {}  # (source, rel) -> time it settles
        self._seen: dict[tuple[str, str], float] = {}  # (source, rel) -> first event (wall time)
        # (source, old rel, new rel) -> due, in the order told. A folder's move is told once for
        # the folder and once for each file and subfolder under it (watchdog): one entry each.
        self._moves: dict[tuple[str, str, str], float] = {}
        self._inflight = 0  # taken off the queues, not yet handed to the indexer
        self._folder_made_at = -1e9  # monotonic time of the last folder created (see below)
        self._heard = 0  # events heard so far, under _lock (wait_heard)
        self._stop = threading.Event()
        self.flusher = Worker("watch-flusher", self._flush_loop)

    def start(self) -> None:
        self.flusher.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self.flusher.stop(timeout)

    def add_source(self, s: Source) -> None:
        self.rules[s.name] = Rules(s)

    def remove_source(self, name: str) -> None:
        """A source a reload removed: its events are ignored, and what waited for it dropped."""
        self.rules.pop(name, None)
        with self._lock:
            self._due = {k: v for k, v in self._due.items() if k[0] != name}
            self._seen = {k: v for k, v in self._seen.items() if k[0] != name}
            self._moves = {m: due for m, due in self._moves.items() if m[0] != name}
            self._lock.notify_all()

    # -- events (observer threads) ---------------------------------------------------------------

    def _rel(self, s: Source, path) -> str | None:
        path = os.fsdecode(path)
        try:
            rel = Path(path).relative_to(s.root).as_posix()
        except ValueError:
            return None
        return rel if rel != "." else None

    def _settle(self, keys: list[tuple[str, str]], now: float) -> None:
        """These paths changed: each is handed to the indexer once quiet for `quiet`."""
        if not keys:
            return
        with self._lock:
            wall = time.time()
            for key in keys:
                self._due[key] = now + self.quiet
                self._seen.setdefault(key, wall)
            overflow = len(self._due) > MAX_PENDING
            self._lock.notify_all()
        if overflow:
            for name in {k[0] for k in keys}:
                self._overflow(name)

    def on_event(self, s: Source, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        now = time.monotonic()
        rules = self.rules.get(s.name)
        if rules is None:
            return  # a source a reload just removed
        self.last_event[s.name] = time.time()
        with self._lock:
            self._heard += 1
            self._lock.notify_all()
        if self._rules_edited(s, event, rules):
            return
        if os.fsdecode(event.src_path) == str(s.root):
            return
        if event.event_type == "moved":
            old, new = self._rel(s, event.src_path), self._rel(s, event.dest_path)
            if event.is_directory:
                self._dir_moved(s, old, new, now)
                self._recheck(1.0)
                return
            old_ok = old is not None and rules.wanted(old)
            new_ok = new is not None and rules.wanted(new)
            if old_ok and new_ok:
                with self._lock:
                    self._add_move((s.name, old, new), now)
                    self._lock.notify_all()
                return
            self._settle([(s.name, rel) for rel, ok in ((old, old_ok), (new, new_ok)) if ok],
                         now)
            return
        rel = self._rel(s, event.src_path)
        if rel is None:
            return
        if event.is_directory:
            if event.event_type == "deleted":
                self.indexer.request_scan(s.name)  # whatever was under it is gone
            elif event.event_type == "created":
                with self._lock:
                    self._folder_made_at = now
                self._walk(s, rel, now)  # files may have arrived before the watch did
                self._recheck(1.0)
            return
        if rules.wanted(rel):
            self._settle([(s.name, rel)], now)

    def _rules_edited(self, s: Source, event: FileSystemEvent, rules: Rules) -> bool:
        """Is this an edit of the source's own rules — its .ragignore, a vault's Excluded files
        (.obsidian/app.json)? They are read again, and when they changed the source is scanned
        with them: files now left out leave the index, files let in enter it. (They were read
        at start only: a pattern added to .ragignore changed nothing until a restart, and a
        'ragctl reindex' that applied it was undone by the next save.)"""
        paths = [event.src_path] + ([event.dest_path] if event.event_type == "moved" else [])
        if not any(self._rel(s, p) in RULE_FILES for p in paths):
            return False
        fresh = Rules(s)
        if fresh.ignore != rules.ignore:
            self.rules[s.name] = fresh
            log.info("source %s: its ignore rules changed; scanning it with them", s.name)
            self.indexer.request_scan(s.name)
        return True

    def _files_under(self, s: Source, rel_dir: str) -> list[str]:
        """Wanted files under a folder of the source (walked without holding any lock)."""
        rules = self.rules[s.name]
        out = []
        for dirpath, dirnames, filenames in os.walk(s.root / rel_dir):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for f in filenames:
                rel = (Path(dirpath) / f).relative_to(s.root).as_posix()
                if rules.wanted(rel):
                    out.append(rel)
        return out

    def _dir_moved(self, s: Source, old: str | None, new: str | None, now: float) -> None:
        if new is None:  # moved out of the source: like a deletion
            self.indexer.request_scan(s.name)
            return
        files = self._files_under(s, new)
        if old is None:  # moved in from outside: new files
            self._settle([(s.name, rel) for rel in files], now)
            return
        with self._lock:
            for rel_new in files:
                self._add_move((s.name, old + rel_new[len(new):], rel_new), now)
            self._lock.notify_all()

    def _add_move(self, move: tuple[str, str, str], now: float) -> None:
        """A move waits once however often it is told; told again, it goes last (a folder moved
        A -> B -> A -> B in one quiet period is applied in that order). Under self._lock."""
        self._moves.pop(move, None)
        self._moves[move] = now + self.quiet

    def _walk(self, s: Source, rel_dir: str, now: float) -> None:
        self._settle([(s.name, rel) for rel in self._files_under(s, rel_dir)], now)


    def _overflow(self, name: str) -> None:
        """Too many paths wait: drop them for a scan of the source, which finds them all."""
        log.warning("source %s: more than %d changed paths waiting; reconciling with a scan",
                    name, MAX_PENDING)
        with self._lock:
            self._due = {k: v for k, v in self._due.items() if k[0] != name}
            # What the scan will index is the indexer's to count from now on.
            self._seen = {k: v for k, v in self._seen.items() if k[0] != name}
        self.indexer.request_scan(name)

    # -- the flusher ------------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._inflight = 0
                self._lock.notify_all()  # wait_settled
                now = time.monotonic()
                nexts = [*self._due.values(), *self._moves.values()]
                soonest = min(nexts) if nexts else None
                if soonest is None or soonest > now:
                    self._lock.wait(None if soonest is None else soonest - now)
                    continue
                moves = [m for m, due in self._moves.items() if due <= now]
                self._moves = {m: due for m, due in self._moves.items() if due > now}
                ready = [k for k, due in self._due.items() if due <= now]
                for k in ready:
                    del self._due[k]
                self._inflight = len(moves) + len(ready)
            for name, old, new in moves:
                self.indexer.request_move(name, old, new)
            for key in ready:
                with self._lock:
                    since = self._seen.pop(key, None)
                self.indexer.request_path(*key, since=since)
            self._after_bursts(moves, ready)
            self._flushed({m[0] for m in moves} | {k[0] for k in ready})

    def _after_bursts(self, moves: list, ready: list) -> None:
        """Count each source's burst of changes; when a big one has settled (nothing of that
        source waits any more), reconcile the source with a scan: in a storm, files can land in
        a new folder between its creation and its watch, and a scan is cheap next to a loss."""
        for name, _, _ in moves:
            self._burst[name] = self._burst.get(name, 0) + 1
        for name, _ in ready:
            self._burst[name] = self._burst.get(name, 0) + 1
        if not self._burst:
            return
        with self._lock:
            busy = {k[0] for k in self._due} | {m[0] for m in self._moves}
        for name in [n for n in self._burst if n not in busy]:
            if self._burst.pop(name) >= STORM_PATHS:
                log.info("source %s: a burst of changes settled; reconciling with a scan", name)
                self.indexer.request_scan(name)

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

    def wait_heard(self, timeout: float) -> bool:
        """Wait until the watcher hears an event (at most timeout s): inotify delivers within
        milliseconds, so an edit made just before a search --wait is heard by then. Returns
        whether one was."""
        deadline = time.monotonic() + timeout
        with self._lock:
            seen = self._heard
            while self._heard == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def wait_settled(self, timeout: float) -> bool:
        """Wait until no event waits to be handed to the indexer.

        Right after a folder is created, also until MOVE_PAIRING has passed: `mkdir X && mv
        note X/` moves the note into a folder watched a moment later, so the kernel reports only
        its leaving, and watchdog holds that event 0.5 s for a pair that never comes. Without
        this, search --wait answered with the note at both paths (found in the new folder by
        its walk, not yet gone from the old)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                now = time.monotonic()
                busy = self._due or self._moves or self._inflight
                pairing = self._folder_made_at + MOVE_PAIRING - now
                if not busy and pairing <= 0:
                    return True
                left = deadline - now
                if left <= 0:
                    return False
                self._lock.wait(left if busy else min(left, pairing))
