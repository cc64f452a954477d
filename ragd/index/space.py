"""One vector space: an embedding model's matrix of chunk vectors, and the queue of texts that
still lack one (vectorstore.py keeps the spaces; the embedders drain their queues).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict

from ragd.engines.models import ResolvedModel
from ragd.index.ann import AnnIndex
from ragd.index.vectors import VectorIndex

# A note's first texts queued in its turn; those past them wait until every note's first ones
# are in (Space.rest). Most recently modified first, a long note last touched (a log, an
# export) would hold the queue before any other note had a vector; this way it is found by
# its opening meanwhile, and by the rest of it once every note has its own.
HEAD_TEXTS = 16


class Space:
    """One vector space: its matrix, and the queue of texts still without a vector."""

    def __init__(self, space_id: int, model: ResolvedModel, vectors: VectorIndex):
        self.id = space_id
        self.model = model
        self.vectors = vectors
        self.note: str | None = None  # e.g. "the embedding model changed"
        # the registry model a GGUF given by path was recognised as (models.recognise)
        self.recognised = None
        self.cv = threading.Condition()
        self.todo: OrderedDict[str, None] = OrderedDict()  # text hashes without a vector
        # ... and those of long notes past their first HEAD_TEXTS: taken once todo is empty
        self.rest: OrderedDict[str, None] = OrderedDict()
        self.retry: list[tuple[float, str]] = []  # (when, text hash): refused, try again
        # the queued first texts of the notes that have a rest: a rest text is as long as the
        # first ones of its note, so their token counts, once embedded, estimate the rest's
        # (EmbedStats.time_left)
        self.samples: set[str] = set()
        # Hashes taken off the queue, not yet stored. One may be queued again meanwhile (the
        # same text committed by another file): it is counted once, and leaves the queue
        # when it is stored (see stored).
        self.inflight: set[str] = set()
        self.changed_at = 0.0  # monotonic time the matrix last changed (for snapshots)
        self.saved_at = 0.0
        self.ann_ops: list | None = None  # while a graph is built: changes to replay on it

    # the queue ------------------------------------------------------------------------------------

    def searched_by(self) -> str:
        """How its vectors are searched: "exact", "hnsw", "exact (building hnsw)", or
        "milvus" (the store backend holds them: keysonly.py)."""
        if self.vectors.remote:
            return "milvus"
        if isinstance(self.vectors, AnnIndex):
            return "hnsw"
        return "exact (building hnsw)" if self.ann_ops is not None else "exact"

    def pending(self) -> int:
        with self.cv:
            return (len(self.todo) + len(self.rest) + len(self.retry)
                    + sum(1 for h in self.inflight if h not in self.todo and h not in self.rest))

    def pending_split(self) -> tuple[int, int]:
        """pending(), as (the queue's texts, long notes' texts past their first: rest)."""
        with self.cv:
            return self.pending() - len(self.rest), len(self.rest)

    def busy(self) -> bool:  # with self.cv held
        return bool(self.todo or self.rest or self.retry or self.inflight)

    def idle(self) -> bool:
        with self.cv:
            return not self.busy()

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.busy():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    def queue(self, hashes, first: bool = False, rest=frozenset(), samples=frozenset()) -> None:
        """Texts to embed, at the back of the queue; `first`: at its front (an edit's, while a
        backlog is embedded: it waits for the batch in the engine's hands, not the backlog).
        Those in `rest` (long notes' texts past their first HEAD_TEXTS) go to the back of the
        rest, unless first, or queued before them; `samples`: the first texts of their notes."""
        with self.cv:
            hashes = list(hashes)
            self.samples.update(h for h in hashes if h in samples)
            for h in hashes:
                if h in rest and not first and h not in self.todo:
                    self.rest[h] = None
                else:
                    self.todo[h] = None
                    self.rest.pop(h, None)
            if first:
                for h in reversed(hashes):
                    self.todo.move_to_end(h, last=False)
            self.cv.notify_all()

    def take(self, n: int, stop: threading.Event, idle: float | None = None) -> list[str]:
        """The next hashes to embed; sleeps (no polling) while there are none, at most `idle`
        seconds (then []: None waits for work)."""
        until = None if idle is None else time.monotonic() + idle
        with self.cv:
            while not stop.is_set():
                now = time.time()
                while self.retry and self.retry[0][0] <= now:
                    self.todo[heapq.heappop(self.retry)[1]] = None
                if self.todo or self.rest:
                    break
                self.cv.notify_all()  # wait_idle
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    return []
                wait = self.retry[0][0] - now if self.retry else None
                self.cv.wait(left if wait is None else wait if left is None else min(wait, left))
            out = []
            while (self.todo or self.rest) and len(out) < n:
                out.append((self.todo or self.rest).popitem(last=False)[0])
            self.inflight.update(out)
            return out

    def sampled(self, batch: list) -> tuple[int, int]:
        """(texts, tokens) of an embedded batch's ((hash, text, tokens, truncated)) samples:
        counted once."""
        with self.cv:
            if not self.samples:
                return 0, 0
            got = [(h, n) for h, _, n, _ in batch if h in self.samples]
            self.samples.difference_update(h for h, _ in got)
            return len(got), sum(n for _, n in got)

    def give_back(self, hashes: list[str]) -> None:
        """Hashes taken but not stored (the engine went away): to the front of the queue."""
        with self.cv:
            for h in reversed(hashes):
                self.todo[h] = None
                self.todo.move_to_end(h, last=False)
            self.cv.notify_all()

    def stored(self, hashes) -> None:
        """These texts have their vectors (in the cache and the matrix): no longer counted as
        waiting, nor queued again (another file's commit queued a text while it was embedded;
        a chunk committed since is given the vector by to_matrix or the commit's cache look)."""
        with self.cv:
            for h in hashes:
                self.inflight.discard(h)
                self.todo.pop(h, None)
                self.rest.pop(h, None)
            self.cv.notify_all()

    def done(self, hashes: list[str]) -> None:
        with self.cv:
            self.inflight.difference_update(hashes)
            self.cv.notify_all()

    def queued(self, hashes: set[str]) -> set[str]:
        """Those of these hashes waiting in the queue or being embedded now."""
        with self.cv:
            out = {h for h in hashes if h in self.todo or h in self.rest or h in self.inflight}
            out.update(h for _, h in self.retry if h in hashes)
            return out

    def forget(self, hashes: set[str]) -> None:
        """Texts no chunk has any more, out of the queue: what is left to embed (status'
        pending_texts and its ETA) no longer counts them, nor those being embedded now (which
        the embedder drops if it has not read their text yet)."""
        if not hashes:
            return
        with self.cv:
            for h in hashes:
                self.todo.pop(h, None)
                self.rest.pop(h, None)
            self.inflight.difference_update(hashes)  # (still embedded, the vectors kept)
            self.samples.difference_update(hashes)
            if any(h in hashes for _, h in self.retry):
                self.retry = [r for r in self.retry if r[1] not in hashes]
                heapq.heapify(self.retry)
            self.cv.notify_all()  # wait_idle: it may be idle now

    def later(self, when: float, h: str) -> None:
        with self.cv:
            heapq.heappush(self.retry, (when, h))
            self.cv.notify_all()

    def wake(self) -> None:
        with self.cv:
            self.cv.notify_all()
