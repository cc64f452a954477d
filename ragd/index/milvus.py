"""The Milvus store backend (``[store] backend = "milvus"``): the index's chunks and vectors
mirrored into Milvus, which then serves BM25 and dense search.

What moves and what stays: the daemon still watches, parses, chunks and embeds locally, and
SQLite stays the record of files, chunks and the embedding cache (content-addressed per model:
a rename still embeds nothing). Milvus holds, per chunk of the active vector space: its id, its
file's id, its searchable text (heading, aliases and tags, body, as the porter tokens FTS5
makes of them: Milvus' BM25 function ranks them) and its vector. Search asks Milvus for the two
rankings and fuses them as with the default store (weights, the similarity threshold,
--explain, note grouping all stay ragd's). ``MilvusStore.hybrid`` is Milvus' own one-query
fusion (two searches, RRF on the server): the bench measures it beside ragd's fusion.

The same code speaks to Milvus Lite (a local file, ``uri = ""``: ``<data_dir>/milvus.db``; the
milvus-lite wheel runs it) and to a Milvus server or cluster (``uri = "http://host:19530"``).

Keeping the mirror in step — a transactional outbox. Triggers on ``chunks`` (insert, update,
delete) and on ``embeddings`` (a vector of the active space stored) write the chunk ids to
``store_outbox`` inside the writer's own transaction, so nothing the index commits can be missed
and nothing is marked that was rolled back. One supervised thread (``store-sync``) drains it:
reads a batch, upserts the chunks that exist (their text, and their vector when they have one)
and deletes the ones that do not, then removes the batch's rows — only those not marked again
meanwhile (a re-marked chunk gets a new rowid). A crash between the push and the removal pushes
the batch again: upserts and deletes by id are idempotent. Milvus down: the thread backs off
and retries, the outbox holds the work, and search answers from SQLite meanwhile (the reply
says ``store: "sqlite (milvus ...)"``). A model switch changes the active space: the mirror
fills a new collection and drops the old one once the new one has everything.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import numpy as np

from ragd.index import outbox, store
from ragd.index.vectors import from_blob
from ragd.text import index_tokens, symbol_words

log = logging.getLogger("ragd.milvus")

BATCH = 512
MAX_TEXT_BYTES = 60000  # VARCHAR max_length is 65,535 bytes
IDLE_CHECK = 5.0  # seconds between looks at the outbox when nothing woke the thread
DENSE_INDEX = "AUTOINDEX"  # Milvus picks (Lite: a flat index; a server: HNSW or IVF)

TRIGGERS = """
    CREATE TABLE IF NOT EXISTS store_outbox (chunk_id INTEGER NOT NULL UNIQUE);
    CREATE TRIGGER IF NOT EXISTS store_chunks_ai AFTER INSERT ON chunks BEGIN
        INSERT OR REPLACE INTO store_outbox (chunk_id) VALUES (new.id);
    END;
    CREATE TRIGGER IF NOT EXISTS store_chunks_au AFTER UPDATE ON chunks BEGIN
        INSERT OR REPLACE INTO store_outbox (chunk_id) VALUES (new.id);
    END;
    CREATE TRIGGER IF NOT EXISTS store_chunks_ad AFTER DELETE ON chunks BEGIN
        INSERT OR REPLACE INTO store_outbox (chunk_id) VALUES (old.id);
    END;
    CREATE TRIGGER IF NOT EXISTS store_embeddings_ai AFTER INSERT ON embeddings
    WHEN new.space = (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'active_space')
    BEGIN
        INSERT OR REPLACE INTO store_outbox (chunk_id)
            SELECT id FROM chunks WHERE embed_hash = new.text_hash;
    END;
"""
UNINSTALL = """
    DROP TRIGGER IF EXISTS store_chunks_ai;
    DROP TRIGGER IF EXISTS store_chunks_au;
    DROP TRIGGER IF EXISTS store_chunks_ad;
    DROP TRIGGER IF EXISTS store_embeddings_ai;
    DROP TABLE IF EXISTS store_outbox;
    DELETE FROM meta WHERE key = 'store_collection';
