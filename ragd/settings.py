"""Every setting of ragd's config file, declared once.

A :class:`Setting` names its table and key in the file, the field of :class:`ragd.config.Config`
that holds it, its type and default, the values it may take, whether a reload applies it at
once, and one line for the reference. From this table come the config's fields, the check of a
file (unknown keys, wrong types, choices, bounds: ragd/config.py), what a reload applies and
what it says needs a restart (ragd/runtime.py), and docs/configuration.md::

    python3 -m ragd.settings --markdown > docs/configuration.md

tests/test_config.py checks that the committed reference is the generated one and that
config.toml, the documented default file, shows exactly these keys with these defaults.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from ragd.protocol import MAX_K

# What a reload does with a changed setting: apply it at once, say that it needs a restart, or
# (the embedding model) switch to it without downtime (ragd/index/switch.py).
LIVE, RESTART, MODEL = "live", "restart", "model"


@dataclass(frozen=True)
class Setting:
    section: str  # the table in the file: [search]
    key: str  # the key in that table: k
    field: str  # its name in Config: search_k
    type: type  # what the file must give (an integer is a fine float)
    default: Any  # None: absent, computed (the registry's prefixes)
    reload: str  # LIVE, RESTART or MODEL
    doc: str
    low: float | None = None  # at least this
    high: float | None = None  # with low: between low and high
    choices: tuple[str, ...] = ()
    # how an error shows the choices: "'convex', 'rrf'" (quoted), or "sqlite, milvus"
    quote_choices: bool = True

    @property
    def name(self) -> str:
        """The setting as the file and the reload's reply name it: search.k."""
        return f"{self.section}.{self.key}"

    def problem(self, value: Any) -> str | None:
        """What is wrong with a value of the right type (None: nothing)."""
        if self.choices and value not in self.choices:
            shown = ", ".join(repr(c) if self.quote_choices else c for c in self.choices)
            return f"{self.name} must be one of {shown}, got {value!r}"
        if self.high is not None and not self.low <= value <= self.high:
            return f"{self.name} must be between {self.low} and {self.high}, got {value}"
        if self.low is not None and self.high is None and value < self.low:
            return f"{self.name} must be at least {self.low}, got {value}"
        return None


S = Setting
POOLINGS = ("", "mean", "cls", "last", "rank", "none")

