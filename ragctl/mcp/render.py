"""The tools' results as text, for people and models (MCP's ``content``): the same facts as
the structured result, in the order a reader needs them — what went wrong or is partial
first, then the hits with their paths and line ranges."""

from __future__ import annotations

import os

from ragctl.render import _lines


def search_text(out: dict) -> str:
    lines = []
    if out["degraded"]:
        lines.append(f"(keyword search only: {out['reason'] or 'the embedding engine is down'})")
    if out.get("rerank_reason"):
        lines.append(f"(not reranked: {out['rerank_reason']})")
    if out.get("vector_coverage") is not None:
        lines.append(f"(vectors cover {100 * out['vector_coverage']:.0f}% of the passages so "
                     f"far: the rest are found by their words only, and a note that only "
                     f"meaning would find may be missing)")
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
                      f"{' — ' + head if head else ''}  (score {h['score']:.4g}){stale}"
                      f"{_unsaved(h)}"]
        if h.get("matches"):
            lines += ["matching lines:"] + [f"  {m['line']}: {m['text'].strip()}"
                                            for m in h["matches"]] + ["passage:"]
        lines.append(h["text"])
    return "\n".join(lines)


def _unsaved(h: dict) -> str:
    """An editor's buffer stands in for its file: its lines are not the file's, which get
    would read."""
    return ("  (unsaved text in an editor, not on disk: get reads the saved file, whose lines "
            "may differ)") if h.get("unsaved") else ""


def get_text(out: dict, limit: int) -> str:
    """A file's lines under their path and range. A line cut at `limit` characters, or lines
    of the range asked for left unsent ('rest'), are said before the text and after it: a
    reader of either end sees it."""
    unit = out["unit"] or "line"
    head = (f"{out['path']} ({unit}s {out['line_start']}-{out['line_end']} of "
            f"{out['lines_total']})")
    note = ""
    if out.get("line_cut"):
        note = (f"{unit} {out['line_end']} is longer than {limit:,} characters: only "
                f"its start is sent. ")
    if out.get("rest"):
        rest = f"{out['rest']['line_start']}-{out['rest']['line_end']}"
        note += (f"Truncated: {unit}s {out['line_start']}-{out['line_end']} sent; ask for "
                 f"{unit}s {rest} (path '{out['path']}:{rest}') for the rest, or a part of "
                 f"them.")
    if note:
        return f"{head}\n[{note.strip()}]\n\n{out['text']}\n\n[{note.strip()}]"
    return f"{head}\n\n{out['text']}"


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
                      f"{_lines(frm['line_start'], frm['line_end'])} of {what}){_unsaved(h)}",
                  h["text"]]
    return "\n".join(lines)
