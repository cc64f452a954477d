"""The running parts the ops read, built by the Runtime and handed in (ragd/runtime.py): one
record, so that every family of ops sees the same ones. A reload replaces `cfg` whole, here
and in every other part that holds one (Runtime._swap); it is never changed in place.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ragd.config import Config
from ragd.ops.reads import ReadPool


@dataclass
class Parts:
    cfg: Config
    reads: ReadPool
    indexer: Any  # index/indexer.py: the writer
    engines: Any  # engines/manager.py
    vectors: Any  # index/vectorstore.py
    embedding: Any  # index/switch.py: the embedder(s), a model switch
    buffers: Any  # index/buffers.py: editors' unsaved buffers
    searcher: Any  # search/hybrid.py
    request_stop: Callable[[], None]
    reload: Callable[[], dict] | None = None
    backend: Any = None  # index/milvus.py, or None: SQLite + the local vector index
    text: Any = None  # index/textindex.py: the BM25 ranking's tantivy index, or None
    watcher: Any = None  # ingest/watcher.py, set once watching starts
    server: Any = None  # server.py: its connections, for status
    stopping: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.time)
    reload_failed: str | None = None  # why the last reload failed (until one works)
    # the settings changed in the config since the start that only a restart applies (the
    # last reload's)
    restart_needed: list[str] = field(default_factory=list)
    # found at start, shown in status' hints: a text, or a function giving it while it holds
    notices: list = field(default_factory=list)
    # why a model the config file names cannot serve (the last reload's: a refused embedding
    # model, a reranker or generator for the next start): said until a reload clears it, not
    # only in that reload's reply
    config_problems: list[str] = field(default_factory=list)

    @property
    def events(self):
        return self.indexer.events

    @property
    def embedder(self):
        """The embedder of the space in use (None until the embedding model is ready)."""
        return self.embedding.active if self.embedding is not None else None