SETTINGS: tuple[Setting, ...] = (
    S("daemon", "data_dir", "data_dir", str, "", RESTART,
      'Where the index, the log and the lock live; "" is `$XDG_DATA_HOME/ragd`.'),
    S("daemon", "socket", "socket", str, "", RESTART,
      'The Unix socket clients connect to; "" is `$XDG_RUNTIME_DIR/ragd/ragd.sock`, else '
      '`<data_dir>/ragd.sock`.'),
    S("daemon", "log_level", "log_level", str, "info", LIVE,
      "How much the log says.", choices=("debug", "info", "warning", "error"),
      quote_choices=False),
    S("daemon", "max_connections", "max_connections", int, 256, RESTART,
      'Clients connected at once; one more is answered "ragd is busy" and closed.', low=1),

    S("index", "chunk_tokens", "chunk_tokens", int, 0, LIVE,
      "Chunk size in estimated tokens; 0 fits it to the embedding model (half its context, "
      "128 to 512). A change re-chunks every file.", low=0),
    S("index", "chunk_overlap", "chunk_overlap", int, 24, LIVE,
      "Tokens a chunk may repeat from the one before it when a section is split. A change "
      "re-chunks every file.", low=0),
    S("index", "max_file_bytes", "max_file_bytes", int, 10 * 1024 * 1024, LIVE,
      "Files larger than this (bytes) are skipped with that reason.", low=1),

    S("search", "k", "search_k", int, 10, LIVE,
      "Results returned when a request does not say (ragctl search -k).", low=1,
      high=MAX_K),
    S("search", "candidates", "search_candidates", int, 100, LIVE,
      "Candidates each ranker (BM25, vectors) contributes before fusion.", low=1),
    S("search", "mode", "search_mode", str, "hybrid", LIVE,
      "Ranking when a request does not say.", choices=("hybrid", "vector", "bm25")),
    S("search", "rrf_k", "rrf_k", int, 60, LIVE,
      'The k of Reciprocal Rank Fusion (fusion = "rrf", and the first fusion that picks the '
      "feedback chunks).", low=1),
    S("search", "fusion", "fusion", str, "convex", LIVE,
      'How hybrid search fuses its rankings: "convex" mixes the scaled scores, "rrf" sums '
      "1/(rrf_k + rank).", choices=("convex", "rrf")),
    S("search", "vector_share", "vector_share", float, 0.6, LIVE,
      "Convex fusion: the weight of the cosine against the BM25 score.", low=0, high=1),
    S("search", "note_weight", "note_weight", float, 0.25, LIVE,
      "Weight of a note's whole-text BM25 score beside its best chunk; 0 turns it off.",
      low=0, high=10),
    S("search", "feedback_chunks", "feedback_chunks", int, 5, LIVE,
      "The first fusion's best chunks whose vectors are added to the query's; 0 turns "
      "feedback off.", low=0),
    S("search", "feedback_weight", "feedback_weight", float, 0.5, LIVE,
      "The weight of those feedback vectors.", low=0),
    S("search", "min_similarity", "min_similarity", float, -1.0, LIVE,
      'Below this best cosine a query answers "nothing relevant"; -1 uses the model\'s '
      "measured default."),
    S("search", "rerank", "rerank", bool, True, LIVE,
      "Rerank the fused top candidates with the reranker, when one is configured."),
    S("search", "bm25_index", "bm25_index", str, "tantivy", RESTART,
      'What serves the BM25 ranking: "tantivy" (an index beside SQLite) or "fts5" '
      "(SQLite's own).", choices=("tantivy", "fts5"), quote_choices=False),

    S("engines", "llama_server", "llama_server", str, "", RESTART,
      'A native llama.cpp llama-server binary to run the models with; "" runs the bundled '
      "engine."),
    S("engines", "threads", "engine_threads", int, 0, RESTART,
      "CPU threads per engine; 0 uses every core ragd may run on.", low=0),
    S("engines", "startup_timeout", "engine_startup_timeout", float, 60.0, RESTART,
      "Seconds an engine may take to become healthy before it counts as failed.", low=1),
    S("engines", "max_restarts", "engine_max_restarts", int, 5, RESTART,
      "Failures within restart_window after which an engine is marked failed.", low=1),
    S("engines", "restart_window", "engine_restart_window", float, 300.0, RESTART,
      "Seconds over which an engine's failures are counted.", low=1),
    S("engines", "health_interval", "engine_health_interval", float, 30.0, RESTART,
      "Seconds between /health checks of a running engine (they find one that hangs).",
      low=0.5),
    S("engines", "failed_retry", "engine_failed_retry", float, 300.0, RESTART,
      "Longest wait (seconds) before a failed engine is tried again; a reload tries it at "
      "once.", low=1),

    S("embedding", "model", "embedding_model", str, "all-MiniLM-L6-v2", MODEL,
      'A registry name or a path to a .gguf file; "" turns dense search off (BM25 only).'),
    S("embedding", "pooling", "embedding_pooling", str, "", MODEL,
      'Pooling of a .gguf given by path; "" is the registry\'s, else "mean".',
      choices=POOLINGS),
    S("embedding", "query_prefix", "embedding_query_prefix", str, None, MODEL,
      "Text put before queries when embedding them; left out, the registry's."),
    S("embedding", "doc_prefix", "embedding_doc_prefix", str, None, MODEL,
      "Text put before documents when embedding them; left out, the registry's."),
    S("embedding", "batch_tokens", "embed_batch_tokens", int, 1024, RESTART,
      "Tokens per embedding request; small batches keep a query from waiting.", low=1),
    S("embedding", "vector_dtype", "vector_dtype", str, "float32", RESTART,
      'Vectors in memory: "float32", or "float16" for half the memory.',
      choices=("float32", "float16")),
    S("embedding", "query_engine", "query_engine", bool, True, RESTART,
      "A second, small engine that embeds only queries, so a search never waits behind bulk "
      "embedding."),
    S("embedding", "ann_threshold", "ann_threshold", int, 50000, RESTART,
      "From this many vectors on, vector search goes through an HNSW graph; 0 = always exact. "
      "Checked at every start (a saved graph under it is not used).",
      low=0),

    S("models", "hub_url", "hub_url", str, "", LIVE,
      'Where `ragctl models pull` downloads from; "" is `$HF_ENDPOINT`, else huggingface.co.'),

    S("gc", "grace_hours", "gc_grace_hours", float, 24.0, LIVE,
      "How long unused cache entries, and a removed source's files, are kept.", low=0),
    S("gc", "interval_hours", "gc_interval_hours", float, 1.0, LIVE,
      "How often the daemon sweeps (ragctl gc sweeps now).", low=0.01),

    S("watch", "enabled", "watch", bool, True, RESTART,
      "Watch the sources (inotify) and re-index a file once it settles; off: scans only."),
    S("watch", "quiet_ms", "watch_quiet_ms", int, 250, LIVE,
      "A file's events are coalesced until it has been quiet this long.", low=0),
    S("watch", "scan_interval", "scan_interval", float, 600.0, LIVE,
      "Seconds between reconciliation scans, which catch what watching missed.", low=1),
    S("watch", "unwatched_scan_interval", "unwatched_scan_interval", float, 30.0, LIVE,
      "Seconds between scans of a source inotify cannot fully watch.", low=1),

    S("buffers", "max_per_client", "max_buffers_per_client", int, 16, LIVE,
      "Unsaved editor buffers one connected editor may push at once.", low=1),

    S("reranker", "model", "reranker_model", str, "", RESTART,
      'A cross-encoder: a registry name or a path to a .gguf file; "" = no reranking.'),
    S("reranker", "pooling", "reranker_pooling", str, "", RESTART,
      'Pooling of a reranker given by path ("rank" by default).', choices=POOLINGS),
    S("reranker", "top", "rerank_top", int, 20, LIVE,
      "How many of the fused candidates are reranked.", low=1),
    S("reranker", "budget_ms", "rerank_budget_ms", int, 4000, LIVE,
      "Time budget of a rerank (ms); over it, search returns the fused order and says so.",
      low=1),

    S("store", "backend", "store_backend", str, "sqlite", RESTART,
      'Where search reads its rankings from: "sqlite", or "milvus" (pip install '
      "'ragd[milvus]').", choices=("sqlite", "milvus"), quote_choices=False),
    S("store", "uri", "store_uri", str, "", RESTART,
      'Milvus: "" is Milvus Lite in `<data_dir>/milvus.db`, else a server\'s URL.'),
    S("store", "collection", "store_collection", str, "ragd", RESTART,
      "Milvus: collection names start with this (letters, digits and _)."),
    S("store", "token", "store_token", str, "", RESTART,
      'Milvus: a server\'s credentials, "user:password" or an API key ("": none).'),
    S("store", "local_vectors", "store_local_vectors", bool, False, RESTART,
      "Milvus: also keep every vector in ragd's memory, so dense search answers while Milvus "
      "is down or filling; false: ragd keeps only which chunks have one."),

    S("generator", "model", "generator_model", str, "", RESTART,
      'A chat model for ragctl ask: a registry name or a GGUF path; "" = ask is unavailable.'),
    S("generator", "context", "generator_context", int, 4096, RESTART,
      "Tokens of context the engine is started with (prompt and answer together).", low=512),
    S("generator", "max_tokens", "generator_max_tokens", int, 512, LIVE,
      "Longest answer, in tokens, when a request does not say; less than context.", low=1),
    S("generator", "notes", "generator_notes", int, 6, LIVE,
      "At most this many retrieved notes go into the prompt.", low=1),
    S("generator", "temperature", "generator_temperature", float, 0.0, LIVE,
      "Sampling temperature; 0 always takes the most likely token.", low=0),
)


