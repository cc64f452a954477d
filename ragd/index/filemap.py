"""Which file each chunk of a vector graph belongs to, for a million chunks: two sorted arrays
(16 bytes a chunk; a dict of Python ints took over 100, and a set per file as much again), and
the changes since they were last merged in a dict and a set, merged once they grow.
"""

from __future__ import annotations

import numpy as np

MERGE_AT = 4096  # changes held apart before they are merged (or 1/64 of the chunks, if more)


class FileMap:
    def __init__(self, ids=None, files=None):
        ids = np.asarray(ids if ids is not None else (), dtype=np.int64)
        files = np.asarray(files if files is not None else (), dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        self._ids, self._files = ids[order], files[order]
        self._new: dict[int, int] = {}  # added (or moved to another file) since the merge
        self._gone: set[int] = set()  # removed since the merge, of the arrays' chunks
        self._n = len(ids)

    def __len__(self) -> int:
        return self._n

    def _base(self, chunk_id: int) -> int | None:
        """The chunk's file in the merged arrays (None: not there, or removed since)."""
        i = int(np.searchsorted(self._ids, chunk_id))
        if i < len(self._ids) and self._ids[i] == chunk_id and chunk_id not in self._gone:
            return int(self._files[i])
        return None

    def get(self, chunk_id: int, default=None):
        f = self._new.get(chunk_id)
        if f is not None:
            return f
        f = self._base(chunk_id)
        return default if f is None else f

    def __contains__(self, chunk_id: int) -> bool:
        return chunk_id in self._new or self._base(chunk_id) is not None

    def set(self, chunk_id: int, file_id: int) -> None:
        if chunk_id not in self:
            self._n += 1
        self._new[chunk_id] = file_id
        self._maybe_merge()

    def remove(self, chunk_id: int) -> bool:
        """Forget the chunk; False when it was not here."""
        if self._new.pop(chunk_id, None) is not None:
            if self._base(chunk_id) is not None:
                self._gone.add(chunk_id)
        elif self._base(chunk_id) is not None:
            self._gone.add(chunk_id)
        else:
            return False
        self._n -= 1
        self._maybe_merge()
        return True

    def _maybe_merge(self) -> None:
        if len(self._new) + len(self._gone) > max(MERGE_AT, len(self._ids) // 64):
            self.merge()

    def merge(self) -> None:
        """The changes into the arrays."""
        if not self._new and not self._gone:
            return
        drop = np.fromiter(self._gone | self._new.keys(), dtype=np.int64,
                           count=len(self._gone | self._new.keys()))
        keep = ~np.isin(self._ids, drop)
        ids = np.concatenate([self._ids[keep], np.fromiter(self._new.keys(), dtype=np.int64,
                                                           count=len(self._new))])
        files = np.concatenate([self._files[keep], np.fromiter(
            self._new.values(), dtype=np.int64, count=len(self._new))])
        order = np.argsort(ids, kind="stable")
        self._ids, self._files = ids[order], files[order]
        self._new, self._gone = {}, set()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (chunk ids, their file ids), every chunk, by chunk id."""
        self.merge()
        return self._ids.copy(), self._files.copy()

    def chunks_of(self, files: np.ndarray) -> np.ndarray:
        """The chunk ids of these files."""
        self.merge()
        return self._ids[np.isin(self._files, files)]


class MappedChunks:
    """Size and membership of a vector index whose chunks are those of its FileMap
    (`self._map`): the HNSW graph (ann.py) and the keys-only index (keysonly.py)."""

    _map: FileMap

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, chunk_id: int) -> bool:
        return chunk_id in self._map
