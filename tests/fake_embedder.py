"""A scripted embedder for the fast tier: the ranking (search/hybrid.py and what it calls) run
on a real index in a temporary folder, with vectors chosen by the test instead of a model's.

Fakes only here, and only the engine boundary: the notes are chunked and written by the real
indexer, the vectors loaded by the real VectorStore, the search answered by the real search op
(ops/search.py) through the real Searcher. What a model would compute is what the test says.
"""

from __future__ import annotations

import contextlib

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ragd import config
from ragd.engines.models import ResolvedModel
from ragd.index import store, vectorstore
from ragd.index.indexer import Indexer
from ragd.index.vectorstore import VectorStore
from ragd.ops.parts import Parts
from ragd.ops.reads import ReadPool
from ragd.ops.results import Results
from ragd.ops.search import SearchOps
from ragd.ops.status import StatusOps
from ragd.search.hybrid import Searcher

DIMS = 8
MIN_SIMILARITY = 0.3  # search.min_similarity of every store built here (the model's would be)


def axis(i: int) -> np.ndarray:
    """The i-th unit vector: two notes on different axes have cosine 0."""
    v = np.zeros(DIMS, dtype=np.float32)
    v[i] = 1.0
    return v


def towards(v, cosine: float, other: int = DIMS - 1) -> np.ndarray:
    """A unit vector whose cosine with the unit vector v is `cosine` (turned towards axis
    `other`, which v must not lean on)."""
    v = np.asarray(v, dtype=np.float32)
    w = axis(other)
    assert abs(float(v @ w)) < 1e-6, "`other` must be orthogonal to v"
    return (cosine * v + np.sqrt(1.0 - cosine ** 2) * w).astype(np.float32)


class FakeEmbedder:
    """An embedding engine's client that returns the vector the script gives a text: the one
    given for exactly that text (a query), else for the one key the text contains (a chunk:
    its embedded text carries a heading and prefix around the note's words), else `default`.
    A text the script does not cover, with no default, is a mistake in the test: it raises."""

    def __init__(self, script: dict[str, np.ndarray], default: np.ndarray | None = None):
        self.script = {k: _unit(v) for k, v in script.items()}
        self.default = None if default is None else _unit(default)
        self.asked: list[str] = []

    def say(self, text: str, vector) -> None:
        """From now on, this text embeds as `vector`."""
        self.script[text] = _unit(vector)

    def vector(self, text: str) -> np.ndarray | None:
        if text in self.script:
            return self.script[text]
        found = [k for k in self.script if k in text]
        if len(found) > 1:
            raise AssertionError(f"two scripted keys {found} in one text: {text!r}")
        return self.script[found[0]] if found else self.default

    # what Searcher asks of an engine's client
    def fit(self, text: str, limit: int) -> tuple[str, int | None]:
        return text, None

    def embed(self, texts: list[str], timeout: float | None = None) -> list[np.ndarray]:
        out = []
        for t in texts:
            self.asked.append(t)
            v = self.vector(t)
            if v is None:
                raise AssertionError(f"no scripted vector for {t!r}")
            out.append(v)
        return out


def _unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


class FakeEngines:
    """The engine manager as Searcher sees it: an embedding engine that is ready (the fake),
    no reranker."""

    def __init__(self, embedder: FakeEmbedder, model: ResolvedModel):
        self.configured = {"embedding"}
        self.embed_model = model
        self.rerank_engine = None
        self._engine = SimpleNamespace(client=embedder, ready=True, state="ready",
                                       takes_every_core=False)

    def query_engine_ready(self, model):
        return self._engine

    def query_first(self, engine):  # no bulk engine to pause
        return contextlib.nullcontext()

    def embed_waited(self, model, work, first=None):  # one engine: nothing to fail over to
        return work(first or self._engine)

    def unavailable(self, role: str) -> str | None:
        return None


class RankedStore:
    """A folder of notes indexed for real, a vector for each chunk the embedder covers (the
    others have none yet: partial coverage), and the search op over them."""

    def __init__(self, tmp_path: Path, notes: dict[str, str], embedder: FakeEmbedder,
                 **search: object):
        vault = tmp_path / "vault"
        for rel, text in notes.items():
            (vault / rel).parent.mkdir(parents=True, exist_ok=True)
            (vault / rel).write_text(text)
        raw = {"daemon": {"data_dir": str(tmp_path / "data"),
                          "socket": str(tmp_path / "ragd.sock")},
               "search": {"min_similarity": MIN_SIMILARITY, "bm25_index": "fts5", **search},
               "watch": {"enabled": False},
               "sources": [{"name": "notes", "path": str(vault), "kind": "folder"}]}
        self.cfg = cfg = config.from_dict(raw, None, env={})
        self.vault = vault
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        store.open_store(cfg.db_path).close()  # the schema, before the indexer's connection
        indexer = Indexer(cfg, cfg.db_path)
        indexer.request_scan()
        indexer.start()
        try:
            assert indexer.wait_idle(30), "the notes were not indexed within 30 s"
        finally:
            indexer.stop()
        model_file = tmp_path / "fake.gguf"  # its hash is the space's fingerprint
        model_file.write_bytes(b"a scripted embedder, not a model")
        model = ResolvedModel("fake", model_file, "embedding", "mean", 512, "", "", 0.0, DIMS)
        self.vectors = VectorStore(cfg.data_dir)
        db = store.open_store(cfg.db_path)
        try:
            rows = db.execute("SELECT embed_hash, text FROM chunks").fetchall()
            self.chunks = len(rows)
            embedded = [(h, embedder.vector(t)) for h, t in rows]
            embedded = [(h, v, 1, False) for h, v in embedded if v is not None]
            probe = _unit(np.arange(1, DIMS + 1, dtype=np.float32))
            space = self.vectors.open(db, model, probe)
            with store.transaction(db):
                vectorstore.insert(db, space.id, embedded)
            # (read again, as at a start: the cached vectors of the chunks go to the matrix)
            self.vectors = VectorStore(cfg.data_dir)
            self.space = self.vectors.open(db, model, probe)
        finally:
            db.close()
        self.embedded = len(self.space.vectors)
        self.embedder = embedder
        self.engines = FakeEngines(embedder, model)
        reads = ReadPool(cfg.db_path)
        self.searcher = Searcher(cfg, self.engines, self.vectors)
        self.parts = Parts(cfg, reads, indexer, self.engines, self.vectors, None, None,
                           self.searcher, request_stop=lambda: None)
        self.ops = SearchOps(self.parts, StatusOps(self.parts), Results(self.parts))

    @property
    def coverage(self) -> float:
        return self.embedded / self.chunks

    def search(self, query: str, k: int = 10, mode: str = "hybrid", group: str = "note",
               **kw) -> dict:
        """The search op's reply, as a client gets it."""
        return self.ops.cmd_search(query, k, mode, None, None, 0, group=group, **kw)

    def path(self, rel: str) -> str:
        return str(self.vault / rel)
