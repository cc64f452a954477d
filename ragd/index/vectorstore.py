"""Where vectors live: the vector spaces, their matrices and the embedding cache on disk.

The daemon makes one VectorStore and hands it to the indexer (which tells it of every commit:
chunks removed and added), to the embedders (which fill a space's vectors) and to search
(which reads them). ``engines/`` only runs the model processes.

A space (``Space``) is one embedding model as configured: its fingerprint (file hash + pooling
+ prefixes + the embedded-text version) and a probe vector (a fixed sentence embedded when the
space was made; a space is reused only when the model still embeds the probe the same way). It
holds the matrix of the chunks that have a vector (``VectorIndex``: numpy, exact) and the queue
of texts that lack one. ``active`` answers queries; ``building`` (during a model switch) is
filled beside it, and becomes active when it covers every chunk.

On disk: ``embeddings`` (space, text hash) -> vector, the content-addressed cache, and a
snapshot of each space's matrix (``<data_dir>/vectors/space-N.*.npy``) so a restart does not
read every vector back from SQLite: the snapshot is loaded and checked against the chunks
table by (chunk id, text hash) — what changed since is read from the cache, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ragd.engines.models import REGISTRY, ResolvedModel, recognise, sha256_file
from ragd.index import store
from ragd.index.ann import AnnIndex
from ragd.index.keysonly import KeysOnly
from ragd.index.space import HEAD_TEXTS, Space
from ragd.index.vectors import VectorIndex, from_blob, to_blob
from ragd.text import chunk_rows

log = logging.getLogger("ragd.vectors")

PROBE_TEXT = "ragd probe: a quiet harbour at dawn, gulls circling over the fishing boats."
PROBE_MATCH = 0.999  # cosine between probe vectors for two runs to count as the same space
MAX_ATTEMPTS = 3
# What a chunk's vector is made of (chunker.embed_text: header + body). A change to it makes a
# new vector space, so old and new vectors are never mixed. v2: the body (Obsidian syntax made
# readable), as embed_hash always said; v1 embedded the raw text.
EMBED_TEXT_VERSION = 2
SNAPSHOT_EVERY = 600.0  # seconds between snapshots of a matrix that changed
# A graph snapshot with at most this many chunks changed since the graph file was written
# lists them beside it (read back from the cache at the next start) instead of writing the
# graph again: 660 MB at a million chunks, which a stop after a few edits could not write
# within its 4 s, and the start after it checked every chunk (5.8 s).
LIGHT_SNAPSHOT_MAX = 5000
# Seconds without a change after which a snapshot that writes the graph whole is taken (not
# SNAPSHOT_EVERY after the last one)
QUIET_BEFORE_GRAPH = 30.0
# An int8 graph's first candidates ranked again by their float32 vectors (rescore): each is a
# read from the cache, and an int8 cosine is off by so little that the true top 10 is among
# the graph's first 50 (docs/scaling.md); the rest keep their int8 cosines
RESCORED = 50


def fingerprint(db: sqlite3.Connection, model: ResolvedModel) -> str:
    """Model file hash + pooling + prefixes; the file hash is cached by path, size and mtime."""
    st = model.path.stat()
    key = f"sha256:{model.path}:{st.st_size}:{st.st_mtime_ns}"
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    if row is None:
        digest = sha256_file(model.path)
        with store.transaction(db):
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, digest))
    else:
        digest = row[0]
    parts = (f"{digest}|{model.pooling}|{model.query_prefix}|{model.doc_prefix}|"
             f"text v{EMBED_TEXT_VERSION}")
    return hashlib.blake2b(parts.encode(), digest_size=12).hexdigest()


class VectorStore:
    def __init__(self, data_dir: Path, dtype: str = "float32", ann_threshold: int = 0,
                 keys_only: bool = False):
        self.dir = data_dir / "vectors"
        self.dtype = dtype
        # The store backend holds the vectors and answers dense search: a space keeps only
        # which chunks have one (keysonly.py)
        self.keys_only = keys_only
        # A space with at least this many vectors is searched through an HNSW graph (ann.py);
        # below it, exactly. 0: always exactly.
        self.ann_threshold = ann_threshold
        # Orders matrix updates against the indexer's commits (the indexer's listener lock).
        self.sync = threading.Lock()
        self.active: Space | None = None
        self.building: Space | None = None
        self.enabled = True  # an embedding model is configured
        # The embedder of the active space: it embeds an edit's texts before its commit, and
        # counts what that stored (serve_edits); and whoever wants to hear of every commit
        # that changed chunks or vectors (on_commit: the Milvus mirror).
        self._live = None
        self._committed: list = []

    # -- the indexer's listener ---------------------------------------------------------------------

    @property
    def wants_changes(self) -> bool:
        return self.enabled

    def spaces(self) -> list[Space]:
        return [s for s in (self.active, self.building) if s is not None]

    def chunks_changed(self, db: sqlite3.Connection, removed: list[int],
                       added: list[tuple[int, str, int]], gone: set[str] = frozenset(),
                       live: bool = False) -> None:
        """Called after each commit of the indexer, with self.sync held: every open space
        drops the removed chunks (and from its queue the texts of theirs, `gone`, that no
        chunk has any more: a source removed while its texts were waiting), takes the cached
        vectors of the added ones, and queues the texts that have none: those of a live edit
        (`live`) first, so that one made while a backlog is embedded is found by its meaning
        after the engine's current batch, not after the backlog."""
        for space in self.spaces():
            if removed:
                self._remove(space, removed)
                queued = space.queued(gone)  # (an edit's, the queue empty: nothing to read)
                if queued:
                    space.forget(queued - self._chunk_texts(db, queued))
            if not added:
                continue
            by_hash: dict[str, list[tuple[int, int]]] = {}
            for cid, h, fid in added:
                by_hash.setdefault(h, []).append((cid, fid))
            found = self._add_cached(db, space, by_hash)
            missing = [h for h in by_hash if h not in found]
            if missing:
                space.queue(missing, first=live, **past_heads(added))
        for fn in self._committed:
            fn()

    @staticmethod
    def _chunk_texts(db: sqlite3.Connection, hashes) -> set[str]:
        """Those of these texts (embed hashes) that some chunk has."""
        out: set[str] = set()
        hs = list(hashes)
        for i in range(0, len(hs), 500):
            part = hs[i:i + 500]
            out.update(r[0] for r in db.execute(
                f"SELECT DISTINCT embed_hash FROM chunks WHERE embed_hash IN "
                f"({','.join('?' * len(part))})", part))
        return out

    # -- subscriptions ------------------------------------------------------------------------

    def on_commit(self, fn) -> None:
        """Call fn() after each indexer commit that changed chunks or vectors."""
        self._committed.append(fn)

    def serve_edits(self, embedder) -> None:
        """This embedder (index/embedder.py) embeds the edits of the active space from now on:
        its embed_now before a commit, its count_stored of what that stored."""
        self._live = embedder

    def make_active(self, db: sqlite3.Connection, space_id: int, record: str | None) -> None:
        """Record the space searched (and the model in use, so a restart mid-switch resumes),
        in the caller's transaction. The one writer of both: a space opened active and a
        switch's flip (index/switch.py) go through it."""
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('active_space', ?)",
                   (str(space_id),))
        if record is not None:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('active_model', ?)",
                       (record,))

    def promote(self, space: Space) -> None:
        """Make `space` the one searched (with self.sync held): the one place that sets it,
        for a space opened active and for a switch's new space, which stops being built."""
        if self.building is space:
            self.building = None
        self.active = space

    @staticmethod
    def rescore(db: sqlite3.Connection, space: Space, qv: np.ndarray, ids: np.ndarray,
                cos: np.ndarray, known: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, cosines) of a search of an approximate index (an int8 graph: `approximate`),
        its first RESCORED ranked again by the chunks' stored float32 vectors, best first; the
        others, and a chunk whose vector is not stored, keep their approximate cosines.
        `known`: chunk id -> its stored vector (None: not stored), of this snapshot, read by an
        earlier rescoring of the same search and added to here: dense feedback's second search
        finds mostly the chunks the first did, and each vector read costs a cache lookup (about
        30 us at 1M chunks, most of a rescoring's time)."""
        if not space.vectors.approximate or not len(ids):
            return ids, cos
        head = ids[:RESCORED].tolist()
        known = {} if known is None else known
        missing = [c for c in head if c not in known]
        if missing:
            read = store.chunk_vectors(db, space.id, missing)
            known.update({c: from_blob(read[c]) if c in read else None for c in missing})
        q = np.asarray(qv, dtype=np.float32)
        best = np.array(cos, dtype=np.float32)
        for i, c in enumerate(head):
            if known[c] is not None:
                best[i] = float(known[c] @ q)
        order = np.argsort(-best, kind="stable")
        return ids[order], best[order]

    @staticmethod
    def vectors_of(db: sqlite3.Connection, space: Space, ids) -> tuple[list[int], np.ndarray]:
        """(the ids that have one, their float32 vectors) of these chunks: from the space's
        index, or from the cache when the store backend holds the vectors (keys_only)."""
        if not space.vectors.remote:
            return space.vectors.get(ids)
        stored = store.chunk_vectors(db, space.id, [int(i) for i in ids])
        found = [int(i) for i in ids if int(i) in stored]
        return found, (np.vstack([from_blob(stored[c]) for c in found]).astype(np.float32)
                       if found else np.empty((0, space.vectors.dims), np.float32))

    def embed_now(self, db: sqlite3.Connection, records: list):
        live = self._live
        return live.embed_now(db, records) if live is not None else None

    def put_vectors(self, db: sqlite3.Connection, space: int, rows: list) -> None:
        """An edit's vectors, embedded before its commit: stored in the caller's transaction."""
        if rows:
            insert(db, space, rows)
            if self._live is not None:
                self._live.count_stored(rows)

    # -- reading ------------------------------------------------------------------------------------

    @staticmethod
    def cached(db: sqlite3.Connection, space: int, hashes) -> dict[str, np.ndarray]:
        """The cached vectors of these texts in a space."""
        out: dict[str, np.ndarray] = {}
        hs = list(hashes)
        for i in range(0, len(hs), 500):
            part = hs[i:i + 500]
            for h, blob in db.execute(f"SELECT text_hash, vector FROM embeddings WHERE space = ? "
                                      f"AND text_hash IN ({','.join('?' * len(part))})",
                                      [space, *part]):
                out[h] = from_blob(blob)
        return out

    @staticmethod
    def present(db: sqlite3.Connection, space: int, hashes) -> dict[str, None]:
        """Those of these texts that have a vector in a space (cached's keys, the vectors not
        read: what a keys-only space needs)."""
        out: dict[str, None] = {}
        hs = list(hashes)
        for i in range(0, len(hs), 500):
            part = hs[i:i + 500]
            out.update((h, None) for (h,) in db.execute(
                f"SELECT text_hash FROM embeddings WHERE space = ? AND text_hash IN "
                f"({','.join('?' * len(part))})", [space, *part]))
        return out

    def _cached_for(self, db: sqlite3.Connection, space: Space, hashes) -> dict:
        """What the space's index takes of these texts: their vectors, or (keys only) which
        have one."""
        return (self.present if space.vectors.remote else self.cached)(db, space.id, hashes)

    @staticmethod
    def _stack(space: Space, vecs: list):
        return None if space.vectors.remote else np.vstack(vecs)

    def _add_cached(self, db: sqlite3.Connection, space: Space,
                    by_hash: dict[str, list[tuple[int, int]]]) -> set[str]:
        found = self._cached_for(db, space, by_hash)
        ids, vecs, files = [], [], []
        for h, v in found.items():
            for cid, fid in by_hash[h]:
                ids.append(cid)
                vecs.append(v)
                files.append(fid)
        if ids:
            self._add(space, ids, self._stack(space, vecs), files)
        return set(found)

    def _add(self, space: Space, ids: list[int], vecs: np.ndarray, files: list[int]) -> None:
        """Add rows to a space's vectors (caller holds self.sync)."""
        space.vectors.add(ids, vecs, files)
        space.changed_at = time.monotonic()
        if space.ann_ops is not None:
            space.ann_ops.append(("add", ids, vecs, files))
        self._maybe_ann(space)

    def _remove(self, space: Space, ids: list[int]) -> None:
        space.vectors.remove(ids)
        space.changed_at = time.monotonic()
        if space.ann_ops is not None:
            space.ann_ops.append(("remove", ids))

    # -- exact or approximate -------------------------------------------------------------------------

    def _graph_for(self, n: int) -> bool:
        """Are n vectors searched through an HNSW graph ([embedding] ann_threshold)?"""
        return bool(self.ann_threshold) and n >= self.ann_threshold

    def _maybe_ann(self, space: Space) -> None:
        """A space grown past the threshold gets its graph, built in the background from the
        matrix (which answers meanwhile); changes made during the build are replayed on it."""
        if (space.ann_ops is not None or space.vectors.remote
                or isinstance(space.vectors, AnnIndex)
                or not self._graph_for(len(space.vectors))):
            return
        space.ann_ops = []
        ids, files, mat = space.vectors.export()
        threading.Thread(target=self._build_ann, args=(space, ids, files, mat),
                         name="ann-build", daemon=True).start()

    def _build_ann(self, space: Space, ids, files, mat) -> None:
        t0 = time.monotonic()
        try:
            ann = AnnIndex.from_rows(space.vectors.dims, space.id, ids, files, mat, threads=1)
        except Exception:
            log.exception("space %d: building its graph failed; it stays exact", space.id)
            with self.sync:
                space.ann_ops = None
            return
        with self.sync:
            for op in space.ann_ops or []:
                if op[0] == "add":
                    ann.add(op[1], op[2], op[3])
                else:
                    ann.remove(op[1])
            space.vectors, space.ann_ops = ann, None
            space.changed_at = time.monotonic()
        log.info("space %d: %d vectors now searched through an HNSW graph (built in %.1fs)",
                 space.id, len(ann), time.monotonic() - t0)

    def to_matrix(self, db: sqlite3.Connection, space: Space, by_hash: dict) -> None:
        """Put these texts' vectors (given, or None: read from the cache) into the space's
        matrix for every chunk that has the text."""
        with self.sync:
            rows = db.execute(f"SELECT id, embed_hash, file_id FROM chunks WHERE embed_hash IN "
                              f"({','.join('?' * len(by_hash))})", list(by_hash)).fetchall()
            missing = [h for h, v in by_hash.items() if v is None]
            have = {h for h, v in by_hash.items() if v is not None}
            if space.vectors.remote:
                have.update(self.present(db, space.id, missing))
            else:
                by_hash.update(self.cached(db, space.id, missing))
                have.update(h for h in missing if by_hash.get(h) is not None)
            rows = [r for r in rows if r[1] in have]
            if rows:
                self._add(space, [r[0] for r in rows],
                          self._stack(space, [by_hash[r[1]] for r in rows]),
                          [r[2] for r in rows])
        for fn in self._committed:
            fn()

    # -- opening a space ----------------------------------------------------------------------------

    def open(self, db: sqlite3.Connection, model: ResolvedModel, probe: np.ndarray,
             stop: threading.Event | None = None, activate: bool = True,
             record: str | None = None) -> Space:
        """Find (by fingerprint and probe) or make the space of this model, load its matrix
        (from its snapshot when it still agrees with the chunks) and queue what lacks a
        vector. activate: it becomes the active space (the one search reads)."""
        fp = fingerprint(db, model)
        chosen, drift = None, None
        for sid, blob in db.execute("SELECT id, probe FROM spaces WHERE fingerprint = ? ORDER BY "
                                    "last_used DESC", (fp,)):
            cos = float(np.dot(from_blob(blob), probe))
            if cos >= PROBE_MATCH:
                chosen = sid
                break
            drift = cos
        now = time.time()
        previous = db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()
        with store.transaction(db, stop):
            if chosen is None:
                chosen = db.execute(
                    "INSERT INTO spaces (fingerprint, model, dims, probe, created_at, "
                    "last_used) VALUES (?, ?, ?, ?, ?, ?)",
                    (fp, model.name, len(probe), to_blob(probe), now, now)).lastrowid
                if drift is not None:
                    log.warning("model %s now embeds the probe differently (cosine %.4f with "
                                "the stored probe): its old vectors are not used; re-embedding",
                                model.name, drift)
            db.execute("UPDATE spaces SET last_used = ? WHERE id = ?", (now, chosen))
            if activate:
                self.make_active(db, chosen, record)
        t0 = time.monotonic()
        space = Space(chosen, model, KeysOnly(len(probe), chosen) if self.keys_only
                      else VectorIndex(len(probe), self.dtype, chosen))
        if model.name not in REGISTRY and (spec := recognise(probe)) is not None:
            space.recognised = spec
            log.info("model %s embeds as %s does: its similarity threshold %.2f applies "
                     "(search.min_similarity overrides it)", model.path.name, spec.name,
                     spec.min_similarity)
        if activate and previous is not None and int(previous[0]) != chosen:
            space.note = (f"the embedding model changed (vector space {previous[0]} -> "
                          f"{chosen}); old vectors are not used, re-embedding in the background")
            log.warning("%s", space.note)
        given_up = {h for (h,) in db.execute(
            "SELECT text_hash FROM embed_failures WHERE space = ? AND attempts >= ?",
            (chosen, MAX_ATTEMPTS))}
        retry = [(last + (1 << attempts), h) for h, attempts, last in db.execute(
            "SELECT text_hash, attempts, last_try FROM embed_failures WHERE space = ? AND "
            "attempts < ?", (chosen, MAX_ATTEMPTS))]
        later = {h for _, h in retry}
        # Held through the load: a commit of the indexer between this read and the matrix
        # being in place would otherwise be missed by both.
        with self.sync:
            how, stale = self._load(db, space, given_up | later)
            self._maybe_ann(space)  # (a threshold lowered since the snapshot: built now)
            with space.cv:
                space.retry = sorted(retry)
            space.saved_at = space.changed_at = time.monotonic()
            if stale:  # the snapshot lacks what was read from the cache: written at the next tick
                space.saved_at = 0.0
            if activate:
                self.promote(space)
            else:
                self.building = space
        log.info("vector space %d (%s, %d dims): %d vectors%s, %d texts to embed, in %.2fs",
                 chosen, model.name, space.vectors.dims, len(space.vectors), how,
                 space.pending(), time.monotonic() - t0)
        return space

    def _load(self, db: sqlite3.Connection, space: Space, skip: set[str]) -> tuple[str, bool]:
        """Fill the matrix and the queue: from the snapshot when there is one (then only the
        chunks it lacks, or holds with another text, are read from the cache), else from the
        cache in one pass. Returns how, and whether the snapshot on disk is behind the matrix.
        A snapshot of every chunk, taken at the chunks' generation of now, is loaded as it
        is: nothing to check, nothing to queue."""
        if (fresh := self._load_current(db, space)) is not None:
            saved = "saved graph" if isinstance(space.vectors, AnnIndex) else "snapshot"
            also = (f", {fresh} of them from the cache (changed since the graph file was "
                    f"written)" if fresh else "")
            return f": all from the {saved} (no chunk changed since it was taken){also}", False
        gen = store.chunks_gen(db)  # (the caller holds sync: no commit in between)
        cur_ids, cur_files, cur_hashes = store.chunk_keys(db)
        need = np.ones(len(cur_ids), dtype=bool)
        snap = self._read_snapshot(space)
        how = " read from the cache"
        kept = None  # what the snapshot gave, when it was used
        if snap is not None and len(cur_ids):
            ids, files, mat, hs = snap
            if hs.dtype.kind == "U":  # a snapshot of an older ragd: hashes as str
                hs = hs.astype(cur_hashes.dtype)
            pos = np.minimum(np.searchsorted(cur_ids, ids), len(cur_ids) - 1)
            ok = (cur_ids[pos] == ids) & (cur_hashes[pos] == hs)
            if isinstance(mat, AnnIndex):  # the graph itself: drop what no longer holds
                space.vectors = mat
                mat.remove(ids[~ok].tolist())
                how = f"from the saved graph ({int((~ok).sum())} dropped)"
            else:
                space.vectors.add(ids[ok].tolist(), None if mat is None else mat[ok],
                                  cur_files[pos[ok]].tolist())
                how = "from the snapshot"
            need[pos[ok]] = False
            kept = int(ok.sum())
            stale = bool(need.any() or not ok.all())
            if not stale:  # checked and whole: the next start need not check it again
                self._write_meta(space, gen, kept, True)
        else:
            stale = bool(len(cur_ids))
        todo: OrderedDict[str, None] = OrderedDict()
        rest: OrderedDict[str, None] = OrderedDict()
        heads = 0  # idx's first `heads` are notes' first texts, the rest long notes' others
        samples: set[str] = set()  # (Space.samples)
        idx = np.flatnonzero(need)
        if len(idx):  # queued most recently modified note first, as the indexer takes them,
            # and a long note's texts past its first HEAD_TEXTS after every note's first ones
            mtimes = dict(db.execute("SELECT id, mtime_ns FROM files"))
            recent = np.fromiter((mtimes.get(int(f), 0) for f in cur_files[idx]),
                                 dtype=np.int64, count=len(idx))
            idx = idx[np.argsort(-recent, kind="stable")]
            tail = np.array(past_head(cur_files[idx].tolist()), dtype=bool)
            long = np.isin(cur_files[idx], np.unique(cur_files[idx[tail]]))
            samples = {h.decode().rstrip() for h in cur_hashes[idx[~tail & long]].tolist()}
            idx = np.concatenate([idx[~tail], idx[tail]])
            heads = len(idx) - int(tail.sum())
        for i in range(0, len(idx), 20000):
            part = idx[i:i + 20000]
            hashes = [h.decode().rstrip() for h in cur_hashes[part].tolist()]
            cached = self._cached_for(db, space, set(hashes))
            have = [(k, h) for k, h in zip(part, hashes) if h in cached]
            if have:
                rows = [k for k, _ in have]
                self._add(space, cur_ids[rows].tolist(),
                          self._stack(space, [cached[h] for _, h in have]),
                          cur_files[rows].tolist())
            for at, h in enumerate(hashes, i):
                if h not in cached and h not in skip and h not in todo:
                    if at >= heads:
                        rest[h] = None
                    else:
                        todo[h] = None
                        rest.pop(h, None)
        with space.cv:
            space.todo, space.rest = todo, rest
            space.samples = {h for h in samples if h in todo}
        if kept is not None:  # "N vectors: S from the snapshot, C from the cache"
            how = f": {kept} {how}, {len(space.vectors) - kept} from the cache"
        return how, stale

    def _load_current(self, db: sqlite3.Connection, space: Space) -> int | None:
        """Load the snapshot as it is when it holds a vector for every chunk and the chunks
        have not changed since it was taken (their generation, store.chunks_gen). Returns
        how many of a light snapshot's changed chunks were read from the cache; None when
        it is not loaded (not current, or cannot be read)."""
        try:
            meta = json.loads(self._paths(space)["meta"].read_text())
        except (OSError, ValueError):
            return None
        if not (isinstance(meta, dict) and meta.get("complete") is True
                and meta.get("gen") == store.chunks_gen(db)
                and meta.get("vectors") == chunk_rows(db)):
            return None
        snap = self._read_snapshot(space, hashes=False)
        if snap is None or len(snap[0]) != meta["vectors"]:
            return None
        ids, files, mat, _ = snap
        fresh = 0
        if isinstance(mat, AnnIndex):
            if (fresh := self._refresh(db, space, mat, ids, files)) is None:
                return None
            space.vectors = mat
        else:
            space.vectors.add(ids.tolist(), mat, files.tolist())
        with space.cv:
            space.todo, space.rest = OrderedDict(), OrderedDict()
        return fresh

    def _refresh(self, db: sqlite3.Connection, space: Space, graph: AnnIndex, ids: np.ndarray,
                 files: np.ndarray) -> int | None:
        """A light snapshot's changed chunks: their vectors in the graph file are replaced by
        the cache's, of the text the snapshot recorded. Returns how many; None when one is
        not in the cache (the start then checks every chunk)."""
        try:
            dirty = self._dirty(space)
            if not len(dirty):
                return 0
            hashes = np.load(self._paths(space)["hashes"])
        except (OSError, ValueError):
            return None
        pos = np.minimum(np.searchsorted(ids, dirty), max(len(ids) - 1, 0))
        pos = pos[ids[pos] == dirty] if len(ids) else pos[:0]  # (changed, then removed)
        want = [h.decode().rstrip() for h in hashes[pos].tolist()]
        cached = self._cached_for(db, space, set(want))
        if len(cached) < len(set(want)):
            return None
        graph.remove(dirty.tolist())
        if len(pos):
            graph.add(ids[pos].tolist(), self._stack(space, [cached[h] for h in want]),
                      files[pos].tolist())
        return len(pos)

    def _dirty(self, space: Space) -> np.ndarray:
        """The chunks a light snapshot lists as changed since its graph file (empty: none).
        ValueError when the list is there but cannot be read: then no vector of the graph
        file can be trusted to be its chunk's."""
        path = self._paths(space)["dirty"]
        if not path.exists():
            return np.zeros(0, np.int64)
        try:
            return np.asarray(np.load(path), dtype=np.int64)
        except (OSError, ValueError) as e:
            raise ValueError(f"its list of changed chunks cannot be read: {e}") from None

    # -- snapshots ----------------------------------------------------------------------------------

    def _paths(self, space: Space) -> dict[str, Path]:
        base = self.dir / f"space-{space.id}"
        out = {k: base.with_name(f"{base.name}.{k}.npy") for k in ("ids", "files", "vectors",
                                                                     "hashes")}
        out["graph"] = base.with_name(f"{base.name}.graph.usearch")
        # the chunks whose vector in the graph file is not theirs any more (a light snapshot)
        out["dirty"] = base.with_name(f"{base.name}.dirty.npy")
        # the chunks' generation it was taken at, and whether it holds every chunk's vector
        out["meta"] = base.with_name(f"{base.name}.meta.json")
        return out

    def snapshot(self, db: sqlite3.Connection, space: Space) -> None:
        """Write the space's matrix to disk (atomically), with each row's text hash."""
        vi = space.vectors
        graph = isinstance(vi, AnnIndex)
        with self.sync:
            if graph or vi.remote:  # the graph is saved as it is; no vectors file
                ids, files, mat = vi.export_keys()
            else:
                ids, files, mat = vi.export()
            if not len(ids):
                return
            dirty = vi.dirty_ids() if graph else None
            # read while commits wait for sync: a chunk's text changed after the export
            # must not be saved as the text of the vector exported
            gen, total = store.chunks_gen(db), chunk_rows(db)
            cur_ids, _, cur_hashes = store.chunk_keys(db)
        pos = np.minimum(np.searchsorted(cur_ids, ids), max(len(cur_ids) - 1, 0))
        keep = (cur_ids[pos] == ids) if len(cur_ids) else np.zeros(len(ids), dtype=bool)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths = self._paths(space)
        paths["meta"].unlink(missing_ok=True)  # (a snapshot half written is not "current")
        arrays = {"ids": ids[keep], "files": files[keep],
                  "hashes": cur_hashes[pos[keep]]}
        light = graph and _light(vi, None if dirty is None else len(dirty), paths["graph"])
        if light:  # the graph file stays; what changed since is listed first (a stop midway
            # leaves those chunks dropped from it and read from the cache)
            tmp = paths["dirty"].with_suffix(".tmp.npy")
            np.save(tmp, dirty)
            tmp.replace(paths["dirty"])
        elif graph:
            vi.save(paths["graph"])
            paths["vectors"].unlink(missing_ok=True)
        elif vi.remote:  # which chunks have a vector, and of which text: nothing else
            paths["graph"].unlink(missing_ok=True)
            paths["vectors"].unlink(missing_ok=True)
        else:
            arrays["vectors"] = mat[keep]
            paths["graph"].unlink(missing_ok=True)
        for key, arr in arrays.items():
            tmp = paths[key].with_suffix(".tmp.npy")
            np.save(tmp, arr)
            tmp.replace(paths[key])
        if not light:  # (the graph written whole: nothing in it is out of date)
            paths["dirty"].unlink(missing_ok=True)
        kept = int(keep.sum())
        self._write_meta(space, gen, kept, kept == total)
        space.saved_at = time.monotonic()
        log.debug("space %d: snapshot of %d vectors written%s", space.id, kept,
                  f" ({len(dirty)} changed since the graph file)" if light else "")

    def _write_meta(self, space: Space, gen: int, vectors: int, complete: bool) -> None:
        path = self._paths(space)["meta"]
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"gen": gen, "vectors": vectors, "complete": complete}))
            tmp.replace(path)
        except OSError as e:  # the next start checks the snapshot instead: slower, not wrong
            log.warning("space %d: snapshot's state not written: %s", space.id, e)

    def _read_snapshot(self, space: Space, hashes: bool = True):
        """(ids, files, the matrix or the graph, each row's text hash — None when not asked
        for) of the space's snapshot; None when it cannot be used."""
        paths = self._paths(space)
        if space.vectors.remote:  # the keys are enough (a snapshot with vectors is one too)
            try:
                ids, files = np.load(paths["ids"]), np.load(paths["files"])
                hs = np.load(paths["hashes"]) if hashes else None
            except (OSError, ValueError):
                return None
            if not len(ids) == len(files) == (len(hs) if hashes else len(ids)):
                log.warning("space %d: its snapshot is inconsistent; reading the cache", space.id)
                return None
            return ids, files, None, hs
        if paths["graph"].exists():
            try:
                ids, files = np.load(paths["ids"]), np.load(paths["files"])
                if not self._graph_for(len(ids)):
                    # [embedding] ann_threshold raised (or 0: always exact) since the graph
                    # was saved: the setting holds, the vectors are read from the cache
                    if hashes:  # (said once: the start's first look asks without them)
                        log.info("space %d: %d vectors, under ann_threshold (%d): searched "
                                 "exactly, the saved graph not used", space.id, len(ids),
                                 self.ann_threshold)
                    return None
                hs = np.load(paths["hashes"]) if hashes else None
                if hs is not None and len(dirty := self._dirty(space)):
                    # changed since the graph file: checked as chunks of another text, so
                    # dropped from it and read from the cache
                    hs = hs.copy()
                    hs[np.isin(ids, dirty)] = b""
                graph = AnnIndex.load(paths["graph"], space.vectors.dims, space.id, ids, files)
            except (OSError, ValueError, RuntimeError) as e:
                log.warning("space %d: its saved graph cannot be used (%s); rebuilding",
                            space.id, e)
                return None
            if not (len(ids) == len(files) == (len(hs) if hashes else len(ids))):
                log.warning("space %d: its saved graph is inconsistent; rebuilding", space.id)
                return None
            return ids, files, graph, hs
        try:
            arrays = {k: np.load(p, mmap_mode="r" if k == "vectors" else None)
                      for k, p in paths.items() if k not in ("graph", "meta", "dirty")
                      and (hashes or k != "hashes")}
        except (OSError, ValueError):
            return None
        n = len(arrays["ids"])
        if not (len(arrays["files"]) == len(arrays.get("hashes", arrays["ids"]))
                == len(arrays["vectors"]) == n) \
                or (n and arrays["vectors"].shape[1] != space.vectors.dims):
            log.warning("space %d: its snapshot is inconsistent; reading the cache", space.id)
            return None
        return (arrays["ids"], arrays["files"], np.asarray(arrays["vectors"], dtype=np.float32),
                arrays.get("hashes"))

    def _heavy(self, space: Space) -> bool:
        """Would the space's snapshot write its graph whole (not a light one)? A stop's few
        seconds cannot: at 100k chunks changed the merge alone takes longer."""
        vi = space.vectors
        return isinstance(vi, AnnIndex) and not _light(
            vi, vi.changed() if vi.based else None, self._paths(space)["graph"])

    def snapshot_if_due(self, db: sqlite3.Connection, force: bool = False) -> None:
        """Snapshot each space that changed, every SNAPSHOT_EVERY; and one whose snapshot
        writes its graph whole as soon as its changes have settled (QUIET_BEFORE_GRAPH): a
        stop could not write it in time, and every start after would build the graph again
        from the cache (6 minutes at 1M chunks, after every file was read again)."""
        now = time.monotonic()
        for space in self.spaces():
            if space.changed_at > space.saved_at and (
                    force or now - space.saved_at > SNAPSHOT_EVERY
                    or (now - space.changed_at > QUIET_BEFORE_GRAPH and self._heavy(space))):
                try:
                    self.snapshot(db, space)
                except OSError as e:
                    log.warning("space %d: snapshot not written: %s", space.id, e)


