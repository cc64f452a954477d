"""``ragctl mcp``: a Model Context Protocol server on stdin/stdout that answers from ragd.

A thin bridge. Each tool call is one request to the running daemon over its socket, on a fresh
connection: a daemon started (or restarted) after this server is found on the next call, and
when none answers the call is a tool error that says so while this server keeps running.
Nothing is indexed, cached or ranked here.

Wire (the stdio transport): one JSON-RPC 2.0 message per line, UTF-8, on stdin and stdout;
stdout carries nothing else (logs go to stderr); end of stdin ends the server.

Both eras of the protocol are served by one process:

* the handshake era, 2025-06-18 and 2025-11-25: ``initialize`` settles a version for the
  process (the requested one if we speak it, else our newest, as those revisions prescribe),
  then requests carry no version;
* the stateless era, 2026-07-28: every request names its version and the client's capabilities
  in ``params._meta``; ``server/discover`` lists what we speak; results carry ``resultType``
  and our ``serverInfo``; a version we do not speak gets UnsupportedProtocolVersionError
  (-32022) with the versions we do.

A request with a modern ``_meta`` version is served statelessly even after an ``initialize``,
and an ``initialize`` is accepted after modern requests: the revisions allow a dual-era server
to serve both on one stream.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, BinaryIO, Callable

from ragd import protocol as P
from ragctl.paths import split_range

log = logging.getLogger("ragctl.mcp")

MODERN = ("2026-07-28",)
HANDSHAKE = ("2025-11-25", "2025-06-18")  # newest first: the counter-offer is HANDSHAKE[0]
SUPPORTED = MODERN + HANDSHAKE

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

# JSON-RPC 2.0 error codes, and the one MCP code we send.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_PROTOCOL_VERSION = -32022

MAX_LINE = P.MAX_FRAME  # a longer message is refused and skipped, never read whole
MAX_CALLS = 4  # tool calls served at once; more wait for a slot in their own threads
MAX_PENDING = 64  # tool calls in flight (served or waiting) before new ones are refused
EOF_GRACE = 10.0  # at end of input, calls in flight get this long to answer
CALL_TIMEOUT = 30.0  # seconds ragd may take to answer one op (search adds its own wait)
LIST_TTL_MS = 3_600_000  # tools/list and server/discover never change while we run

try:
    VERSION = metadata.version("ragd")
except metadata.PackageNotFoundError:  # run from a bare checkout
    VERSION = "unknown"

SERVER_INFO = {"name": "ragd", "title": "ragd: search your notes and documents",
               "version": VERSION}
CAPABILITIES = {"tools": {"listChanged": False}}
INSTRUCTIONS = (
    "ragd searches the user's own notes and documents on this machine (Obsidian vaults and "
    "folders), kept up to date as files change. Call `search` first (keywords and meaning, "
    "fused); every hit gives a file path and a line range. Call `get` with `path:START-END` "
    "to read a hit with what surrounds it, or a whole file (a long one comes in parts: each "
    "result names the lines to ask for next). `related` finds the notes closest "
    "to a note (or a passage). `status` lists the sources (their names restrict `search`) and "
    "says whether indexing has caught up.")


class RpcError(Exception):
    """A JSON-RPC error reply: the request itself was wrong (or we are)."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class ToolError(Exception):
    """A tool call that could not be answered: an ``isError`` result the model can act on."""


class BadArguments(ToolError):
    """Tool arguments that break the tool's inputSchema."""


# ---------------------------------------------------------------------------------------------
# Input schemas are checked here (no JSON Schema library in ragctl's dependencies). The checker
# knows the keywords below; _known_keywords() refuses a schema that uses another, at import.

_ANNOTATIONS = {"description", "title", "default", "examples"}
_CHECKED = {"type", "properties", "required", "additionalProperties", "items", "enum",
            "minimum", "maximum", "minLength"}
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    # (JSON Schema: 2.0 is an integer — a number with no fractional part)
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)
                          or isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _json_type(v: Any) -> str:
    return next((t for t in ("boolean", "integer", "number", "string", "array", "object", "null")
                 if _TYPES[t](v)), type(v).__name__)


