"""Approximate nearest neighbours for large spaces: an HNSW graph (usearch) behind the same
interface as the exact matrix (vectors.VectorIndex).

Chosen by measurement (bench/ann.py; figures in docs/scaling.md): usearch's HNSW with float16
storage, 32 links per node and a search breadth of 512 keeps nearly all of the exact top 10 at
a fraction of the exact product's time; int8 storage lost recall. faiss's HNSW cannot remove
vectors
(an edit must remove its old chunks), hnswlib has no wheel here. Removal is real (usearch
removes keys), adding is incremental, and the graph is saved to disk and loaded back at start,
so neither an edit nor a restart rebuilds it.

Filters: a search restricted to some files either ranks those files' chunks exactly (when they
are few: their vectors are read back from the graph) or asks the graph for more neighbours and
keeps those of the files.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from usearch.index import Index

CONNECTIVITY = 32
EXPANSION_ADD = 128
# 128 found 91% of the exact top 10 on bench/scale.py's 100k index (clusters of near-duplicate
# vectors, the hard case), 512 found 98.5% at 1.1 ms a query (bench/ann.py, ef sweep).
EXPANSION_SEARCH = 512
EXACT_BELOW = 20000  # a filter leaving at most this many chunks: ranked exactly


class AnnIndex:
    def __init__(self, dims: int, space: int | None = None, index: Index | None = None):
        self.dims = dims
        self.space = space
        self.dtype = np.dtype("float16")
        self._ix = index or Index(ndim=dims, metric="cos", dtype="f16",
                                  connectivity=CONNECTIVITY, expansion_add=EXPANSION_ADD,
                                  expansion_search=EXPANSION_SEARCH)
        self._files: dict[int, int] = {}  # chunk id -> file id
        self._by_file: dict[int, set[int]] = {}  # file id -> its chunk ids (for filters)
        self._lock = threading.Lock()

    @classmethod
    def from_rows(cls, dims: int, space: int | None, ids: np.ndarray, files: np.ndarray,
                  vectors: np.ndarray, threads: int = 0) -> "AnnIndex":
        """A graph of these rows, built in one go (threads: 0 = all cores)."""
        a = cls(dims, space)
        if len(ids):
            a._ix.add(ids.astype(np.uint64), np.asarray(vectors, dtype=np.float32),
                      threads=threads)
            a._index_files(ids, files)
        return a

    def _index_files(self, ids: np.ndarray, files: np.ndarray) -> None:
        self._files = dict(zip(ids.tolist(), files.tolist()))
        self._by_file = {}
        for c, f in self._files.items():
            self._by_file.setdefault(f, set()).add(c)

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, chunk_id: int) -> bool:
        return chunk_id in self._files

    @property
    def nbytes(self) -> int:
        return int(self._ix.memory_usage)

    def add(self, ids: list[int], vectors: np.ndarray, files: list[int] | None = None) -> None:
        if not len(ids):
            return
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(ids), self.dims)
        files = files if files is not None else [-1] * len(ids)
        with self._lock:
            again = [i for i in ids if i in self._files]
            if again:  # replaced: usearch keeps one vector per key only if removed first
                self._ix.remove(np.array(again, dtype=np.uint64))
            self._ix.add(np.array(ids, dtype=np.uint64), vectors, threads=1)
            for c, f in zip(ids, files):
                old = self._files.get(c)
                if old is not None and old != f:
                    self._by_file.get(old, set()).discard(c)
                self._files[c] = f
                self._by_file.setdefault(f, set()).add(c)

    def remove(self, ids) -> int:
        with self._lock:
            present = [i for i in ids if i in self._files]
            if not present:
                return 0
            self._ix.remove(np.array(present, dtype=np.uint64))
            for i in present:
                f = self._files.pop(i)
                chunks = self._by_file.get(f)
                if chunks is not None:
                    chunks.discard(i)
                    if not chunks:
                        del self._by_file[f]
            return len(present)

    def get(self, ids) -> tuple[list[int], np.ndarray]:
        with self._lock:
            found = [i for i in ids if i in self._files]
            if not found:
                return [], np.empty((0, self.dims), np.float32)
            vecs = self._ix.get(np.array(found, dtype=np.uint64))
        return found, np.asarray(vecs, dtype=np.float32).reshape(len(found), self.dims)

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._lock:
            ids = np.fromiter(self._files.keys(), dtype=np.int64, count=len(self._files))
            files = np.fromiter(self._files.values(), dtype=np.int64, count=len(self._files))
            vecs = self._ix.get(ids.astype(np.uint64)) if len(ids) else \
                np.empty((0, self.dims), np.float16)
        return ids, files, np.asarray(vecs, dtype=np.float32).reshape(len(ids), self.dims)

    def export_keys(self) -> tuple[np.ndarray, np.ndarray, None]:
        """(chunk ids, file ids, None): what a snapshot keeps beside the saved graph."""
        with self._lock:
            ids = np.fromiter(self._files.keys(), dtype=np.int64, count=len(self._files))
            files = np.fromiter(self._files.values(), dtype=np.int64, count=len(self._files))
        return ids, files, None

    def search(self, query: np.ndarray, k: int,
               files: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(query, dtype=np.float32).reshape(self.dims)
        with self._lock:
            n = len(self._files)
            if n == 0:
                return np.empty(0, np.int64), np.empty(0, np.float32)
            if files is None:
                m = self._ix.search(q, min(k, n))
                return m.keys.astype(np.int64), (1.0 - m.distances).astype(np.float32)
            allowed = set(files.tolist())
            # few chunks pass: those exactly; many: the graph (only counted: a list of a
            # hundred thousand ids cost 10 ms a search)
            count = sum(len(self._by_file.get(f, ())) for f in allowed)
            chosen = [c for f in allowed for c in self._by_file.get(f, ())] \
                if count <= EXACT_BELOW else None
        if chosen is not None:
            found, vecs = self.get(chosen)  # few: exactly
            if not found:
                return np.empty(0, np.int64), np.empty(0, np.float32)
            scores = vecs @ q
            top = np.argsort(-scores)[:k]
            return np.array(found, dtype=np.int64)[top], scores[top].astype(np.float32)
        want = k
        while True:  # many: ask the graph for more, keep those of the files
            with self._lock:
                m = self._ix.search(q, min(want, n))
                keep = [(int(c), 1.0 - float(d)) for c, d in zip(m.keys, m.distances)
                        if self._files.get(int(c)) in allowed]
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
            n = len(self._files)
            if n == 0:
                return []
            for w, vec in enumerate(q):
                m = self._ix.search(vec, min(k, n))
                for c, d in zip(m.keys.tolist(), m.distances.tolist()):
                    s = 1.0 - d
                    if self._files.get(c) in excluded:
                        continue
                    if c not in best or s > best[c][0]:
                        best[c] = (s, w)
            files = {c: self._files.get(c, -1) for c in best}
        out = sorted(((c, files[c], s, w) for c, (s, w) in best.items()), key=lambda x: -x[2])
        return out[:k]

    # -- persistence --------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        with self._lock:
            tmp = path.with_suffix(".tmp")
            self._ix.save(str(tmp))
            tmp.replace(path)

    @classmethod
    def load(cls, path: Path, dims: int, space: int | None, ids: np.ndarray,
             files: np.ndarray) -> "AnnIndex":
        ix = Index(ndim=dims, metric="cos", dtype="f16", connectivity=CONNECTIVITY,
                   expansion_add=EXPANSION_ADD, expansion_search=EXPANSION_SEARCH)
        ix.load(str(path))
        ix.expansion_search = EXPANSION_SEARCH  # a run-time setting, not the file's
        extra = np.setdiff1d(np.asarray(ix.keys, dtype=np.int64), ids, assume_unique=True)
        if len(extra):  # chunks removed before the graph was saved, not in its key list
            ix.remove(extra.astype(np.uint64))
        a = cls(dims, space, ix)
        a._index_files(ids, files)
        return a