"""


def install(db: sqlite3.Connection) -> None:
    """The outbox and its triggers (idempotent); the default store calls uninstall instead, so
    that SQLite alone pays nothing for them."""
    outbox.apply(db, TRIGGERS)


def uninstall(db: sqlite3.Connection) -> None:
    outbox.apply(db, UNINSTALL)


def _query_words(db, query: str) -> str:
    """The query as the collection's text holds words: FTS5's tokens, then its symbols as the
    words a chunk's keywords end with (with_symbols: ⛔ -> sym26d4)."""
    return " ".join(w for w in (index_tokens(db, [query])[0], symbol_words(query))
                    if w)


def search_text(heading: str, keywords: str, body: str) -> str:
    """The columns FTS5 indexes, as one field (Milvus' BM25 has no column weights)."""
    return "\n".join(p for p in (heading, keywords, body) if p)


def _fit(text: str) -> str:
    data = text.encode("utf-8")
    return text if len(data) <= MAX_TEXT_BYTES else \
        data[:MAX_TEXT_BYTES].decode("utf-8", "ignore")


def _expr_files(files) -> str:
    return "" if files is None else f"file_id in [{','.join(str(int(f)) for f in files)}]"


def _expr_dense(files) -> str:
    """Dense search sees only the chunks that have their vector (and pass the filters)."""
    fexpr = _expr_files(files)
    return "embedded == true" + (f" and {fexpr}" if fexpr else "")