def check(schema: dict, value: Any, where: str) -> None:
    """Raise BadArguments naming the first way `value` breaks `schema`."""
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in types):
            raise BadArguments(f"{where} must be {' or '.join(types)}, got {_json_type(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise BadArguments(f"{where} must be one of {', '.join(map(str, schema['enum']))}, "
                           f"got {value!r}")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            raise BadArguments(f"{where} must be at least {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            raise BadArguments(f"{where} must be at most {schema['maximum']}, got {value}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        raise BadArguments(f"{where} must not be empty" if schema["minLength"] == 1 else
                           f"{where} must be at least {schema['minLength']} characters long")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(schema["items"], item, f"{where}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise BadArguments(f"missing argument '{name}'")
        if schema.get("additionalProperties") is False:
            unknown = sorted(set(value) - set(props))
            if unknown:
                raise BadArguments(f"unknown argument(s) {', '.join(map(repr, unknown))}; it "
                                   f"takes {', '.join(props) or 'none'}")
        for name, sub in props.items():
            if name in value:
                check(sub, value[name], f"'{name}'")
                if sub.get("type") == "integer" and isinstance(value[name], float):
                    value[name] = int(value[name])  # as ragd takes it


def _known_keywords(schema: dict, where: str) -> None:
    unknown = set(schema) - _CHECKED - _ANNOTATIONS
    if unknown:
        raise AssertionError(f"{where}: check() does not know {sorted(unknown)}")
    for name, sub in schema.get("properties", {}).items():
        _known_keywords(sub, f"{where}.{name}")
    if "items" in schema:
        _known_keywords(schema["items"], f"{where}[]")


# ---------------------------------------------------------------------------------------------
# The daemon, one connection per call.

class Call:
    """One tool call in flight: cancelling it closes its connection to ragd."""

    def __init__(self):
        self.cancelled = False
        self._conn: P.Client | None = None
        self._lock = threading.Lock()

    def attach(self, conn: P.Client) -> None:
        with self._lock:
            self._conn = conn
            if self.cancelled:
                self._hang_up()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            self._hang_up()

    def _hang_up(self) -> None:
        if self._conn is not None:
            try:
                self._conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Daemon:
    """ragd as the tools see it: an op in, a result or a ToolError out."""

    def __init__(self, socket_opt: str | None, config_opt: str | None):
        self.socket_opt, self.config_opt = socket_opt, config_opt

    def path(self):
        # Looked up on every call, so a config written (or fixed) later is followed.
        try:
            return P.socket_path(self.socket_opt, self.config_opt)
        except (OSError, tomllib.TOMLDecodeError, P.ConfigUnreadable) as e:
            raise ToolError(f"cannot read the ragd config to find its socket: {e}") from None

    def call(self, call: Call, op: str, timeout: float = CALL_TIMEOUT, **args) -> Any:
        path = self.path()
        try:
            conn = P.Client(path, timeout=timeout)
        except P.NotRunning:
            raise ToolError(f"ragd is not running (no daemon at {path}). Start it with "
                            f"'ragctl start', then call this tool again.") from None
        except PermissionError:
            raise ToolError(f"permission denied on {path}: is ragd running as another "
                            f"user?") from None
        except OSError as e:
            raise ToolError(f"cannot reach ragd at {path}: {e}") from None
        call.attach(conn)
        try:
            return conn.call(op, **args)
        except P.DaemonError as e:
            raise ToolError(f"{e.message} ({e.code})") from None
        except TimeoutError:
            raise ToolError(f"ragd did not answer within {timeout:.0f} s") from None
        except (OSError, P.ProtocolError) as e:
            raise ToolError(f"lost the connection to ragd: {e}") from None
        finally:
            conn.close()


# ---------------------------------------------------------------------------------------------
# Tools. Each returns (structuredContent, readable text); a ToolError becomes an isError result.
# This bridge adds nothing the daemon cannot answer: each tool is one op (search, get, status,
# related).

@dataclass
class Tool:
    name: str
    title: str
    description: str
    input_schema: dict
    output_schema: dict
    run: Callable[[Daemon, Call, dict], tuple[dict, str]]
    annotations: dict = field(default_factory=lambda: {"readOnlyHint": True,
                                                       "openWorldHint": False})

    def listing(self) -> dict:
        return {"name": self.name, "title": self.title, "description": self.description,
                "inputSchema": self.input_schema, "outputSchema": self.output_schema,
                "annotations": {"title": self.title, **self.annotations}}


def _object(properties: dict, required=(), closed: bool = True) -> dict:
    schema: dict = {"type": "object", "properties": properties, "required": list(required)}
    if closed:
        schema["additionalProperties"] = False
    return schema


_STR, _INT, _NUM, _BOOL = ({"type": "string"}, {"type": "integer"}, {"type": "number"},
                           {"type": "boolean"})
_OPT_STR = {"type": ["string", "null"]}

# search's arguments, passed to the daemon's search op under the same names. The filters the
# second half of issue 12 brings (path, tag, since, before) are one entry each here, once the
# daemon's search op takes them.
SEARCH_ARGS: dict[str, dict] = {
    "query": {"type": "string", "minLength": 1,
              "description": "What to look for, in words; \"quoted phrases\" must match as "
                             "phrases. Both the words and their meaning count (hybrid)."},
    "k": {"type": "integer", "minimum": 1, "maximum": 50,
          "description": "How many results (default: the daemon's search.k, 10)."},
    "mode": {"type": "string", "enum": ["hybrid", "vector", "bm25"],
             "description": "hybrid (default): keywords and meaning fused; vector: meaning "
                            "only; bm25: keywords only."},
    "sources": {"type": "array", "items": {"type": "string"},
                "description": "Search only these sources (names, as the status tool lists "
                               "them)."},
    "rerank": {"type": "boolean",
               "description": "Reorder the top results with the cross-encoder, when one is "
                              "configured (default: the daemon's setting)."},
    "wait": {"type": "number", "minimum": 0, "maximum": 60,
             "description": "First wait up to this many seconds until files changed just "
                            "before are searchable (e.g. right after editing a note)."},
}

_HIT = _object({
    "path": {"type": "string", "description": "absolute path of the file"},
    "source": _STR,
    "line_start": {"type": "integer", "description": "first line of the passage, 1-based "
                                                      "(a page number for a PDF)"},
    "line_end": {"type": "integer", "description": "last line, inclusive"},
    "heading": {"type": ["string", "null"], "description": "Note title > H1 > H2"},
    "score": {"type": "number", "description": "higher is better"},
    "text": {"type": "string", "description": "the passage, as in the file"},
    "stale": {"type": "boolean", "description": "the file changed since it was indexed: the "
                                                "lines may have moved"},
}, required=("path", "source", "line_start", "line_end", "heading", "score", "text"),
    closed=False)

_SEARCH_HIT = _object({
    **_HIT["properties"],
    "title": {"type": "string", "description": "the note's title (a document's own title, "
                                               "else the file name)"},
    "match_lines": {"type": "array", "items": _INT,
                    "description": "the lines of the passage that hold the query's words "
                                   "(file line numbers; for a PDF, its page)"},
    "matches": {"type": "array", "items": _object({"line": _INT, "text": _STR},
                                                  required=("line", "text")),
                "description": "those lines and their text, as in the passage (none for a "
                               "PDF, whose match_lines are pages)"},
}, required=_HIT["required"], closed=False)

SEARCH_OUT = _object({
    "query": _STR,
    "mode": {"type": "string", "description": "the ranking actually used"},
    "degraded": {"type": "boolean", "description": "keywords only, as the embedding engine "
                                                   "is not ready (see reason)"},
    "reason": {**_OPT_STR, "description": "why degraded, or why there are no results"},
    "confidence": {"type": ["number", "null"],
                   "description": "0-1: how much of the query's distinctive vocabulary the "
                                  "best notes hold (null: the query has no content words)"},
    "low_confidence": {"type": "boolean",
                       "description": "the notes probably do not answer this: treat the "
                                      "results as weak"},
    "reranked": {"type": "boolean", "description": "the order is the cross-encoder's"},
    "rerank_reason": {"type": "string", "description": "why a rerank wanted (rerank: true, or "
                                                       "the daemon's default) did not happen"},
    "results": {"type": "array", "items": _SEARCH_HIT},
}, required=("query", "mode", "degraded", "results"), closed=False)


def run_search(daemon: Daemon, call: Call, args: dict) -> tuple[dict, str]:
    wanted = {name: args[name] for name in SEARCH_ARGS if name in args}
    res = daemon.call(call, "search", timeout=CALL_TIMEOUT + wanted.get("wait", 0), **wanted)
    hits = []
    for r in res["results"]:
        hit = {key: r[key] for key in _SEARCH_HIT["properties"] if key in r}
        hit["matches"] = _matches(r)
        hits.append(hit)
    out = {"query": res["query"], "mode": res["mode"], "degraded": bool(res.get("degraded")),
           "reason": res.get("reason"), "results": hits}
    # only what the daemon gave: rerank_reason says why a rerank wanted (asked for, or the
    # daemon's default with a reranker configured) did not happen, e.g. no reranker at all
    for key in ("confidence", "low_confidence", "reranked", "rerank_reason"):
        if key in res:
            out[key] = res[key]
    return out, search_text(out)


def _matches(r: dict) -> list[dict]:
    """The passage's lines that hold the query's words (the daemon's match_lines), with their
    text. A PDF's range counts pages: its match_lines name a page, not a line of `text`."""
    if r["path"].lower().endswith(".pdf"):
        return []
    lines = r["text"].split("\n")
    return [{"line": n, "text": lines[n - r["line_start"]]} for n in r.get("match_lines") or ()
            if 0 <= n - r["line_start"] < len(lines)]


def search_text(out: dict) -> str:
    lines = []
    if out["degraded"]:
        lines.append(f"(keyword search only: {out['reason'] or 'the embedding engine is down'})")
    if out.get("rerank_reason"):
        lines.append(f"(not reranked: {out['rerank_reason']})")
    if not out["results"]:
        why = out["reason"] if out["reason"] and not out["degraded"] else "nothing matched"
        lines.append(f"No results for {out['query']!r} ({why}).")
        return "\n".join(lines)
    if out.get("low_confidence"):
        conf = out.get("confidence")
        why = ("few of the query's distinctive words are in them" if conf is None or conf < 0.25
               else "no note is close in meaning, and only some of its words are in them")
        lines.append(f"(low confidence {conf}: the notes probably do not answer this; {why})")
    n = len(out["results"])
    lines.append(f"{n} result{'s' * (n != 1)} for {out['query']!r} ({out['mode']}):")
    for i, h in enumerate(out["results"], 1):
        # the heading path starts with the note's title; a document's own title (a PEP's
        # Title: header) may differ from it
        name = h.get("title") or ""
        heading = h["heading"] or ""
        head = heading if heading.startswith(name) else \
            f"{name} — {heading}" if heading else name
        stale = "" if not h.get("stale") else \
            "  (file changed since indexed: lines may have moved)" if os.path.exists(h["path"]) \
            else "  (file gone from disk since indexed)"
        lines += ["", f"[{i}] {h['path']}:{h['line_start']}-{h['line_end']}"
                      f"{' — ' + head if head else ''}  (score {h['score']:.4g}){stale}"]
        if h.get("matches"):
            lines += ["matching lines:"] + [f"  {m['line']}: {m['text'].strip()}"
                                            for m in h["matches"]] + ["passage:"]
        lines.append(h["text"])
    return "\n".join(lines)


GET_ARGS: dict[str, dict] = {
    "path": {"type": "string", "minLength": 1,
             "description": "Absolute path of a file inside a source, as search results give "
                            "it. Without line_start and line_end it may end in :START-END "
                            "(or :START, to the end) to pick lines, e.g. "
                            "/home/me/Notes/Plan.md:40-80."},
    "line_start": {"type": "integer", "minimum": 1,
                   "description": "First line, 1-based (default 1). For a PDF, a page."},
    "line_end": {"type": "integer", "minimum": 1,
                 "description": "Last line, inclusive (default: the end of the file)."},
}

# At most this much text per get: a whole file came back as one 76k-character result, more of
# an agent's context than a read should take. The rest is asked for by line range.
GET_MAX_CHARS = 20_000

GET_OUT = _object({
    "path": {"type": "string", "description": "the file's real path"},
    "source": _STR,
    "line_start": _INT,
    "line_end": {"type": "integer", "description": "the last line sent (0 for an empty "
                                                   "file)"},
    "lines_total": {"type": "integer", "description": "lines in the file (pages for a PDF)"},
    "text": _STR,
    "truncated": {"type": "boolean", "description": f"cut at {GET_MAX_CHARS:,} characters: "
                                                    f"'rest' is the range still to read"},
    "rest": {**_object({"line_start": _INT, "line_end": _INT},
                       required=("line_start", "line_end")),
             "description": "when truncated, the lines (pages) of the range asked for that "
                            "were not sent: ask for them, or a part of them"},
    "line_cut": {"type": "boolean", "description": "the one line sent is longer than the "
                                                   "limit and was cut"},
    "unit": {"type": "string", "enum": ["line", "page"]},
}, required=("path", "source", "line_start", "line_end", "lines_total", "text", "truncated"),
    closed=False)


def run_get(daemon: Daemon, call: Call, args: dict) -> tuple[dict, str]:
    path, start, end = args["path"], args.get("line_start"), args.get("line_end")
    if start is None and end is None:
        path, start, end = split_range(path)
    want = {"path": path}
    want.update({k: v for k, v in (("line_start", start), ("line_end", end)) if v is not None})
    res = daemon.call(call, "get", **want)
    out = {k: res.get(k) for k in ("path", "source", "line_start", "line_end", "lines_total",
                                   "text", "truncated", "unit")}
    unit = out["unit"] or "line"
    # the end of what was asked for: the daemon's own cut (256 KiB) leaves some of it unsent
    end = min(end, out["lines_total"]) if end is not None else out["lines_total"]
    line_cut = bool(res.get("line_cut"))
    if len(out["text"]) > GET_MAX_CHARS:
        out["text"], sent, line_cut = _cut(out["text"], "\f" if unit == "page" else "\n")
        out["line_end"] = out["line_start"] + sent - 1
        out["truncated"] = True
    head = (f"{out['path']} ({unit}s {out['line_start']}-{out['line_end']} of "
            f"{out['lines_total']})")
    note = ""
    if line_cut:
        out["line_cut"] = True
        note = (f"{unit} {out['line_end']} is longer than {GET_MAX_CHARS:,} characters: only "
                f"its start is sent. ")
    if out["truncated"] and out["line_end"] < end:
        out["rest"] = {"line_start": out["line_end"] + 1, "line_end": end}
        rest = f"{out['line_end'] + 1}-{end}"
        note += (f"Truncated: {unit}s {out['line_start']}-{out['line_end']} sent; ask for "
                 f"{unit}s {rest} (path '{out['path']}:{rest}') for the rest, or a part of "
                 f"them.")
    if note:  # before the text and after it: a reader of either end sees it
        return out, f"{head}\n[{note.strip()}]\n\n{out['text']}\n\n[{note.strip()}]"
    return out, f"{head}\n\n{out['text']}"


def _cut(text: str, sep: str) -> tuple[str, int, bool]:
    """(text, lines kept, whether the one line kept was cut): the whole lines (pages) of
    `text` that fit in GET_MAX_CHARS; a first line longer than that, cut."""
    kept = text[:GET_MAX_CHARS + 1]
    at = kept.rfind(sep)
    if at < 0:
        return text[:GET_MAX_CHARS], 1, True
    return kept[:at], kept[:at].count(sep) + 1, False


_SOURCE = _object({
    "name": _STR, "path": _STR, "kind": {"type": "string", "description": "obsidian or folder"},
    "files": {"type": "integer", "description": "files indexed"},
    "chunks": _INT, "skipped": _INT, "failed": _INT,
    "scanning": _BOOL, "watched": _BOOL, "watch_error": _OPT_STR,
    "lag_s": {"type": "number", "description": "how long the oldest change not yet indexed "
                                               "has waited (0: up to date)"},
}, required=("name", "path", "kind", "files", "chunks"), closed=False)

_ENGINE = _object({
    "model": _OPT_STR, "state": _OPT_STR, "reason": _OPT_STR,
    "embedder": _OPT_STR, "vectors": _INT,
    "pending_texts": {"type": ["integer", "null"],
                      "description": "texts still without a vector (null until counted)"},
}, closed=False)

STATUS_OUT = _object({
    "version": _STR, "pid": _INT,
    "idle": {"type": "boolean", "description": "nothing waiting to be indexed (files; texts "
                                               "still without a vector are the embedding "
                                               "engine's pending_texts)"},
    "pending": {"type": "integer", "description": "files waiting to be (re)indexed"},
    "sources": {"type": "array", "items": _SOURCE},
    "engines": {"type": "object", "description": "per role (embedding, reranker)",
                "additionalProperties": _ENGINE},
    "hints": {"type": "array", "items": _STR},
}, required=("version", "idle", "pending", "sources", "engines"), closed=False)

def run_status(daemon: Daemon, call: Call, args: dict) -> tuple[dict, str]:
    st = daemon.call(call, "status")
    out = {"version": st["version"], "pid": st["pid"], "idle": st["idle"],
           "pending": st["pending"],
           "sources": [{k: s[k] for k in _SOURCE["properties"] if k in s}
                       for s in st["sources"]],
           "engines": {role: {k: e[k] for k in _ENGINE["properties"] if k in e}
                       for role, e in st.get("engines", {}).items()},
           "hints": list(st.get("hints", []))}
    return out, status_text(out)


def status_text(out: dict) -> str:
    # `idle` is about files only: while vectors are still coming, a search by meaning misses
    # the notes not embedded yet, so the headline says so rather than "up to date" (an agent
    # reads the first line).
    emb = out["engines"].get("embedding", {})
    todo = emb.get("pending_texts")
    if not out["idle"]:
        state = f"indexing, {out['pending']} file(s) waiting"
    elif todo:
        state = f"files indexed; vectors still being computed ({todo} texts to embed)"
    elif "vectors" in emb and todo is None:
        state = f"files indexed; vectors not counted yet (embedder: {emb.get('embedder')})"
    else:
        state = "index up to date"
    lines = [f"ragd {out['version']} (pid {out['pid']}): {state}"]
    if not out["sources"]:
        lines.append("No sources configured.")
    for s in out["sources"]:
        extra = "".join(f", {s[k]} {k}" for k in ("skipped", "failed") if s.get(k))
        lines.append(f"- source {s['name']!r} ({s['kind']}, {s['path']}): {s['files']} files, "
                     f"{s['chunks']} chunks{extra}")
        if s.get("lag_s"):
            lines.append(f"  index lag {s['lag_s']:.1f} s")
        if s.get("watch_error"):
            lines.append(f"  not watched: {s['watch_error']}")
    if not out["engines"]:
        lines.append("No embedding model: keyword (BM25) search only.")
    for role, e in out["engines"].items():
        line = f"{role} engine: {e.get('state')} (model {e.get('model')})"
        if "vectors" in e:
            todo = e.get("pending_texts")
            line += f", {e['vectors']} vectors, " + (f"{todo} texts to embed" if todo is not None
                                                     else "texts to embed not counted yet")
        lines.append(line)
        if e.get("reason"):
            lines.append("  " + e["reason"].replace("\n", "\n  "))
    lines += out["hints"]
    return "\n".join(lines)


RELATED_ARGS: dict[str, dict] = {
    "path": {"type": "string", "minLength": 1,
             "description": "Absolute path of an indexed note (as search results give it): the "
                            "notes most like it. Give this or 'text'."},
    "text": {"type": "string", "minLength": 1,
             "description": "A passage (e.g. a draft): the notes most like it. Give this or "
                            "'path'."},
    "k": {"type": "integer", "minimum": 1, "maximum": 50,
          "description": "How many notes (default 10)."},
}

_SPAN = _object({"line_start": _INT, "line_end": _INT}, required=("line_start", "line_end"))
_RELATED_HIT = _object({
    **{k: v for k, v in _HIT["properties"].items()},
    "title": {"type": "string", "description": "the note's title"},
    "link": _object({"from": {**_SPAN, "description": "the lines of the asked note (or text) "
                                                       "that are closest"},
                     "to": {**_SPAN, "description": "the lines of this note they are close "
                                                    "to"}},
                    required=("from", "to")),
}, required=("path", "source", "line_start", "line_end", "heading", "score", "text", "link"),
    closed=False)

RELATED_OUT = _object({
    "of": {**_OPT_STR, "description": "the note asked about (null for a text)"},
    "reason": {**_OPT_STR, "description": "why there are no results"},
    "vector_coverage": {"type": "number", "description": "the share of chunks with a vector "
                        "so far, while embedding is under way (absent once complete)"},
    "note": {**_OPT_STR, "description": "while vectors are coming: notes not embedded yet "
             "are not compared"},
    "results": {"type": "array", "items": _RELATED_HIT},
}, required=("of", "results"), closed=False)


def run_related(daemon: Daemon, call: Call, args: dict) -> tuple[dict, str]:
    if ("path" in args) == ("text" in args):
        raise BadArguments("give either 'path' (a note) or 'text' (a passage)"
                           + (", not both" if "path" in args else ""))
    want = {k: args[k] for k in RELATED_ARGS if k in args}
    res = daemon.call(call, "related", **want)
    keys = _RELATED_HIT["properties"]
    hits = [{k: r[k] for k in keys if k in r} for r in res["results"]]
    out = {"of": res.get("of") or args.get("path"), "reason": res.get("reason"),
           "results": hits}
    if res.get("vector_coverage") is not None:  # vectors still coming: say it is partial
        out["vector_coverage"] = res["vector_coverage"]
        out["note"] = res.get("note")
    return out, related_text(out)


def related_text(out: dict) -> str:
    what = out["of"] or "the text given"
    if not out["results"]:
        return f"No notes related to {what} ({out['reason'] or 'none found'})."
    n = len(out["results"])
    lines = [f"{n} note{'s' * (n != 1)} related to {what}, closest first"
             + (f" ({out['note']})" if out.get("note") else "") + ":"]
    for i, h in enumerate(out["results"], 1):
        frm = h["link"]["from"]
        lines += ["", f"[{i}] {h['path']}:{h['line_start']}-{h['line_end']} — "
                      f"{h.get('title') or h['heading']}  (similarity {h['score']:.3f}; close to "
                      f"lines {frm['line_start']}-{frm['line_end']} of {what})", h["text"]]
    return "\n".join(lines)


TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("search", "Search notes and documents",
         "Search the user's notes and documents indexed by ragd. Returns passages with their "
         "file path, line range, note title, heading path, score and the lines that hold the "
         "query's words, best first.",
         _object(SEARCH_ARGS, required=("query",)), SEARCH_OUT, run_search),
    Tool("get", "Read a file or lines of it",
         "Read a file of an indexed source as it is now on disk, whole or a line range (e.g. "
         f"around a search result), at most {GET_MAX_CHARS:,} characters a call: a longer text "
         "is cut after the last whole line that fits, and the result says which lines to ask "
         "for next ('rest'). Files outside the configured sources are refused.",
         _object(GET_ARGS, required=("path",)), GET_OUT, run_get),
    Tool("status", "Index status",
         "What ragd indexes and how fresh it is: sources with their file and chunk counts, "
         "indexing lag, and the state of the embedding and reranking engines.",
         _object({}), STATUS_OUT, run_status),
    Tool("related", "Notes related to a note",
         "The user's notes closest in meaning to a given note (by path) or to a passage of "
         "text, the note itself left out: each with the pair of line ranges that link them "
         "and the matching passage. Needs the daemon's embedding model.",
         _object(RELATED_ARGS), RELATED_OUT, run_related),
)}