@dataclass(frozen=True)
class SourceKey:
    key: str
    type: type
    default: Any  # None: required (name, path) or chosen by kind (include)
    doc: str


SOURCE_KEYS: tuple[SourceKey, ...] = (
    SourceKey("name", str, None, "Unique; shown in results and used by --source."),
    SourceKey("path", str, None, "The folder: absolute, or starting with ~."),
    SourceKey("kind", str, "folder", '"obsidian" (a vault) or "folder" (documents).'),
    SourceKey("include", list, None, "Globs relative to path; by default chosen by kind."),
    SourceKey("exclude", list, [], "Globs to leave out."),
)

SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s.section for s in SETTINGS))
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def fields(reload: str) -> dict[str, str]:
    """Config field -> the setting's name in the file, of the settings a reload treats so."""
    return {s.field: s.name for s in SETTINGS if s.reload == reload}


def _shown(value: Any) -> str:
    """A default as the file writes it."""
    if value is None:
        return "(computed)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


_RELOAD_SHOWN = {LIVE: "live", RESTART: "restart", MODEL: "live (model switch)"}


def _allowed(s: Setting) -> str:
    if s.choices:
        return ", ".join(json.dumps(c) for c in s.choices)
    if s.type is bool:
        return "true, false"
    if s.high is not None:
        return f"{s.low} to {s.high}"
    if s.low is not None:
        return f"≥ {s.low}"
    return ""