class MilvusStore(outbox.OutboxSync):
    """The mirror (its sync thread) and the two rankings read from it."""

    def __init__(self, db_path: Path, data_dir: Path, uri: str, collection: str,
                 token: str = ""):
        super().__init__("store-sync", backoff_max=30.0, db_path=db_path)
        self.uri = uri or str(data_dir / "milvus.db")
        self._token = token  # never logged nor shown in status
        self.prefix = collection
        self.client = None
        # (collection, vector space) search may read: the active space's collection once it
        # has every chunk, else None. One attribute, set in one assignment: a search takes it
        # once and reads that collection throughout, whatever the sync thread does meanwhile.
        self.view: tuple[str, int] | None = None
        self._filling: str | None = None  # a collection being filled (first sync, a switch)
        self._checked: str | None = None  # the collection this client has seen exists

    # -- life ---------------------------------------------------------------------------------

    def stop(self) -> None:
        super().stop()
        client, self.client = self.client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a client whose server already went away
                pass

    @property
    def serving(self) -> bool:
        return self.view is not None and self.client is not None

    @property
    def collection(self) -> str | None:
        v = self.view
        return v[0] if v else None

    def status(self) -> dict:
        out = {"backend": "milvus", "uri": self.uri, "state": self.state,
               "collection": self.collection, "pending": self._pending,
               "pushed": self.pushed}
        if self._filling:
            out["filling"] = self._filling
        if self.error:
            out["error"] = self.error
        return out

    # -- the sync thread ----------------------------------------------------------------------

    def _connect(self):
        from pymilvus import MilvusClient  # only with [store] backend = "milvus"
        if "://" not in self.uri:
            Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
        return MilvusClient(uri=self.uri, token=self._token)

    def _ready(self, db: sqlite3.Connection) -> None:
        if self.client is None:
            self.state = "connecting"
            self.client = self._connect()

    def _drop(self) -> None:
        # Milvus away or refusing: the outbox keeps the work, search answers from SQLite, and
        # the next try (after the worker's backoff) connects afresh
        client, self.client, self._checked = self.client, None, None
        if client is not None:
            try:
                client.close()
            except Exception:  # its server may be gone already
                pass

    def _step(self, db: sqlite3.Connection) -> None:
        seen = self._begin_step()  # what an empty outbox below proves synced
        row = db.execute("SELECT value FROM meta WHERE key = 'active_space'").fetchone()
        space = int(row[0]) if row else None
        if space is None:  # nothing embedded yet (or dense search off): nothing to mirror
            self.state = "waiting for a vector space"
            self._set_pending(0, seen)
            self._sleep(IDLE_CHECK)
            return
        dims = db.execute("SELECT dims FROM spaces WHERE id = ?", (space,)).fetchone()[0]
        name = f"{self.prefix}_s{space}"
        synced = db.execute("SELECT value FROM meta WHERE key = 'store_collection'").fetchone()
        # Asked of Milvus once per client (a lost collection makes the requests fail, and a
        # new client asks again), not at every batch or idle look.
        if synced is None or synced[0] != name or (
                self._checked != name and not self.client.has_collection(name)):
            self._begin_fill(db, name, dims, synced[0] if synced else None)
        self._checked = name
        batch = db.execute("SELECT rowid, chunk_id FROM store_outbox ORDER BY rowid LIMIT ?",
                           (BATCH,)).fetchall()
        if batch:
            self.state = "syncing"
            self._push(db, name, space, dims, batch)
            left = db.execute("SELECT COUNT(*) FROM (SELECT 1 FROM store_outbox LIMIT ?)",
                              (BATCH * 4,)).fetchone()[0]
            self._set_pending(left)
            return
        if self._filling == name or db.execute(
                "SELECT 1 FROM meta WHERE key = 'store_previous'").fetchone():
            self._finish_fill(db, name)  # (also a fill a restart interrupted)
        if self.collection != name:
            # a collection found at start is 'released' (on disk only) until loaded
            self.client.load_collection(name)
        self.view = (name, space)
        self.state = "in sync"
        self._set_pending(0, seen)
        self._sleep(IDLE_CHECK)

    def _begin_fill(self, db, name: str, dims: int, previous: str | None) -> None:
        """A collection for this space, and every chunk marked for it."""
        from pymilvus import DataType, Function, FunctionType
        c = self.client
        # search reads SQLite until this collection has every chunk: the one before holds
        # another model's vectors (and no longer gets the edits)
        self.view = None
        if c.has_collection(name):
            c.drop_collection(name)  # a fill that did not finish: start over
        schema = c.create_schema(auto_id=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("file_id", DataType.INT64)
        # The text arrives as FTS5's porter tokens (index_tokens): the standard analyzer
        # only splits it. Milvus Lite knows no other (its 'english' analyzer is refused and
        # a stemmer filter is ignored); a server's would stem, but stemming here keeps Lite
        # and a cluster ranking alike, and matching words as the default store does.
        schema.add_field("text", DataType.VARCHAR, max_length=65535, enable_analyzer=True)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_field("embedded", DataType.BOOL)
        schema.add_field("dense", DataType.FLOAT_VECTOR, dim=dims)
        schema.add_function(Function(name="bm25", function_type=FunctionType.BM25,
                                     input_field_names=["text"], output_field_names=["sparse"]))
        idx = c.prepare_index_params()
        idx.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        idx.add_index("dense", index_type=DENSE_INDEX, metric_type="COSINE")
        c.create_collection(name, schema=schema, index_params=idx, consistency_level="Strong")
        with store.transaction(db, self._stop):
            db.execute("INSERT OR REPLACE INTO store_outbox (chunk_id) SELECT id FROM chunks")
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('store_collection', ?)",
                       (name,))
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('store_previous', ?)",
                       (previous or "",))
        self._filling = name
        self.state = "filling"
        log.info("milvus: filling collection %s at %s", name, self.uri)

    def _finish_fill(self, db, name: str) -> None:
        row = db.execute("SELECT value FROM meta WHERE key = 'store_previous'").fetchone()
        previous = row[0] if row else ""
        if previous and previous != name and self.client.has_collection(previous):
            self.client.drop_collection(previous)
        with store.transaction(db, self._stop):
            db.execute("DELETE FROM meta WHERE key = 'store_previous'")
        self._filling = None
        log.info("milvus: collection %s has every chunk (%d changes pushed since ragd started)",
                 name, self.pushed)

    def _push(self, db, name: str, space: int, dims: int, batch) -> None:
        ids = [cid for _, cid in batch]
        marks = ",".join("?" * len(ids))
        rows = db.execute(
            f"SELECT c.id, c.file_id, c.heading, c.keywords, c.body, e.vector FROM chunks c "
            f"LEFT JOIN embeddings e ON e.space = ? AND e.text_hash = c.embed_hash "
            f"WHERE c.id IN ({marks})", [space, *ids]).fetchall()
        placeholder = [1.0] + [0.0] * (dims - 1)  # never searched: embedded = false
        texts = index_tokens(db, [search_text(r[2], r[3], r[4]) for r in rows])
        data = []
        for (cid, fid, _, _, _, blob), text in zip(rows, texts):
            vec = from_blob(blob).astype(np.float32).tolist() if blob is not None else placeholder
            data.append({"id": cid, "file_id": fid, "text": _fit(text),
                         "embedded": blob is not None, "dense": vec})
        gone = sorted(set(ids) - {r[0] for r in rows})
        if data:
            self.client.upsert(name, data)
        if gone:
            self.client.delete(name, ids=gone)
        with store.transaction(db, self._stop):
            rowids = [r for r, _ in batch]
            db.execute(f"DELETE FROM store_outbox WHERE rowid IN ({','.join('?' * len(rowids))})",
                       rowids)
        self.pushed += len(batch)

    # -- search -------------------------------------------------------------------------------

    def _client(self):
        c = self.client
        if c is None:
            raise RuntimeError(f"milvus is {self.state}")
        return c

    def bm25(self, view, db, query: str, n: int, files=None) -> list[tuple[int, float]]:
        """The top n chunks by Milvus' BM25 (score: higher is better)."""
        words = _query_words(db, query)
        if not words:
            return []
        res = self._client().search(view[0], data=[words], anns_field="sparse", limit=n,
                                 filter=_expr_files(files),
                                 search_params={"metric_type": "BM25"})
        # Milvus Lite reports BM25 as a negative distance, a server as a positive score:
        # the order is the one given, the magnitude the score.
        return [(int(h["id"]), abs(float(h["distance"]))) for h in res[0]]

    def dense(self, view, qv: np.ndarray, n: int, files=None) -> tuple[np.ndarray, np.ndarray]:
        res = self._client().search(view[0], data=[np.asarray(qv, np.float32).tolist()],
                                 anns_field="dense", limit=n, filter=_expr_dense(files),
                                 search_params={"metric_type": "COSINE"})
        hits = res[0]
        return (np.array([int(h["id"]) for h in hits], dtype=np.int64),
                np.array([float(h["distance"]) for h in hits], dtype=np.float32))

    def nearest_to_any(self, view, queries: np.ndarray, k: int, exclude_files=()
                       ) -> list[tuple[int, int, float, int]]:
        """As VectorIndex.nearest_to_any (related notes), asked of the collection: one search
        of every query vector, each chunk kept at its closest."""
        expr = "embedded == true" + (
            f" and file_id not in [{','.join(str(int(f)) for f in exclude_files)}]"
            if len(exclude_files) else "")
        res = self._client().search(view[0], data=np.asarray(queries, np.float32).tolist(),
                                    anns_field="dense", limit=k, filter=expr,
                                    output_fields=["file_id"],
                                    search_params={"metric_type": "COSINE"})
        best: dict[int, tuple[int, int, float, int]] = {}
        for which, hits in enumerate(res):
            for h in hits:
                cid, score = int(h["id"]), float(h["distance"])
                if cid not in best or score > best[cid][2]:
                    best[cid] = (cid, int(h["entity"]["file_id"]), score, which)
        return sorted(best.values(), key=lambda t: -t[2])[:k]

    def hybrid(self, view, db, query: str, qv: np.ndarray, n: int, rrf_k: int = 60,
               files=None) -> list[tuple[int, float]]:
        """Milvus' own hybrid search: both rankings and their RRF in one request."""
        from pymilvus import AnnSearchRequest, RRFRanker
        reqs = [AnnSearchRequest(data=[_query_words(db, query) or "-"],
                                 anns_field="sparse", limit=n, expr=_expr_files(files) or None,
                                 param={"metric_type": "BM25"}),
                AnnSearchRequest(data=[np.asarray(qv, np.float32).tolist()], anns_field="dense",
                                 limit=n, expr=_expr_dense(files),
                                 param={"metric_type": "COSINE"})]
        res = self._client().hybrid_search(view[0], reqs, RRFRanker(rrf_k), limit=n)
        return [(int(h["id"]), float(h["distance"])) for h in res[0]]
