"""The tools: each one's input and output schemas, description, and the one daemon op it runs.
Each run returns (structuredContent, readable text); a ToolError becomes an isError result.
This bridge adds nothing the daemon cannot answer: each tool is one op (search, get, status,
related)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from ragctl.mcp.daemon import CALL_TIMEOUT, Call, Daemon
from ragctl.mcp.render import get_text, related_text, search_text, status_text
from ragctl.mcp.schema import (BOOL, INT, OPT_STR, STR, BadArguments, known_keywords, obj)
from ragctl.mcp.wire import ToolError
from ragctl.paths import split_range


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

    def listing(self, structured: bool = True) -> dict:
        """The tool as tools/list gives it; not `structured`: as 2024-11-05 knew a tool."""
        if not structured:
            return {"name": self.name, "description": self.description,
                    "inputSchema": self.input_schema}
        return {"name": self.name, "title": self.title, "description": self.description,
                "inputSchema": self.input_schema, "outputSchema": self.output_schema,
                "annotations": {"title": self.title, **self.annotations}}


# search's arguments, passed to the daemon's search op under the same names (its filters
# included: an agent narrowing to a folder, a tag or recent notes asks as ragctl does).
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
    "path": {"type": "string", "minLength": 1,
             "description": "Only files whose path (relative to their source's folder) matches "
                            "this glob, e.g. \"Projects/*\" or \"*.pdf\"; without a wildcard, "
                            "that file or folder."},
    "tag": {"type": "string", "minLength": 1,
            "description": "Only notes with this Obsidian tag (\"#\" optional; \"a\" also "
                           "matches \"a/b\")."},
    "since": {"type": ["string", "number"],
              "description": "Only notes dated since then: an ISO date (2026-11-01), today, "
                             "yesterday, 7d, 2w, 3m, 1y, or Unix seconds. A note's date is the "
                             "one it states (frontmatter, a daily note's name), else its "
                             "file's modification time."},
    "before": {"type": ["string", "number"],
               "description": "Only notes dated before then (as since)."},
    "wait": {"type": "number", "minimum": 0, "maximum": 60,
             "description": "First wait up to this many seconds until files changed just "
                            "before are searchable (e.g. right after editing a note)."},
}

_HIT = obj({
    "path": {"type": "string", "description": "absolute path of the file"},
    "source": STR,
    "line_start": {"type": "integer", "description": "first line of the passage, 1-based "
                                                      "(a page number for a PDF)"},
    "line_end": {"type": "integer", "description": "last line, inclusive"},
    "heading": {"type": ["string", "null"], "description": "Note title > H1 > H2"},
    "score": {"type": "number", "description": "higher is better"},
    "text": {"type": "string", "description": "the passage, as in the file"},
    "stale": {"type": "boolean", "description": "the file changed since it was indexed: the "
                                                "lines may have moved"},
    "unsaved": {"type": "boolean",
                "description": "the passage is an editor's unsaved text of this file, not what "
                               "is on disk: get reads the file, whose lines may differ"},
}, required=("path", "source", "line_start", "line_end", "heading", "score", "text"),
    closed=False)

_SEARCH_HIT = obj({
    **_HIT["properties"],
    "title": {"type": "string", "description": "the note's title (a document's own title, "
                                               "else the file name)"},
    "match_lines": {"type": "array", "items": INT,
                    "description": "the lines of the passage that hold the query's words "
                                   "(file line numbers; for a PDF, its page)"},
    "matches": {"type": "array", "items": obj({"line": INT, "text": STR},
                                              required=("line", "text")),
                "description": "those lines and their text, as in the passage (none for a "
                               "PDF, whose match_lines are pages)"},
}, required=_HIT["required"], closed=False)

SEARCH_OUT = obj({
    "query": STR,
    "mode": {"type": "string", "description": "the ranking actually used"},
    "degraded": {"type": "boolean", "description": "keywords only, as the embedding engine "
                                                   "is not ready (see reason)"},
    "reason": {**OPT_STR, "description": "why degraded, or why there are no results"},
    "confidence": {"type": ["number", "null"],
                   "description": "0-1: how much of the query's distinctive vocabulary the "
                                  "best notes hold (null: the query has no content words)"},
    "low_confidence": {"type": "boolean",
                       "description": "the notes probably do not answer this: treat the "
                                      "results as weak"},
    "reranked": {"type": "boolean", "description": "the order is the cross-encoder's"},
    "rerank_reason": {"type": "string", "description": "why a rerank wanted (rerank: true, or "
                                                       "the daemon's default) did not happen"},
    "vector_coverage": {"type": "number",
                        "description": "0-1, present while vectors are still being computed: "
                                       "the share of passages that have one (a note without "
                                       "is found by its words only)"},
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
    # while vectors are coming an agent must know that a note may be missed by meaning (it
    # read keyword-only results as the whole answer)
    if res.get("vector_coverage") is not None and res["vector_coverage"] < 1:
        out["vector_coverage"] = res["vector_coverage"]
    return out, search_text(out)


def _matches(r: dict) -> list[dict]:
    """The passage's lines that hold the query's words (the daemon's match_lines), with their
    text. A PDF's range counts pages: its match_lines name a page, not a line of `text`."""
    if r["path"].lower().endswith(".pdf"):
        return []
    lines = r["text"].split("\n")
    return [{"line": n, "text": lines[n - r["line_start"]]} for n in r.get("match_lines") or ()
            if 0 <= n - r["line_start"] < len(lines)]


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

GET_OUT = obj({
    "path": {"type": "string", "description": "the file's real path"},
    "source": STR,
    "line_start": INT,
    "line_end": {"type": "integer", "description": "the last line sent (0 for an empty "
                                                   "file)"},
    "lines_total": {"type": "integer", "description": "lines in the file (pages for a PDF)"},
    "text": STR,
    "truncated": {"type": "boolean", "description": f"cut at {GET_MAX_CHARS:,} characters: "
                                                    f"'rest' is the range still to read"},
    "rest": {**obj({"line_start": INT, "line_end": INT},
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
    elif split_range(path)[1] is not None and not os.path.exists(path):
        # (an agent copies a search hit's path:START-END and adds the lines: "no file
        # ….md:5-9" would send it looking for another file)
        raise ToolError(f"the path ends in a range (:{path.rsplit(':', 1)[1]}) and "
                        f"line_start or line_end is given too: give the lines one way")
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
    if line_cut:
        out["line_cut"] = True
    if out["truncated"] and out["line_end"] < end:
        out["rest"] = {"line_start": out["line_end"] + 1, "line_end": end}
    return out, get_text(out, GET_MAX_CHARS)


def _cut(text: str, sep: str) -> tuple[str, int, bool]:
    """(text, lines kept, whether the one line kept was cut): the whole lines (pages) of
    `text` that fit in GET_MAX_CHARS; a first line longer than that, cut."""
    kept = text[:GET_MAX_CHARS + 1]
    at = kept.rfind(sep)
    if at < 0:
        return text[:GET_MAX_CHARS], 1, True
    return kept[:at], kept[:at].count(sep) + 1, False


_SOURCE = obj({
    "name": STR, "path": STR, "kind": {"type": "string", "description": "obsidian or folder"},
    "files": {"type": "integer", "description": "files indexed"},
    "chunks": INT, "skipped": INT, "failed": INT,
    "scanning": BOOL, "watched": BOOL, "watch_error": OPT_STR,
    "lag_s": {"type": "number", "description": "how long the oldest change not yet indexed "
                                               "has waited (0: up to date)"},
}, required=("name", "path", "kind", "files", "chunks"), closed=False)

_ENGINE = obj({
    "model": OPT_STR, "state": OPT_STR, "reason": OPT_STR,
    "embedder": OPT_STR, "vectors": INT,
    "pending_texts": {"type": ["integer", "null"],
                      "description": "texts still without a vector (null until counted)"},
}, closed=False)

STATUS_OUT = obj({
    "version": STR, "pid": INT,
    "idle": {"type": "boolean", "description": "nothing waiting to be indexed (files; texts "
                                               "still without a vector are the embedding "
                                               "engine's pending_texts)"},
    "pending": {"type": "integer", "description": "files waiting to be (re)indexed"},
    "sources": {"type": "array", "items": _SOURCE},
    "engines": {"type": "object", "description": "per role (embedding, reranker)",
                "additionalProperties": _ENGINE},
    "hints": {"type": "array", "items": STR},
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

_SPAN = obj({"line_start": INT, "line_end": INT}, required=("line_start", "line_end"))
_RELATED_HIT = obj({
    **{k: v for k, v in _HIT["properties"].items()},
    "title": {"type": "string", "description": "the note's title"},
    "link": obj({"from": {**_SPAN, "description": "the lines of the asked note (or text) "
                                                  "that are closest"},
                 "to": {**_SPAN, "description": "the lines of this note they are close "
                                                "to"}},
                required=("from", "to")),
}, required=("path", "source", "line_start", "line_end", "heading", "score", "text", "link"),
    closed=False)

RELATED_OUT = obj({
    "of": {**OPT_STR, "description": "the note asked about (null for a text)"},
    "reason": {**OPT_STR, "description": "why there are no results"},
    "vector_coverage": {"type": "number", "description": "the share of chunks with a vector "
                        "so far, while embedding is under way (absent once complete)"},
    "note": {**OPT_STR, "description": "while vectors are coming: notes not embedded yet "
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


TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("search", "Search notes and documents",
         "Search the user's notes and documents indexed by ragd. Returns passages with their "
         "file path, line range, note title, heading path, score and the lines that hold the "
         "query's words, best first.",
         obj(SEARCH_ARGS, required=("query",)), SEARCH_OUT, run_search),
    Tool("get", "Read a file or lines of it",
         "Read a file of an indexed source as it is now on disk, whole or a line range (e.g. "
         f"around a search result), at most {GET_MAX_CHARS:,} characters a call: a longer text "
         "is cut after the last whole line that fits, and the result says which lines to ask "
         "for next ('rest'). Files outside the configured sources are refused.",
         obj(GET_ARGS, required=("path",)), GET_OUT, run_get),
    Tool("status", "Index status",
         "What ragd indexes and how fresh it is: sources with their file and chunk counts, "
         "indexing lag, and the state of the embedding and reranking engines.",
         obj({}), STATUS_OUT, run_status),
    Tool("related", "Notes related to a note",
         "The user's notes closest in meaning to a given note (by path) or to a passage of "
         "text, the note itself left out: each with the pair of line ranges that link them "
         "and the matching passage. Needs the daemon's embedding model.",
         obj(RELATED_ARGS), RELATED_OUT, run_related),
)}

for _tool in TOOLS.values():
    known_keywords(_tool.input_schema, _tool.name)
