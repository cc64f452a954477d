"""A vector space's chunks without their vectors, for a store that holds the vectors itself
(``[store] backend = "milvus"``, ``local_vectors = false``).

The space still has to know which chunks have a vector — coverage, what is left to embed,
which chunks a search can find by meaning — so it keeps their ids and file ids (FileMap: 16
bytes a chunk, where a float32 vector of 384 dimensions is 1,536). The vectors stay in the
embedding cache on disk (content-addressed, so a rename still embeds nothing) and in Milvus,
which answers the dense searches; the few vectors a search needs locally (dense feedback, a
note's own chunks for `related`) are read from the cache by key (VectorStore.vectors_of).
"""

from __future__ import annotations

import threading

import numpy as np

from ragd.index.filemap import FileMap, MappedChunks


class VectorsElsewhere(RuntimeError):
    """A search asked this index for what only the store holding the vectors can answer."""


class KeysOnly(MappedChunks):
    approximate = False
    remote = True  # searched through the store backend, never here

    def __init__(self, dims: int, space: int | None = None):
        self.dims = dims
        self.space = space
        self._map = FileMap()
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return 16 * len(self._map)

    def add(self, ids: list[int], vectors=None, files: list[int] | None = None) -> None:
        """These chunks have a vector now (the vectors themselves are not kept)."""
        files = files if files is not None else [-1] * len(ids)
        with self._lock:
            for cid, fid in zip(ids, files):
                self._map.set(int(cid), int(fid))

    def remove(self, ids) -> int:
        with self._lock:
            return sum(1 for cid in ids if self._map.remove(int(cid)))

    def export_keys(self) -> tuple[np.ndarray, np.ndarray, None]:
        """(chunk ids, file ids, None): what a snapshot of this space keeps."""
        with self._lock:
            ids, files = self._map.arrays()
        return ids, files, None

    def search(self, query, k, files=None):
        raise VectorsElsewhere("the vectors are held by the store backend")

    def nearest_to_any(self, queries, k, exclude_files=()):
        raise VectorsElsewhere("the vectors are held by the store backend")
