"""The results of a search or related op as the reply gives them: paths, line ranges, texts,
titles and scores of the chunks (or notes) ranked, read in the request's snapshot.
"""

from __future__ import annotations

import datetime
import os
import sqlite3
from pathlib import Path

from ragd.index import store
from ragd.ingest.sources import wire_path
from ragd.ops.parts import Parts
from ragd.search import passages


class Results:
    def __init__(self, parts: Parts):
        self.p = parts

    def chunks(self, db: sqlite3.Connection, ranked: list[tuple[int, float, dict]],
               k: int, titled: bool = False) -> list[dict]:
        """A result per (chunk id, score, scores), best first, at most k; a chunk deleted
        since it was ranked is left out. Each keeps its `chunk_id` for the caller to drop.
        titled: each has its note's `title` too."""
        if not ranked:
            return []
        ranked = ranked[:k + 20]  # a few spare in case some were deleted meanwhile
        rows = store.chunk_results(db, [cid for cid, _, _ in ranked])
        out = []
        notes = []  # each result's note (file id; an unsaved buffer's note id)
        for cid, score, parts in ranked:
            if store.unsaved(cid):  # a chunk of an unsaved buffer
                hit = self.p.buffers.chunk(cid)
                if hit is not None:
                    b, c = hit
                    out.append({**wire_path(str(b.path)), "source": b.source,
                                "line_start": c.record.line_start,
                                "line_end": c.record.line_end, "heading": c.record.heading,
                                "score": round(score, 6), "scores": parts, "text": c.record.text,
                                "indexed_at": None, "stale": False, "unsaved": True,
                                "version": b.version, "chunk_id": cid})
                    notes.append(b.note_id)
                if len(out) == k:
                    break
                continue
            r = rows.get(cid)
            if r is None:  # deleted between the ranking and this read
                continue
            src = self.p.cfg.source(r["source"])
            rel = store.fs_rel(r["relpath"])
            path = src.root / rel if src else None
            out.append({
                **wire_path(str(path) if path else rel),
                "source": r["source"], "line_start": r["line_start"], "line_end": r["line_end"],
                "heading": r["heading"], "score": round(score, 6), "scores": parts,
                "text": r["text"], "indexed_at": r["indexed_at"],
                "stale": _changed(path, r["size"], r["mtime_ns"]),
                **_dated(r), "chunk_id": cid,
            })
            notes.append(r["file_id"])
            if len(out) == k:
                break
        if titled:
            titles = self.titles(db, notes)
            for r, fid in zip(out, notes):
                r["title"] = titles.get(fid) or Path(r["path"]).stem
        return out

    def notes(self, db: sqlite3.Connection, grouped: list, k: int, query: str,
              evidence: dict | None = None, second: bool = False) -> list[dict]:
        """Note-level results: each note's passage (passages.choose), its score, and its other
        matching chunks (line ranges) — "+N more in this note"; `second`: its second passage
        too (for ask)."""
        top = grouped[:k + 10]  # spares, in case some were deleted meanwhile
        passages.choose(db, top, query)
        best = self.chunks(db, [(n.best.chunk_id, n.score, n.best.parts) for n in top], k,
                           titled=True)
        passages.widen(db, best)
        by_chunk = {n.best.chunk_id: n for n in top}
        others = [c.chunk_id for n in top for c in n.chunks[1:]]
        spans = store.chunk_spans(db, others)
        for cid in others:
            if store.unsaved(cid) and (hit := self.p.buffers.chunk(cid)):
                r = hit[1].record
                spans[cid] = (cid, r.line_start, r.line_end, r.heading)
        out = []
        for r in best:
            n = by_chunk[r.pop("chunk_id")]
            r["scores"] = {**r["scores"], "note": round(n.score, 6)}
            if evidence and n.file_id in evidence:
                added, score, rank = evidence[n.file_id]
                r["scores"].update(note_bm25=score, note_bm25_rank=rank,
                                   note_bm25_added=round(added, 6))
            r["more"] = len(n.chunks) - 1
            if second:
                r["second"] = passages.second(db, n)
            r["chunks"] = [{"line_start": r["line_start"], "line_end": r["line_end"],
                            "heading": r["heading"], "score": round(n.best.score, 6)}] + [
                {"line_start": spans[c.chunk_id][1], "line_end": spans[c.chunk_id][2],
                 "heading": spans[c.chunk_id][3], "score": round(c.score, 6)}
                for c in n.chunks[1:10] if c.chunk_id in spans]
            out.append(r)
            if len(out) == k:
                break
        return out

    def titles(self, db, fids: list[int]) -> dict[int, str | None]:
        """file id -> its note's title; an unsaved buffer's (negative ids) from the buffer."""
        out = store.titles(db, fids)
        for f in fids:
            if store.unsaved(f):
                hit = next((b for b in self.p.buffers.active() if b.note_id == f), None)
                out[f] = hit.title if hit else None
        return out


def _dated(row) -> dict:
    """The date a date filter reads of a result's note (filters.py), and where it is from:
    {"date": "2024-03-05", "date_from": "frontmatter created"}, or the file's modification
    time ("file modified") when the note states none."""
    if row["note_date_ns"] is not None and row["date"] and row["date_from"]:
        return {"date": row["date"], "date_from": row["date_from"]}
    when = datetime.datetime.fromtimestamp(row["mtime_ns"] / 1e9)
    return {"date": when.isoformat(timespec="minutes"), "date_from": "file modified"}


def _changed(path, size: int, mtime_ns: int) -> bool:
    """Has the file changed on disk since it was indexed (or gone)?"""
    if path is None:
        return True
    try:
        st = os.stat(path)
    except OSError:
        return True
    return st.st_size != size or st.st_mtime_ns != mtime_ns