def markdown() -> str:
    """docs/configuration.md: every setting, its default, what a reload does with it."""
    intro = ("Generated from ragd/settings.py by `python3 -m ragd.settings --markdown`; "
             "do not edit by hand (tests/test_config.py checks it). config.toml, the documented "
             "default file, explains each setting at more length.")
    lookup = ("ragd reads `--config PATH`, else `$RAGD_CONFIG`, else "
              "`$XDG_CONFIG_HOME/ragd/config.toml`; without one it runs on these defaults. "
              "A wrong key or type stops ragd at start-up, and a reload with one is refused, "
              "with an error naming the key and the file.")
    reload = ("*Reload*: `live` is applied by `ragctl reload` (or SIGHUP) at once; `restart` is "
              "named in the reload's `restart_needed` and takes effect at the next start; "
              "`live (model switch)` builds the new model's vectors beside the ones in use, "
              "which answer until the switch is complete (a model named while it was \"\", "
              "dense search off, needs a restart).")
    out = ["# Configuration reference", "", intro, "", lookup, "", reload, ""]
    for section in SECTIONS:
        out += [f"## [{section}]", "", "| key | default | allowed | reload | what it does |",
                "|---|---|---|---|---|"]
        for s in SETTINGS:
            if s.section == section:
                doc = s.doc.replace("|", "\\|")
                out.append(f"| `{s.key}` | `{_shown(s.default)}` | {_allowed(s)} | "
                           f"{_RELOAD_SHOWN[s.reload]} | {doc} |")
        out.append("")
    sources = ("One table per folder to index; a reload applies additions, removals and changes "
               "at once. A reload of a file that names no source while sources are configured "
               "is refused, unless it says `sources = []`.")
    out += ["## [[sources]]", "", sources, "", "| key | default | what it is |",
            "|---|---|---|"]
    for k in SOURCE_KEYS:
        default = "required" if k.key in ("name", "path") else (
            "by kind" if k.default is None else f"`{_shown(k.default)}`")
        out.append(f"| `{k.key}` | {default} | {k.doc} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python3 -m ragd.settings --markdown > docs/configuration.md")
    sys.stdout.write(markdown())
