"""Approximate nearest neighbours for large spaces: an HNSW graph (usearch) behind the same
interface as the exact matrix (vectors.VectorIndex).

Chosen by measurement (bench/ann.py; figures in docs/scaling.md): usearch's HNSW with float16
storage, 32 links per node and a search breadth of 512 keeps nearly all of the exact top 10 at
a fraction of the exact product's time; int8 storage lost recall. faiss's HNSW cannot remove
vectors
(an edit must remove its old chunks), hnswlib has no wheel here. Removal is real (usearch
removes keys), adding is incremental, and the graph is saved to disk and mapped back at start,
so neither an edit nor a restart rebuilds it.

A saved graph is mapped from its file (usearch's view), not read into memory: reading it holds
the interpreter lock while the start-up scan waits, and mapped, its pages are a file's, which
the kernel may drop and read again, not the daemon's own memory. A mapped graph cannot change (usearch crashes on a removal from
a view): the chunks added or replaced since go to a small graph in memory (`_ix`), those
removed or replaced are left out of the mapped one's answers (`_dead`), and a search asks
both. Saving merges them into a new file, which is mapped in turn.

Filters: a search restricted to some files either ranks those files' chunks exactly (when they
are few: their vectors are read back from the graph) or asks the graph for more neighbours and
keeps those of the files.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from usearch.index import Index

from ragd.index.filemap import FileMap, MappedChunks

CONNECTIVITY = 32
EXPANSION_ADD = 128
# 128 found 91% of the exact top 10 on bench/scale.py's 100k index (clusters of near-duplicate
# vectors, the hard case), 512 found 98.5% at 1.1 ms a query (bench/ann.py, ef sweep).
EXPANSION_SEARCH = 512
EXACT_BELOW = 20000  # a filter leaving at most this many chunks: ranked exactly
# How the graph stores its vectors: int8, half of float16's memory (654 MB against 1.04 GB at a
# million 384-d vectors, links included). Its own top 10 keeps 96% of the exact one on real
# vectors (float16: 100%), so the candidates a search asks for are ranked again by their
# float32 vectors from the embedding cache (VectorStore.rescore): docs/scaling.md.
DTYPE = "i8"


def _exactly(keys: np.ndarray, vecs: np.ndarray, q: np.ndarray, k: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """(chunk ids, cosines) of the k best of these unit vectors, best first."""
    if not len(keys):
        return np.empty(0, np.int64), np.empty(0, np.float32)
    sims = vecs @ q
    top = np.argsort(-sims)[:k]
    return keys[top], sims[top].astype(np.float32)


class AnnIndex(MappedChunks):
    def __init__(self, dims: int, space: int | None = None, index: Index | None = None,
                 dtype: str = DTYPE):
        self.dims = dims
        self.space = space
        self.dtype = np.dtype("float16")  # (what get and export give back is float32)
        self._ix = index or Index(ndim=dims, metric="cos", dtype=dtype,
                                  connectivity=CONNECTIVITY, expansion_add=EXPANSION_ADD,
                                  expansion_search=EXPANSION_SEARCH)
        self._map = FileMap()  # chunk id -> file id (for filters and snapshots)
        self._lock = threading.Lock()
        # The graph mapped from its file (read-only: never add to or remove from it), the file,
        # and its keys whose vector there is not theirs any more (removed, or in _ix now)
        self._base: Index | None = None
        self._base_path: Path | None = None
        self._dead: set[int] = set()
        self._live: np.ndarray | None = None  # the mapped graph's keys not dead (when few)
        # The chunks whose vector here may differ from the graph file this index was loaded
        # from or last saved to (`based`): a snapshot of few changes lists them beside that
        # file instead of writing the whole graph again (VectorStore.snapshot)
        self.dirty: set[int] = set()
        self.based = False

    @classmethod
    def from_rows(cls, dims: int, space: int | None, ids: np.ndarray, files: np.ndarray,
                  vectors: np.ndarray, threads: int = 0, dtype: str = DTYPE) -> "AnnIndex":
        """A graph of these rows, built in one go (threads: 0 = all cores)."""
        a = cls(dims, space, dtype=dtype)
        if len(ids):
            a._ix.add(ids.astype(np.uint64), np.asarray(vectors, dtype=np.float32),
                      threads=threads)
            a._map = FileMap(ids, files)
        return a

    @property
    def nbytes(self) -> int:
        return int(self._ix.memory_usage)

    @property
    def storage(self) -> str:
        """How the graph stores its vectors: "f16", "i8"."""
        return str(self._ix.dtype).rsplit(".", 1)[-1].lower()

    remote = False  # searched here

    @property
    def approximate(self) -> bool:
        """Its cosines are those of int8 vectors (about ±0.005): a search's candidates are
        ranked again by their stored float32 vectors (VectorStore.rescore)."""
        return self.storage == "i8"

    def add(self, ids: list[int], vectors: np.ndarray, files: list[int] | None = None) -> None:
        if not len(ids):
            return
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(ids), self.dims)
        files = files if files is not None else [-1] * len(ids)
        with self._lock:
            again = [i for i in ids if i in self._map]
            if self._base is not None:  # what the mapped graph holds is left out from now on
                again = [i for i in again if not self._base_dies(i)]
            if again:  # replaced: usearch keeps one vector per key only if removed first
                self._ix.remove(np.array(again, dtype=np.uint64))
            self._ix.add(np.array(ids, dtype=np.uint64), vectors, threads=1)
            for c, f in zip(ids, files):
                self._map.set(c, f)
            self.dirty.update(ids)

    def remove(self, ids) -> int:
        with self._lock:
            present = [i for i in ids if i in self._map]
            if not present:
                return 0
            mine = present if self._base is None else [i for i in present
                                                       if not self._base_dies(i)]
            if mine:
                self._ix.remove(np.array(mine, dtype=np.uint64))
            for i in present:
                self._map.remove(i)
            # (counted as changes since the graph file: many, and a snapshot merges them into
            # a new file rather than listing them, so the mapped graph's answers are not
            # mostly chunks removed since)
            self.dirty.update(present)
            return len(present)

    def get(self, ids) -> tuple[list[int], np.ndarray]:
        with self._lock:
            found = [i for i in ids if i in self._map]
            if not found:
                return [], np.empty((0, self.dims), np.float32)
            vecs = self._vectors(np.array(found, dtype=np.uint64))
        return found, self._float32(vecs, len(found))

    def _base_dies(self, i: int) -> bool:
        """Chunk i's vector in the mapped graph is not its own any more; True when it was
        there (else it is in _ix). Under the lock."""
        if i in self._dead or not self._base.contains(i):
            return False
        self._dead.add(i)
        self._live = None
        return True

    def _vectors(self, keys: np.ndarray) -> np.ndarray:
        """The stored vectors of these chunks, each from the graph that holds it. Under the
        lock."""
        if self._base is None:
            return self._ix.get(keys)
        mine = np.asarray(self._ix.contains(keys), dtype=bool) if len(self._ix) else \
            np.zeros(len(keys), dtype=bool)
        out = np.empty((len(keys), self.dims), dtype=np.int8 if self.storage == "i8"
                       else np.float16)
        if mine.any():
            out[mine] = np.asarray(self._ix.get(keys[mine])).reshape(-1, self.dims)
        if (~mine).any():
            out[~mine] = np.asarray(self._base.get(keys[~mine])).reshape(-1, self.dims)
        return out

    def _nearest(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, cosines) of the k nearest, best first, from both graphs. Under the
        lock."""
        if self._base is None:
            m = self._ix.search(q, min(k, len(self._ix)))
            return m.keys.astype(np.int64), (1.0 - m.distances).astype(np.float32)
        keys, dists = [], []
        if len(self._ix):
            m = self._ix.search(q, min(k, len(self._ix)))
            keys.append(m.keys.astype(np.int64))
            dists.append(np.asarray(m.distances, dtype=np.float32))
        n, want = len(self._base), k
        if len(self._dead) > n // 2 and n - len(self._dead) <= EXACT_BELOW:
            # most of the mapped graph removed since (a source removed, every note chunked
            # again) and not yet merged: the few chunks left in it, exactly
            if self._live is None:
                self._live = np.setdiff1d(np.asarray(self._base.keys, dtype=np.int64),
                                          np.fromiter(self._dead, np.int64, len(self._dead)))
            if len(self._live):
                found, sims = _exactly(self._live, self._float32(
                    self._base.get(self._live.astype(np.uint64)), len(self._live)), q, k)
                keys.append(found)
                dists.append(1.0 - sims)
            n = 0
        while n:  # the mapped graph: asked for more while its removed keys crowd its answer
            m = self._base.search(q, min(want + len(self._dead) if len(self._dead) < 64
                                         else want, n))
            got = m.keys.astype(np.int64)
            alive = np.fromiter((int(c) not in self._dead for c in got), dtype=bool,
                                count=len(got)) if self._dead else np.ones(len(got), bool)
            if alive.sum() >= k or want >= n:
                keys.append(got[alive][:k])
                dists.append(np.asarray(m.distances, dtype=np.float32)[alive][:k])
                break
            want *= 4
        if not keys:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        keys_a, dists_a = np.concatenate(keys), np.concatenate(dists)
        top = np.argsort(dists_a, kind="stable")[:k]
        return keys_a[top], (1.0 - dists_a[top]).astype(np.float32)

    def _float32(self, vecs, n: int) -> np.ndarray:
        """Vectors as the graph gives them back, as unit float32 rows (int8 ones are scaled)."""
        out = np.asarray(vecs, dtype=np.float32).reshape(n, self.dims)
        if self.storage == "i8":
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
        return out

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._lock:
            ids, files = self._map.arrays()
            vecs = self._vectors(ids.astype(np.uint64)) if len(ids) else \
                np.empty((0, self.dims), np.float16)
        return ids, files, self._float32(vecs, len(ids))

    def export_keys(self) -> tuple[np.ndarray, np.ndarray, None]:
        """(chunk ids, file ids, None): what a snapshot keeps beside the saved graph."""
        with self._lock:
            ids, files = self._map.arrays()
        return ids, files, None

    def changed(self) -> int:
        """How many chunks changed since the graph file was loaded or saved."""
        with self._lock:
            return len(self.dirty)

    def dirty_ids(self) -> np.ndarray | None:
        """The chunks changed since the graph file was loaded or saved (sorted), or None when
        this index has no such file (built here)."""
        with self._lock:
            return np.array(sorted(self.dirty), dtype=np.int64) if self.based else None

    def search(self, query: np.ndarray, k: int,
               files: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(query, dtype=np.float32).reshape(self.dims)
        with self._lock:
            n = len(self._map)
            if n == 0:
                return np.empty(0, np.int64), np.empty(0, np.float32)
            if files is None:
                return self._nearest(q, min(k, n))
            # few chunks pass: those exactly; many: the graph
            chosen = self._map.chunks_of(files)
            if len(chosen) > EXACT_BELOW:
                chosen = None
        if chosen is not None:
            found, vecs = self.get(chosen.tolist())  # few: exactly
            return _exactly(np.array(found, dtype=np.int64), vecs, q, k)
        allowed = set(np.asarray(files).tolist())
        want = k
        while True:  # many: ask the graph for more, keep those of the files
            with self._lock:
                got, sims = self._nearest(q, min(want, n))
                keep = [(int(c), float(s)) for c, s in zip(got, sims)
                        if self._map.get(int(c)) in allowed]
            if len(keep) >= k or want >= n:
                keep = keep[:k]
                return (np.array([c for c, _ in keep], dtype=np.int64),
                        np.array([s for _, s in keep], dtype=np.float32))
            want *= 4

    def nearest_to_any(self, queries: np.ndarray, k: int, exclude_files=()
                       ) -> list[tuple[int, int, float, int]]:
        q = np.asarray(queries, dtype=np.float32).reshape(-1, self.dims)
        excluded = set(np.asarray(exclude_files).tolist())
        best: dict[int, tuple[float, int]] = {}
        with self._lock:
            n = len(self._map)
            if n == 0:
                return []
            for w, vec in enumerate(q):
                got, sims = self._nearest(vec, min(k, n))
                for c, s in zip(got.tolist(), sims.tolist()):
                    if self._map.get(c) in excluded:
                        continue
                    if c not in best or s > best[c][0]:
                        best[c] = (s, w)
            files = {c: self._map.get(c, -1) for c in best}
        out = sorted(((c, files[c], s, w) for c, (s, w) in best.items()), key=lambda x: -x[2])
        return out[:k]

    # -- persistence --------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Write the graph to path (a mapped one merged with what changed since), then map
        it from there: the graph in memory is given back."""
        with self._lock:
            tmp = path.with_suffix(".tmp")
            if self._base is None:
                self._ix.save(str(tmp))
            else:
                kept = np.setdiff1d(np.asarray(self._base.keys, dtype=np.uint64),
                                    np.fromiter(self._dead, np.uint64, len(self._dead)))
                # Whichever graph has fewer rows to carry over is added to the other: after a
                # few edits the file's graph takes the edited rows; after most chunks changed
                # (every file read again: new chunk ids) the graph in memory takes the few the
                # file still holds, where adding a million rows one thread at a time would
                # hold searches (this lock) for many minutes.
                if len(kept) < len(self._ix):
                    whole = self._ix.copy()
                    source, keys = self._base, kept
                else:
                    whole = self._new()
                    whole.load(str(self._base_path))
                    if self._dead:
                        whole.remove(np.array(sorted(self._dead), dtype=np.uint64))
                    source, keys = self._ix, np.asarray(self._ix.keys, dtype=np.uint64)
                if len(keys):
                    # (as stored: int8 rows made float and quantized again would drift)
                    whole.add(keys, np.asarray(source.get(keys)).reshape(len(keys), -1),
                              threads=1)
                whole.save(str(tmp))
                del whole
            tmp.replace(path)
            self._mapped(path)
            self.dirty.clear()
            self.based = True

    def _new(self) -> Index:
        return Index(ndim=self.dims, metric="cos", dtype=self.storage,
                     connectivity=CONNECTIVITY, expansion_add=EXPANSION_ADD,
                     expansion_search=EXPANSION_SEARCH)

    def _mapped(self, path: Path) -> None:
        """Search the graph file at path from now on (mapped), and an empty graph in memory
        for what changes after. Under the lock (or before the index is shared)."""
        base = self._new()
        base.view(str(path))
        base.expansion_search = EXPANSION_SEARCH  # a run-time setting, not the file's
        self._base, self._base_path, self._dead, self._live = base, path, set(), None
        self._ix = self._new()

    @classmethod
    def load(cls, path: Path, dims: int, space: int | None, ids: np.ndarray,
             files: np.ndarray, dtype: str = DTYPE) -> "AnnIndex":
        """The graph saved at path, mapped, of these chunks (a chunk it holds that is not
        among them was removed after it was saved). ValueError when it stores its vectors
        otherwise than `dtype` (a graph of an older ragd: it is built again)."""
        meta = Index.metadata(str(path))
        stored = str(meta.get("kind_scalar", "")).rsplit(".", 1)[-1].lower() if meta else ""
        if stored and stored != dtype:
            raise ValueError(f"the graph stores {stored} vectors, not {dtype}")
        a = cls(dims, space, dtype=dtype)
        a._mapped(path)
        # chunks removed before the graph was saved, not in its key list
        a._dead = set(np.setdiff1d(np.asarray(a._base.keys, dtype=np.int64), ids,
                                   assume_unique=True).tolist())
        a._map = FileMap(ids, files)
        a.based = True
        return a
