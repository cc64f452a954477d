"""Chunk vectors in memory: one numpy matrix, so a query is one matrix-vector product.

Rows are L2-normalised, so the product is the cosine. Adding and removing chunks updates the
matrix in place (append into spare capacity; remove by moving the last row into the hole), never
a full reload. float32 by default; float16 halves the memory when configured.

On disk a vector is little-endian float32 bytes (embeddings.vector).
"""

from __future__ import annotations

import threading

import numpy as np


def to_blob(v: np.ndarray) -> bytes:
    return np.asarray(v, dtype="<f4").tobytes()


def from_blob(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<f4")


class VectorIndex:
    def __init__(self, dims: int, dtype: str = "float32", space: int | None = None):
        self.dims = dims
        self.space = space
        self.dtype = np.dtype(dtype)
        self._m = np.empty((1024, dims), dtype=self.dtype)
        self._ids = np.empty(1024, dtype=np.int64)
        self._files = np.empty(1024, dtype=np.int64)  # each row's file id: filters by file
        self._row: dict[int, int] = {}
        self._n = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def __contains__(self, chunk_id: int) -> bool:
        return chunk_id in self._row

    @property
    def nbytes(self) -> int:
        return self._n * self.dims * self.dtype.itemsize

    approximate = False  # its cosines are the vectors' own (VectorStore.rescore)
    remote = False  # searched here (keysonly.KeysOnly: in the store backend)

    def add(self, ids: list[int], vectors: np.ndarray, files: list[int] | None = None) -> None:
        """Add (or replace) rows for these chunk ids (files: the chunks' file ids)."""
        if not len(ids):
            return
        vectors = np.asarray(vectors).reshape(len(ids), self.dims)
        files = files if files is not None else [-1] * len(ids)
        with self._lock:
            need = self._n + len(ids)
            if need > len(self._ids):
                cap = max(need, 2 * len(self._ids))
                m = np.empty((cap, self.dims), dtype=self.dtype)
                m[:self._n] = self._m[:self._n]
                i = np.empty(cap, dtype=np.int64)
                i[:self._n] = self._ids[:self._n]
                f = np.empty(cap, dtype=np.int64)
                f[:self._n] = self._files[:self._n]
                self._m, self._ids, self._files = m, i, f
            for cid, vec, fid in zip(ids, vectors, files):
                row = self._row.get(cid)
                if row is None:
                    row = self._n
                    self._n += 1
                    self._row[cid] = row
                    self._ids[row] = cid
                self._m[row] = vec
                self._files[row] = fid

    def remove(self, ids) -> int:
        """Drop rows for these chunk ids (unknown ids are ignored); returns how many went."""
        gone = 0
        with self._lock:
            for cid in ids:
                row = self._row.pop(cid, None)
                if row is None:
                    continue
                last = self._n - 1
                if row != last:
                    moved = int(self._ids[last])
                    self._m[row] = self._m[last]
                    self._ids[row] = moved
                    self._files[row] = self._files[last]
                    self._row[moved] = row
                self._n -= 1
                gone += 1
        return gone

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of (chunk ids, file ids, vectors as float32) of every row."""
        with self._lock:
            n = self._n
            return (self._ids[:n].copy(), self._files[:n].copy(),
                    self._m[:n].astype(np.float32))

    def get(self, ids) -> tuple[list[int], np.ndarray]:
        """The vectors of these chunk ids that are here: (their ids, their rows)."""
        with self._lock:
            found = [cid for cid in ids if cid in self._row]
            rows = np.array([self._row[cid] for cid in found], dtype=np.int64)
            return found, self._m[rows].astype(np.float32) if len(rows) else \
                np.empty((0, self.dims), np.float32)

    def nearest_to_any(self, queries: np.ndarray, k: int, exclude_files=()
                       ) -> list[tuple[int, int, float, int]]:
        """The k rows closest to any of several vectors (the chunks of a note): (chunk id, file
        id, cosine, index of the query vector it is closest to), best first. Computed in blocks
        of rows, so memory stays bounded at any size."""
        q = np.asarray(queries, dtype=self.dtype).reshape(-1, self.dims)
        best_s, best_w, best_r = [], [], []
        with self._lock:
            n = self._n
            for start in range(0, n, 65536):
                block = (self._m[start:min(n, start + 65536)] @ q.T).astype(np.float32)
                which = block.argmax(axis=1)
                score = block[np.arange(len(block)), which]
                if len(exclude_files):
                    score[np.isin(self._files[start:start + len(block)], exclude_files)] = -2.0
                keep = np.argpartition(-score, min(k, len(score)) - 1)[:k] if len(score) > k \
                    else np.arange(len(score))
                best_s.append(score[keep])
                best_w.append(which[keep])
                best_r.append(keep + start)
            if not best_s:
                return []
            s, w, r = np.concatenate(best_s), np.concatenate(best_w), np.concatenate(best_r)
            order = np.argsort(-s, kind="stable")[:k]
            return [(int(self._ids[r[i]]), int(self._files[r[i]]), float(s[i]), int(w[i]))
                    for i in order if s[i] > -2.0]

    def search(self, query: np.ndarray, k: int,
               files: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, cosines) of the k nearest rows, best first; with `files` (sorted file
        ids), only among the rows of those files: a filter applied before the top k."""
        q = np.asarray(query, dtype=self.dtype).reshape(self.dims)
        with self._lock:
            n = self._n
            if n == 0:
                return np.empty(0, np.int64), np.empty(0, np.float32)
            scores = (self._m[:n] @ q).astype(np.float32)
            ids = self._ids[:n].copy()
            if files is not None:
                keep = np.isin(self._files[:n], files, assume_unique=False)
                scores, ids = scores[keep], ids[keep]
        n = len(ids)
        if n == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        k = min(k, n)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return ids[top], scores[top]
