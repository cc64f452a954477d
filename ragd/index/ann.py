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
            self._ix.remove(np.array(present, dtype=np.uint64))
            for i in present:
                self._map.remove(i)
            return len(present)

    def get(self, ids) -> tuple[list[int], np.ndarray]:
        with self._lock:
            found = [i for i in ids if i in self._map]
            if not found:
                return [], np.empty((0, self.dims), np.float32)
            vecs = self._ix.get(np.array(found, dtype=np.uint64))
        return found, self._float32(vecs, len(found))

    def _float32(self, vecs, n: int) -> np.ndarray:
        """Vectors as the graph gives them back, as unit float32 rows (int8 ones are scaled)."""
        out = np.asarray(vecs, dtype=np.float32).reshape(n, self.dims)
        if self.storage == "i8":
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
        return out

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._lock:
            ids, files = self._map.arrays()
            vecs = self._ix.get(ids.astype(np.uint64)) if len(ids) else \
                np.empty((0, self.dims), np.float16)
        return ids, files, self._float32(vecs, len(ids))

    def export_keys(self) -> tuple[np.ndarray, np.ndarray, None]:
        """(chunk ids, file ids, None): what a snapshot keeps beside the saved graph."""
        with self._lock:
            ids, files = self._map.arrays()
        return ids, files, None

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
                m = self._ix.search(q, min(k, n))
                return m.keys.astype(np.int64), (1.0 - m.distances).astype(np.float32)
            # few chunks pass: those exactly; many: the graph
            chosen = self._map.chunks_of(files)
            if len(chosen) > EXACT_BELOW:
                chosen = None
        if chosen is not None:
            found, vecs = self.get(chosen.tolist())  # few: exactly
            if not found:
                return np.empty(0, np.int64), np.empty(0, np.float32)
            scores = vecs @ q
            top = np.argsort(-scores)[:k]
            return np.array(found, dtype=np.int64)[top], scores[top].astype(np.float32)
        allowed = set(np.asarray(files).tolist())
        want = k
        while True:  # many: ask the graph for more, keep those of the files
            with self._lock:
                m = self._ix.search(q, min(want, n))
                keep = [(int(c), 1.0 - float(d)) for c, d in zip(m.keys, m.distances)
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
                m = self._ix.search(vec, min(k, n))
                for c, d in zip(m.keys.tolist(), m.distances.tolist()):
                    s = 1.0 - d
                    if self._map.get(c) in excluded:
                        continue
                    if c not in best or s > best[c][0]:
                        best[c] = (s, w)
            files = {c: self._map.get(c, -1) for c in best}
        out = sorted(((c, files[c], s, w) for c, (s, w) in best.items()), key=lambda x: -x[2])
        return out[:k]

    # -- persistence --------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        with self._lock:
            tmp = path.with_suffix(".tmp")
            self._ix.save(str(tmp))
            tmp.replace(path)
            self.dirty.clear()
            self.based = True

    @classmethod
    def load(cls, path: Path, dims: int, space: int | None, ids: np.ndarray,
             files: np.ndarray, dtype: str = DTYPE) -> "AnnIndex":
        """The graph saved at path, of these chunks (a chunk it holds that is not among them
        was removed after it was saved). ValueError when it stores its vectors otherwise than
        `dtype` (a graph of an older ragd: it is built again)."""
        meta = Index.metadata(str(path))
        stored = str(meta.get("kind_scalar", "")).rsplit(".", 1)[-1].lower() if meta else ""
        if stored and stored != dtype:
            raise ValueError(f"the graph stores {stored} vectors, not {dtype}")
        ix = Index(ndim=dims, metric="cos", dtype=dtype, connectivity=CONNECTIVITY,
                   expansion_add=EXPANSION_ADD, expansion_search=EXPANSION_SEARCH)
        ix.load(str(path))
        ix.expansion_search = EXPANSION_SEARCH  # a run-time setting, not the file's
        extra = np.setdiff1d(np.asarray(ix.keys, dtype=np.int64), ids, assume_unique=True)
        if len(extra):  # chunks removed before the graph was saved, not in its key list
            ix.remove(extra.astype(np.uint64))
        a = cls(dims, space, ix)
        a._map = FileMap(ids, files)
        a.based = True
        return a