def past_heads(added) -> dict[str, set[str]]:
    """Of a commit's added chunks ((chunk id, text hash, file id), a file's in id order: as
    written), the texts found only past their note's first space.HEAD_TEXTS (`rest`), and
    the first texts of those notes (`samples`): Space.queue's arguments."""
    added = sorted(added, key=lambda a: (a[2], a[0]))
    past = past_head([fid for _, _, fid in added])
    head = {h for (_, h, _), p in zip(added, past) if not p}
    long = {fid for (_, _, fid), p in zip(added, past) if p}
    return {"rest": {h for (_, h, _), p in zip(added, past) if p} - head,
            "samples": {h for (_, h, fid), p in zip(added, past) if not p and fid in long}}


def past_head(files) -> list[bool]:
    """For each of a sequence of file ids (its chunks, in the order they are queued), whether
    its file came HEAD_TEXTS times before it."""
    seen: dict[int, int] = {}
    out = []
    for f in files:
        seen[f] = n = seen.get(f, 0) + 1
        out.append(n > HEAD_TEXTS)
    return out


def _light(vi: AnnIndex, changed: int | None, graph_file: Path) -> bool:
    """Is a snapshot of this graph a light one, its changed chunks listed beside the graph
    file, not the graph written whole? `changed`: how many chunks changed since the file was
    loaded or saved (None: the graph was built here, from no file). At most
    LIGHT_SNAPSHOT_MAX, and under a third of the graph: more, and much of the file is out of
    date (written whole, which for so small a graph is quick)."""
    return (changed is not None and changed <= min(LIGHT_SNAPSHOT_MAX, len(vi) // 3)
            and graph_file.exists())


def insert(db: sqlite3.Connection, space: int, rows: list) -> None:
    """rows: (text hash, vector, tokens, truncated). The caller holds the transaction."""
    now = time.time()
    db.executemany(
        "INSERT OR REPLACE INTO embeddings (space, text_hash, vector, tokens, truncated, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?)",
        [(space, h, to_blob(v), n, int(tr), now) for h, v, n, tr in rows])
    hashes = [r[0] for r in rows]
    for i in range(0, len(hashes), 500):
        part = hashes[i:i + 500]
        db.execute(f"DELETE FROM embed_failures WHERE space = ? AND text_hash IN "
                   f"({','.join('?' * len(part))})", [space, *part])
