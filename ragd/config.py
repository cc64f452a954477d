"""Reading and checking ragd's configuration.

The documented default configuration is ``config.toml`` at the repository root; every key it
shows is declared in :data:`SCHEMA` below. Keep the two in step (tests/test_config.py checks
that the documented file loads and names every key).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragd import protocol


class ConfigError(Exception):
    """The configuration cannot be used. The message names the file and the key."""


class ReloadError(Exception):
    """A reload cannot be applied (the file cannot be read, or it would remove every source);
    the daemon goes on with the config it has."""


SOURCE_KINDS = ("obsidian", "folder")
LOG_LEVELS = ("debug", "info", "warning", "error")

# table -> key -> (type, default). A default of None means "computed" (see resolve_paths).
SCHEMA: dict[str, dict[str, tuple[type | tuple[type, ...], Any]]] = {
    "daemon": {
        "data_dir": (str, ""),
        "socket": (str, ""),
        "log_level": (str, "info"),
        "max_connections": (int, 256),
    },
    "index": {
        "chunk_tokens": (int, 0),
        "chunk_overlap": (int, 48),
        "max_file_bytes": (int, 10 * 1024 * 1024),
    },
    "search": {
        "k": (int, 10),
        "candidates": (int, 100),
        "mode": (str, "hybrid"),
        "rrf_k": (int, 60),
        "fusion": (str, "convex"),
        "vector_share": (float, 0.6),
        "note_weight": (float, 0.25),
        "feedback_chunks": (int, 5),
        "feedback_weight": (float, 0.5),
        "min_similarity": (float, -1.0),
        "rerank": (bool, True),
        "bm25_index": (str, "tantivy"),
    },
    "engines": {
        "llama_server": (str, ""),
        "threads": (int, 2),
        "startup_timeout": (float, 60.0),
        "max_restarts": (int, 5),
        "restart_window": (float, 300.0),
        "health_interval": (float, 30.0),
        "failed_retry": (float, 300.0),
    },
    "embedding": {
        "model": (str, "all-MiniLM-L6-v2"),
        "pooling": (str, ""),
        "query_prefix": (str, None),
        "doc_prefix": (str, None),
        "batch_tokens": (int, 1024),
        "vector_dtype": (str, "float32"),
        "query_engine": (bool, True),
        "ann_threshold": (int, 50000),
    },
    "models": {
        "hub_url": (str, ""),
    },
    "gc": {
        "grace_hours": (float, 24.0),
        "interval_hours": (float, 1.0),
    },
    "watch": {
        "enabled": (bool, True),
        "quiet_ms": (int, 250),
        "scan_interval": (float, 600.0),
        "unwatched_scan_interval": (float, 30.0),
    },
    "buffers": {
        "max_per_client": (int, 16),
    },
    "reranker": {
        "model": (str, ""),
        "pooling": (str, ""),
        "top": (int, 20),
        "budget_ms": (int, 4000),
    },
    "store": {
        "backend": (str, "sqlite"),
        "uri": (str, ""),
        "collection": (str, "ragd"),
        "token": (str, ""),
    },
    "generator": {
        "model": (str, ""),
        "context": (int, 4096),
        "max_tokens": (int, 512),
        "notes": (int, 6),
        "temperature": (float, 0.0),
    },
}
SEARCH_MODES = ("hybrid", "vector", "bm25")
FUSIONS = ("convex", "rrf")
STORE_BACKENDS = ("sqlite", "milvus")
BM25_INDEXES = ("tantivy", "fts5")
POOLINGS = ("", "mean", "cls", "last", "rank", "none")
SOURCE_SCHEMA: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "name": (str, None),
    "path": (str, None),
    "kind": (str, "folder"),
    "include": (list, None),
    "exclude": (list, []),
}
DEFAULT_INCLUDE = {
    "obsidian": ["**/*.md"],
    "folder": ["**/*.md", "**/*.markdown", "**/*.txt", "**/*.rst", "**/*.pdf"],
}


@dataclass(frozen=True)
class Source:
    name: str
    root: Path
    kind: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]


@dataclass
class Config:
    path: Path | None
    data_dir: Path
    socket: Path
    log_level: str = "info"
    max_connections: int = 256
    chunk_tokens: int = 256
    chunk_overlap: int = 48
    max_file_bytes: int = 10 * 1024 * 1024
    search_k: int = 10
    search_candidates: int = 100
    search_mode: str = "hybrid"
    rrf_k: int = 60
    fusion: str = "convex"
    vector_share: float = 0.6
    note_weight: float = 0.25
    feedback_chunks: int = 5
    feedback_weight: float = 0.5
    min_similarity: float = -1.0
    rerank: bool = True
    bm25_index: str = "tantivy"
    llama_server: str = ""
    engine_threads: int = 2
    engine_startup_timeout: float = 60.0
    engine_max_restarts: int = 5
    engine_restart_window: float = 300.0
    engine_health_interval: float = 30.0
    engine_failed_retry: float = 300.0
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_pooling: str = ""
    embedding_query_prefix: str | None = None
    embedding_doc_prefix: str | None = None
    embed_batch_tokens: int = 1024
    vector_dtype: str = "float32"
    query_engine: bool = True
    ann_threshold: int = 50000
    max_buffers_per_client: int = 16
    reranker_model: str = ""
    reranker_pooling: str = ""
    rerank_top: int = 20
    rerank_budget_ms: int = 4000
    generator_model: str = ""
    generator_context: int = 4096
    generator_max_tokens: int = 512
    generator_notes: int = 6
    generator_temperature: float = 0.0
    hub_url: str = ""
    store_backend: str = "sqlite"
    store_uri: str = ""
    store_collection: str = "ragd"
    store_token: str = ""
    gc_grace_hours: float = 24.0
    gc_interval_hours: float = 1.0
    watch: bool = True
    watch_quiet_ms: int = 250
    scan_interval: float = 600.0
    unwatched_scan_interval: float = 30.0
    sources: list[Source] = field(default_factory=list)
    # Does the file say which sources there are (`[[sources]]` tables, or `sources = []`)? A
    # file that says nothing of them (empty, cut short) is no reason to remove them all.
    sources_listed: bool = False

    def pooling_for(self, role: str) -> str | None:
        return {"embedding": self.embedding_pooling,
                "reranker": self.reranker_pooling}.get(role) or None

    @property
    def db_path(self) -> Path:
        return self.data_dir / "index.sqlite3"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "ragd.log"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "ragd.lock"

    def source(self, name: str) -> Source | None:
        return next((s for s in self.sources if s.name == name), None)

    def named(self, name: str) -> Source | None:
        """The source a user means by `name`: the one of that name, else the one whose name
        differs only in case ("notes" for "Notes"; not when two do)."""
        exact = self.source(name)
        if exact is not None:
            return exact
        folded = [s for s in self.sources if s.name.casefold() == name.casefold()]
        return folded[0] if len(folded) == 1 else None

    @property
    def overlaps(self) -> list[str]:
        """A source whose folder is inside another's: a file both include is indexed, and
        found, twice. Not an error (notes in one, PDFs in the other is fine), but said
        (`ragctl sources add` refuses it)."""
        roots = [(s, Path(os.path.realpath(s.root))) for s in self.sources]
        return [f"source {a.name!r} ({a.root}) is inside source {b.name!r}: a file both include "
                f"is indexed, and found, twice (exclude it from {b.name!r}, or remove one)"
                for a, ra in roots for b, rb in roots
                if a is not b and ra.is_relative_to(rb) and (ra != rb or a.name > b.name)]


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "a list", dict: "a table"}


def _type_name(value: Any) -> str:
    return {str: "string", int: "integer", float: "float", bool: "boolean", list: "list",
            dict: "table"}.get(type(value), type(value).__name__)


def _check(where: str, key: str, value: Any, expected) -> None:
    # bool is a subclass of int; a config saying `chunk_tokens = true` is a mistake. An integer
    # is a fine float.
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return
    ok = isinstance(value, expected) and not (expected in (int, float) and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{where}: {key} must be {_TYPE_NAMES.get(expected, expected)}, "
                          f"got {_type_name(value)} {value!r}")


def load(cli_path: str | os.PathLike | None = None, env=os.environ,
         extra_sources: list[str] | None = None) -> Config:
    """Find, read and check the configuration (see :func:`protocol.find_config`)."""
    path = protocol.find_config(cli_path, env)
    raw: dict = {}
    if path is not None:
        if (why := protocol.not_a_file(path)):
            raise ConfigError(why)
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except UnicodeDecodeError as e:  # (tomllib reads UTF-8 only)
            raise ConfigError(f"{path}: not valid TOML: {protocol.not_utf8(e)}") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    return from_dict(raw, path, env, extra_sources or [])


def from_dict(raw: dict, path: Path | None, env=os.environ, extra_sources=()) -> Config:
    where = str(path) if path else "built-in defaults"
    values: dict[str, dict[str, Any]] = {}
    for key in raw:
        if key not in SCHEMA and key != "sources":
            raise ConfigError(f"{where}: unknown key '{key}' (known: "
                              f"{', '.join(sorted([*SCHEMA, 'sources']))})")
    for table, keys in SCHEMA.items():
        given = raw.get(table, {})
        _check(where, table, given, dict)
        for key in given:
            if key not in keys:
                raise ConfigError(f"{where}: unknown key '{table}.{key}' (known: "
                                  f"{', '.join(f'{table}.{k}' for k in keys)})")
        values[table] = {}
        for key, (typ, default) in keys.items():
            value = given.get(key, default)
            if value is not None:  # None: absent and computed later (e.g. registry prefixes)
                _check(where, f"{table}.{key}", value, typ)
                if typ is float:
                    value = float(value)
            values[table][key] = value

    d = values["daemon"]
    if d["log_level"] not in LOG_LEVELS:
        raise ConfigError(f"{where}: daemon.log_level must be one of {', '.join(LOG_LEVELS)}, "
                          f"got {d['log_level']!r}")
    for table, key, allowed in (("search", "mode", SEARCH_MODES),
                                ("search", "fusion", FUSIONS),
                                ("embedding", "vector_dtype", ("float32", "float16")),
                                ("embedding", "pooling", POOLINGS),
                                ("reranker", "pooling", POOLINGS)):
        if values[table][key] not in allowed:
            raise ConfigError(f"{where}: {table}.{key} must be one of "
                              f"{', '.join(repr(a) for a in allowed)}, got {values[table][key]!r}")
    for table, key, low in (("daemon", "max_connections", 1), ("index", "chunk_tokens", 0),
                            ("index", "chunk_overlap", 0),
                            ("index", "max_file_bytes", 1), ("search", "k", 1),
                            ("search", "candidates", 1), ("search", "rrf_k", 1),
                            ("search", "feedback_chunks", 0),
                            ("search", "feedback_weight", 0),
                            ("engines", "threads", 1), ("engines", "startup_timeout", 1),
                            ("engines", "max_restarts", 1), ("engines", "restart_window", 1),
                            ("engines", "health_interval", 0.5),
                            ("engines", "failed_retry", 1),
                            ("buffers", "max_per_client", 1),
                            ("embedding", "ann_threshold", 0),
                            ("embedding", "batch_tokens", 1), ("reranker", "top", 1),
                            ("reranker", "budget_ms", 1), ("watch", "quiet_ms", 0),
                            ("generator", "context", 512), ("generator", "max_tokens", 1),
                            ("generator", "notes", 1), ("generator", "temperature", 0),
                            ("gc", "grace_hours", 0), ("gc", "interval_hours", 0.01),
                            ("watch", "scan_interval", 1),
                            ("watch", "unwatched_scan_interval", 1)):
        if values[table][key] < low:
            raise ConfigError(f"{where}: {table}.{key} must be at least {low}, "
                              f"got {values[table][key]}")
    if not 0.0 <= values["search"]["vector_share"] <= 1.0:
        raise ConfigError(f"{where}: search.vector_share must be between 0 and 1, "
                          f"got {values['search']['vector_share']}")
    if not 0.0 <= values["search"]["note_weight"] <= 10.0:
        raise ConfigError(f"{where}: search.note_weight must be between 0 and 10, "
                          f"got {values['search']['note_weight']}")
    data_dir, sock = protocol.resolve_paths(d, env)
    if len(os.fsencode(sock)) > 100:
        raise ConfigError(f"{where}: daemon.socket: path {sock} is too long for a Unix socket "
                          f"(at most 100 bytes); set a shorter one")

    raw_sources = raw.get("sources", [])
    _check(where, "sources", raw_sources, list)
    sources = [_source(where, i, s) for i, s in enumerate(raw_sources)]
    for i, p in enumerate(extra_sources):
        sources.append(_source_from_cli(where, p, i))
    seen: set[str] = set()
    for s in sources:
        if s.name in seen:
            raise ConfigError(f"{where}: two sources are named {s.name!r}; names must be unique")
        seen.add(s.name)

    if values["engines"]["llama_server"]:
        _existing_file(where, "engines.llama_server", values["engines"]["llama_server"])
    se, en, em, rr = values["search"], values["engines"], values["embedding"], values["reranker"]
    ge, st = values["generator"], values["store"]
    if st["backend"] not in STORE_BACKENDS:
        raise ConfigError(f"{where}: store.backend must be one of {', '.join(STORE_BACKENDS)}, "
                          f"got {st['backend']!r}")
    if se["bm25_index"] not in BM25_INDEXES:
        raise ConfigError(f"{where}: search.bm25_index must be one of {', '.join(BM25_INDEXES)}, "
                          f"got {se['bm25_index']!r}")
    if not st["collection"].replace("_", "").isalnum() or not st["collection"][:1].isalpha():
        raise ConfigError(f"{where}: store.collection must be letters, digits and _, starting "
                          f"with a letter; got {st['collection']!r}")
    if ge["max_tokens"] >= ge["context"]:
        raise ConfigError(f"{where}: generator.max_tokens ({ge['max_tokens']}) must be smaller "
                          f"than generator.context ({ge['context']}): the prompt needs room too")
    return Config(path=path, data_dir=data_dir, socket=sock, log_level=d["log_level"],
                  max_connections=d["max_connections"],
                  chunk_tokens=values["index"]["chunk_tokens"] or _auto_budget(
                      values["embedding"]["model"]),
                  chunk_overlap=values["index"]["chunk_overlap"],
                  max_file_bytes=values["index"]["max_file_bytes"],
                  search_k=se["k"], search_candidates=se["candidates"], search_mode=se["mode"],
                  rrf_k=se["rrf_k"], fusion=se["fusion"], vector_share=se["vector_share"],
                  note_weight=se["note_weight"],
                  feedback_chunks=se["feedback_chunks"],
                  feedback_weight=se["feedback_weight"], min_similarity=se["min_similarity"],
                  rerank=se["rerank"],
                  bm25_index=se["bm25_index"],
                  llama_server=en["llama_server"], engine_threads=en["threads"],
                  engine_startup_timeout=en["startup_timeout"],
                  engine_max_restarts=en["max_restarts"],
                  engine_restart_window=en["restart_window"],
                  engine_health_interval=en["health_interval"],
                  engine_failed_retry=en["failed_retry"],
                  embedding_model=em["model"], embedding_pooling=em["pooling"],
                  embedding_query_prefix=em["query_prefix"], embedding_doc_prefix=em["doc_prefix"],
                  embed_batch_tokens=em["batch_tokens"], vector_dtype=em["vector_dtype"],
                  query_engine=em["query_engine"], ann_threshold=em["ann_threshold"],
                  max_buffers_per_client=values["buffers"]["max_per_client"],
                  reranker_model=rr["model"], reranker_pooling=rr["pooling"], rerank_top=rr["top"],
                  rerank_budget_ms=rr["budget_ms"], hub_url=values["models"]["hub_url"],
                  generator_model=ge["model"], generator_context=ge["context"],
                  generator_max_tokens=ge["max_tokens"], generator_notes=ge["notes"],
                  generator_temperature=ge["temperature"],
                  store_backend=st["backend"], store_uri=st["uri"],
                  store_collection=st["collection"], store_token=st["token"],
                  gc_grace_hours=values["gc"]["grace_hours"],
                  gc_interval_hours=values["gc"]["interval_hours"],
                  watch=values["watch"]["enabled"], watch_quiet_ms=values["watch"]["quiet_ms"],
                  scan_interval=values["watch"]["scan_interval"],
                  unwatched_scan_interval=values["watch"]["unwatched_scan_interval"],
                  sources=sources, sources_listed="sources" in raw)


def _auto_budget(model: str) -> int:
    """Chunk budget fitted to the embedding model: half its context (room for the header and
    the estimate's error), between 128 and 512 tokens; 256 without a registry model."""
    from ragd.engines.models import REGISTRY  # late: config must not pull in the engines
    spec = REGISTRY.get(model)
    return max(128, min(512, spec.context // 2)) if spec else 256


def _source(where: str, i: int, s: Any) -> Source:
    label = f"sources[{i}]"
    _check(where, label, s, dict)
    for key in s:
        if key not in SOURCE_SCHEMA:
            raise ConfigError(f"{where}: unknown key '{label}.{key}' (known: "
                              f"{', '.join(SOURCE_SCHEMA)})")
    for key in ("name", "path"):
        if key not in s:
            raise ConfigError(f"{where}: {label} needs a '{key}'")
    for key, (typ, _) in SOURCE_SCHEMA.items():
        if key in s:
            _check(where, f"{label}.{key}", s[key], typ)
    name = s["name"].strip()
    if not name or "/" in name:
        raise ConfigError(f"{where}: {label}.name must be a non-empty name without '/', "
                          f"got {s['name']!r}")
    kind = s.get("kind", "folder")
    if kind not in SOURCE_KINDS:
        raise ConfigError(f"{where}: {label}.kind must be one of {', '.join(SOURCE_KINDS)}, "
                          f"got {kind!r}")
    include = s.get("include") or DEFAULT_INCLUDE[kind]
    exclude = s.get("exclude", [])
    for key, globs in (("include", include), ("exclude", exclude)):
        for g in globs:
            if not isinstance(g, str) or not g:
                raise ConfigError(f"{where}: {label}.{key} must be a list of glob strings, "
                                  f"got {g!r}")
    # a folder that is not there (yet) is not an error: an unmounted disk at login must not
    # stop the daemon; the watcher reports the source and watches it once the folder exists
    root = _existing_dir(where, f"{label}.path", s["path"], missing_ok=True)
    return Source(name=name, root=root, kind=kind, include=tuple(include), exclude=tuple(exclude))


def _source_from_cli(where: str, path: str, i: int) -> Source:
    root = _existing_dir("--source", "path", str(Path(path).expanduser().absolute()))
    kind = "obsidian" if (root / ".obsidian").is_dir() else "folder"
    return Source(name=root.name or f"source{i}", root=root, kind=kind,
                  include=tuple(DEFAULT_INCLUDE[kind]), exclude=())


def _existing_file(where: str, key: str, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"{where}: {key}: {path} does not exist")
    if not os.access(path, os.X_OK):
        raise ConfigError(f"{where}: {key}: {path} is not executable")
    return path


def _existing_dir(where: str, key: str, value: str, missing_ok: bool = False) -> Path:
    root = Path(value).expanduser()
    if not root.is_absolute():
        raise ConfigError(f"{where}: {key}: {value!r} must be an absolute path (or start with ~)")
    if not root.exists():
        if missing_ok:
            return root.resolve()
        raise ConfigError(f"{where}: {key}: folder {root} does not exist")
    if not root.is_dir():
        raise ConfigError(f"{where}: {key}: {root} is not a folder")
    return root.resolve()