for _tool in TOOLS.values():
    _known_keywords(_tool.input_schema, _tool.name)


# ---------------------------------------------------------------------------------------------
# The server.

def _id_key(req_id: Any) -> tuple[str, Any]:
    return (type(req_id).__name__, req_id)  # 1 and "1" are different ids


class Server:
    def __init__(self, daemon: Daemon, out: BinaryIO):
        self.daemon = daemon
        self.out = out
        self.handshake_version: str | None = None  # set by initialize
        self._write = threading.Lock()
        self._inflight: dict[tuple, Call] = {}
        self._inflight_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CALLS)
        self._workers: list[threading.Thread] = []
        self.gone = False  # stdout is closed: the client went away

    # -- input ----------------------------------------------------------------------------------

    def serve(self, inp: BinaryIO) -> int:
        while not self.gone:
            line = inp.readline(MAX_LINE + 1)
            if not line:
                break
            if len(line) > MAX_LINE:
                self.send(_error(None, INVALID_REQUEST, f"message over {MAX_LINE} bytes"))
                while line and not line.endswith(b"\n"):  # skip the rest of it
                    line = inp.readline(MAX_LINE + 1)
                continue
            if line.strip():
                self.handle(line)
        self._drain(EOF_GRACE)
        log.info("end of input: exiting")
        return 0

    def handle(self, line: bytes) -> None:
        log.debug("<- %s", _clip(line))
        try:
            msg = json.loads(line, parse_constant=_not_json)
        except ValueError as e:  # bad JSON (NaN and Infinity included) or bad UTF-8
            self.send(_error(None, PARSE_ERROR, f"Parse error: {e}"))
            return
        if isinstance(msg, list):
            self.send(_error(None, INVALID_REQUEST, "JSON-RPC batches are not part of MCP; send "
                                                    "one message per line"))
            return
        if not isinstance(msg, dict):
            self.send(_error(None, INVALID_REQUEST, "a message must be a JSON object"))
            return
        has_id, req_id = "id" in msg, msg.get("id")
        if has_id and (not isinstance(req_id, (str, int)) or isinstance(req_id, bool)):
            self.send(_error(None, INVALID_REQUEST, "'id' must be a string or an integer"))
            return
        method = msg.get("method")
        if method is None and ("result" in msg or "error" in msg):
            log.warning("ignoring a response from the client (this server sends no requests)")
            return
        reply_id = req_id if has_id else None
        if msg.get("jsonrpc") != "2.0":
            self.send(_error(reply_id, INVALID_REQUEST, "'jsonrpc' must be \"2.0\""))
            return
        if not isinstance(method, str):
            self.send(_error(reply_id, INVALID_REQUEST, "'method' must be a string"))
            return
        params = msg.get("params")
        params = {} if params is None else params
        if not has_id:
            self.notification(method, params)
            return
        if not isinstance(params, dict):
            self.send(_error(req_id, INVALID_PARAMS, "'params' must be an object"))
            return
        try:
            era = self.era(method, params)
            if method == "tools/call":
                self.start_call(req_id, era, params)
                return
            result = self.dispatch(method, era, params)
        except RpcError as e:
            self.send(_error(req_id, e.code, e.message, e.data))
            return
        self.send({"jsonrpc": "2.0", "id": req_id, "result": _stamp(result, era)})

    def notification(self, method: str, params: Any) -> None:
        """Notifications get no reply, whatever they are."""
        if method == "notifications/initialized":
            log.debug("client initialized (%s)", self.handshake_version)
        elif method == "notifications/cancelled" and isinstance(params, dict):
            key = _id_key(params.get("requestId"))
            with self._inflight_lock:
                call = self._inflight.get(key)
            if call is not None:
                log.info("request %r cancelled: %s", params.get("requestId"),
                         params.get("reason") or "no reason given")
                call.cancel()
        else:
            log.debug("notification %s ignored", method)

    # -- eras -----------------------------------------------------------------------------------

    def era(self, method: str, params: dict) -> str:
        """The protocol version a request is served under, or the RpcError refusing it."""
        if method not in METHODS:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            raise RpcError(INVALID_PARAMS, "'params._meta' must be an object")
        if method == "initialize":
            return "handshake"
        if meta is not None and META_VERSION in meta:
            version = meta[META_VERSION]
            if not isinstance(version, str):
                raise RpcError(INVALID_PARAMS, f"'_meta.{META_VERSION}' must be a string")
            if version not in MODERN:
                how = (f"; {version} is a handshake-era version: send initialize to use it"
                       if version in HANDSHAKE else "")
                raise RpcError(UNSUPPORTED_PROTOCOL_VERSION, f"Unsupported protocol "
                               f"version{how}", {"supported": list(SUPPORTED),
                                                 "requested": version})
            if not isinstance(meta.get(META_CAPABILITIES), dict):
                raise RpcError(INVALID_PARAMS, f"'_meta.{META_CAPABILITIES}' (an object) is "
                               f"required on every {version} request")
            if method not in MODERN_METHODS:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method} is not part "
                               f"of protocol {version}")
            return version
        if method == "ping":  # allowed before initialize
            return self.handshake_version or HANDSHAKE[0]
        if method in MODERN_METHODS and method not in HANDSHAKE_METHODS:
            raise RpcError(INVALID_PARAMS, f"{method} needs '_meta.{META_VERSION}' "
                           f"({', '.join(MODERN)}) and '_meta.{META_CAPABILITIES}'")
        if self.handshake_version is None:
            raise RpcError(INVALID_PARAMS, f"no protocol version: send initialize first "
                           f"({', '.join(HANDSHAKE)}), or give the version ({', '.join(MODERN)})"
                           f" in '_meta.{META_VERSION}' with the client's capabilities in "
                           f"'_meta.{META_CAPABILITIES}'")
        return self.handshake_version

    def dispatch(self, method: str, era: str, params: dict) -> dict:
        if method == "initialize":
            return self.initialize(params)
        if method == "ping":
            return {}
        if method == "server/discover":
            return {"supportedVersions": list(SUPPORTED), "capabilities": CAPABILITIES,
                    "instructions": INSTRUCTIONS, "ttlMs": LIST_TTL_MS, "cacheScope": "public"}
        if method == "tools/list":
            if params.get("cursor") is not None:
                raise RpcError(INVALID_PARAMS, "Invalid cursor: tools/list has one page")
            result: dict = {"tools": [t.listing() for t in TOOLS.values()]}
            if era in MODERN:
                result.update(ttlMs=LIST_TTL_MS, cacheScope="public")
            return result
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")  # pragma: no cover

    def initialize(self, params: dict) -> dict:
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            raise RpcError(INVALID_PARAMS, "initialize: 'protocolVersion' must be a string")
        for key in ("capabilities", "clientInfo"):
            if key in params and not isinstance(params[key], dict):
                raise RpcError(INVALID_PARAMS, f"initialize: '{key}' must be an object")
        # The handshake revisions: answer with the version asked for if we speak it, else with
        # our newest (the client then decides whether it can go on).
        version = asked if asked in HANDSHAKE else HANDSHAKE[0]
        client = params.get("clientInfo") or {}
        log.info("initialize from %s %s: protocol %s%s", client.get("name", "a client"),
                 client.get("version", ""), version,
                 "" if version == asked else f" (it asked for {asked})")
        self.handshake_version = version
        return {"protocolVersion": version, "capabilities": CAPABILITIES,
                "serverInfo": SERVER_INFO, "instructions": INSTRUCTIONS}

    # -- tool calls -----------------------------------------------------------------------------

    def start_call(self, req_id: Any, era: str, params: dict) -> None:
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call: 'name' must be a string")
        tool = TOOLS.get(name)
        if tool is None:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        args = params.get("arguments")
        args = {} if args is None else args
        if not isinstance(args, dict):
            raise RpcError(INVALID_PARAMS, "tools/call: 'arguments' must be an object")
        try:
            check(tool.input_schema, args, "arguments")
        except BadArguments as e:
            if era == "2025-06-18":  # that revision makes invalid arguments a protocol error
                raise RpcError(INVALID_PARAMS, _said_by(name, str(e))) from None
            self.send({"jsonrpc": "2.0", "id": req_id,
                       "result": _stamp(_tool_error(name, str(e)), era)})
            return
        key, call = _id_key(req_id), Call()
        with self._inflight_lock:
            if key in self._inflight:
                raise RpcError(INVALID_REQUEST, f"id {req_id!r} is already used by a request "
                                                f"in flight")
            busy = len(self._inflight) >= MAX_PENDING
            if not busy:
                self._inflight[key] = call
        if busy:
            self.send({"jsonrpc": "2.0", "id": req_id, "result": _stamp(_tool_error(
                name, f"{MAX_PENDING} tool calls are already in flight; try again when some "
                      f"have answered"), era)})
            return
        # The call waits for a slot in its own thread, never the reader: with every slot taken
        # (ragd slow or stopped), a ping or a cancellation was read only once a call timed out.
        worker = threading.Thread(target=self._run, args=(req_id, key, call, tool, args, era),
                                  name=f"call-{name}", daemon=True)
        self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    def _run(self, req_id, key, call: Call, tool: Tool, args: dict, era: str) -> None:
        reply = None
        try:
            with self._slots:
                if not call.cancelled:  # (cancelled while it waited: it never runs)
                    reply = self._reply(req_id, call, tool, args, era)
        finally:
            with self._inflight_lock:
                self._inflight.pop(key, None)
        if reply is None or call.cancelled:  # the client no longer waits for it
            log.debug("no reply to cancelled request %r", req_id)
            return
        self.send(reply)

    def _reply(self, req_id, call: Call, tool: Tool, args: dict, era: str) -> dict:
        try:
            try:
                structured, text = tool.run(self.daemon, call, args)
                result = {"content": [{"type": "text", "text": text}],
                          "structuredContent": structured, "isError": False}
            except ToolError as e:
                result = _tool_error(tool.name, str(e))
            return {"jsonrpc": "2.0", "id": req_id, "result": _stamp(result, era)}
        except Exception as e:  # a bug here: say so, keep serving
            log.exception("tool %s failed", tool.name)
            return _error(req_id, INTERNAL_ERROR, f"Internal error: {type(e).__name__}: {e}")

    def _drain(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for w in self._workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if w.is_alive():
                log.warning("exiting with a tool call still waiting for ragd")
                return

    # -- output ---------------------------------------------------------------------------------

    def send(self, msg: dict) -> None:
        data = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        log.debug("-> %s", _clip(data))
        with self._write:
            if self.gone:
                return
            try:
                self.out.write(data)
                self.out.flush()
            except (BrokenPipeError, ValueError):  # closed under us: the client is gone
                self.gone = True


HANDSHAKE_METHODS = {"initialize", "ping", "tools/list", "tools/call"}
MODERN_METHODS = {"server/discover", "tools/list", "tools/call"}
METHODS = HANDSHAKE_METHODS | MODERN_METHODS


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _clip(data: bytes, limit: int = 500) -> str:
    text = data.decode("utf-8", "replace").rstrip("\n")
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _error(req_id: Any, code: int, message: str, data: Any = None) -> dict:
    err: dict = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": req_id, "error": err}


def _said_by(tool: str, message: str) -> str:
    """Every failure of a tool starts with its name, as the daemon's own errors start with
    their op's (the same names): "search: no source named 'x'", "get: ragd is not running"."""
    return message if message.startswith(f"{tool}: ") else f"{tool}: {message}"


def _tool_error(tool: str, message: str) -> dict:
    return {"content": [{"type": "text", "text": _said_by(tool, message)}], "isError": True}


def _stamp(result: dict, era: str) -> dict:
    """A 2026-07-28 result says it is complete and who answered; older ones carry neither."""
    if era in MODERN:
        result = {**result, "resultType": "complete",
                  "_meta": {**result.get("_meta", {}), META_SERVER_INFO: SERVER_INFO}}
    return result


def run(socket_opt: str | None, config_opt: str | None, verbose: bool = False) -> int:
    """Serve MCP on this process's stdin/stdout until end of input."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ragctl mcp: %(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout is the protocol's: a stray print must not corrupt it
    daemon = Daemon(socket_opt, config_opt)
    try:
        where = str(daemon.path())
    except ToolError as e:
        where = str(e)
    log.info("serving MCP on stdio (protocol %s); ragd socket: %s", ", ".join(SUPPORTED), where)
    try:
        return Server(daemon, out).serve(sys.stdin.buffer)
    except KeyboardInterrupt:
        return 130
