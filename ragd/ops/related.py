"""The related op: the notes closest in meaning to a note or a text (search/related.py ranks
them), said partial while vectors are coming."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ragd import protocol as P
from ragd.engines.client import EngineError, EngineUnavailable
from ragd.index import store
from ragd.ingest import excerpt
from ragd.ingest.sources import printable
from ragd.ops import args
from ragd.ops.parts import Parts
from ragd.ops.results import Results
from ragd.replies import OpError
from ragd.search import related
from ragd.search.hybrid import MEANING_MARGIN, Searcher

RELATED_CHUNKS = 32  # chunks of the asked note that look for neighbours
RELATED_WAIT = 10.0  # seconds related waits for an unsaved buffer's new texts to be embedded
# A text of one line and at most this many words is a query, not a passage: its neighbours
# must clear search's own threshold (cmd_related)
QUERY_WORDS = 40


class RelatedOps:
    def __init__(self, parts: Parts, results: Results):
        self.p = parts
        self.results = results

    def cmd_related(self, session, path: str | None, path_bytes: str | None, text: str | None,
                    k: int) -> dict:
        """The notes most like a note (or a text), excluding itself: note-level, each with
        the pair of chunks that links them; from stored vectors (an indexed note costs no
        embedding)."""
        t0 = time.perf_counter()
        path = args.path_of("related", path, path_bytes)  # (a name that is not UTF-8)
        if (path is None) == (text is None):
            raise OpError(P.BAD_ARGS, "related: give either 'path' or 'text'"
                          + (", not both" if path is not None else ""))
        if path is not None:
            args.absolute("related", path)
            # its other Unicode form, or the name a result printed with U+FFFD: as get finds
            path = excerpt.as_on_disk(os.path.expanduser(path), self.p.cfg.sources)
        if not 1 <= k <= 100:
            raise OpError(P.BAD_ARGS, f"related: 'k' must be between 1 and 100, got {k}")
        space = self.p.vectors.active
        if space is None:
            if "embedding" not in self.p.engines.configured:
                raise OpError(P.UNAVAILABLE, "related: no embedding model is configured "
                              "([embedding] model): related notes are found by meaning")
            raise OpError(P.UNAVAILABLE, "related: no vectors yet ("
                          + (self.p.engines.unavailable("embedding") or "the embedding engine is "
                             "starting") + ")")
        with self.p.reads.conn(snapshot=True) as db:
            coverage = round(Searcher._coverage(db, space.vectors), 4)
            partial = {"vector_coverage": coverage} if coverage < 1.0 else {}
            spans, vecs, own, note_path, hashes = self._related_source(db, path, text)
            spans, vecs, shared_only, asked = related.distinct_sections(db, spans, vecs, hashes,
                                                                          own)
            if not len(vecs):
                why = ("the note has no text to compare" if path is not None and not spans
                       and not self._has_chunks(db, path) else
                       "no vectors for this note yet" if path is not None else
                       "the text has nothing to embed" if text is not None and not text.strip()
                       else "the text could not be embedded: the embedding engine is not ready")
                if coverage < 1.0:  # (said without parentheses: ragctl puts the reason in some)
                    why += (f": vectors cover {100 * coverage:.0f}% of the index so far, and "
                            f"the rest are being embedded")
                return {"results": [], "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3),
                        "reason": why, **partial}
            if shared_only:  # (a stub: its title and the hub's footer; a template not filled)
                return {"results": [], "of": note_path, "reason": (
                            "every section of it is text many notes share (a template's, a "
                            "footer): nothing of its own links it to another note"),
                        "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3), **partial}
            exclude = own | {b.file_id for b in self.p.buffers.active() if b.file_id is not None}
            searched = self._searched(space)
            if isinstance(searched, str):
                return {"results": [], "of": note_path, "reason": searched,
                        "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3), **partial}
            try:
                top = related.nearest_notes(db, searched, vecs, k, exclude, asked)
            except Exception as e:  # Milvus failing (the local index raises nothing here)
                if not space.vectors.remote:
                    raise
                return {"results": [], "of": note_path, "reason": (
                            f"the vectors are in Milvus alone, which failed: "
                            f"{type(e).__name__}: {e}")[:300],
                        "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3), **partial}
            # the nearest of unrelated notes are still someone's nearest: a note's passages
            # are related only over the bar search sets a match by meaning alone (its
            # threshold + MEANING_MARGIN). Two passages of one vault sit higher than a
            # question and a passage, and the best of 32 passages' nearest higher still:
            # below that bar, results were no more often linked to the note than random
            # pairs of notes (bench/related_links.py). A short text is a question, and a
            # question's neighbours are what search would call relevant: its threshold
            thr = self.p.searcher.threshold()
            if thr > 0 and (text is None or "\n" in text.strip()
                            or len(text.split()) > QUERY_WORDS):
                thr += MEANING_MARGIN
            weak = top[0][1][1] if top and top[0][1][1] < thr else None
            top = [t for t in top if t[1][1] >= thr]
            rows = self.results.chunks(db, [(cid, s, {"vector": round(s, 6)}) for _, (cid, s, _) in
                                      top], k)
            titles = self.results.titles(db, [fid for fid, _ in top])
        by_chunk = {cid: (fid, which) for fid, (cid, _, which) in top}
        for r in rows:
            fid, which = by_chunk[r.pop("chunk_id")]
            r["title"] = titles.get(fid) or Path(r["path"]).stem
            r["link"] = {"from": spans[which], "to": {"line_start": r["line_start"],
                                                      "line_end": r["line_end"]}}
        out = {"results": rows, "of": note_path,
               "elapsed_ms": round((time.perf_counter() - t0) * 1e3, 3), **partial}
        if not rows:
            out["reason"] = "no other note has vectors yet" if len(space.vectors) <= len(vecs) \
                else "no other note is close in meaning" + (
                    f": the best similarity {weak:.3f} is below the threshold {thr:.3f}"
                    if weak is not None else "")
        if coverage < 1.0:  # (an embedded note's kin may not be in yet)
            said = (f"vectors cover {100 * coverage:.0f}% of the index so far: notes not "
                    f"embedded yet are not compared")
            if rows:
                out["note"] = said
            else:
                out["reason"] += "; " + said
        return out

    def _file_row(self, db, p: str):
        """(the source holding the absolute path p or None, its file's row or None)."""
        src = next((s for s in self.p.cfg.sources if args.under(p, s.root)), None)
        return src, src and store.file_row(db, src.name, Path(p).relative_to(src.root).as_posix())

    def _has_chunks(self, db, path: str) -> bool:
        """Does the indexed note at path have a chunk of text (an empty note has its title
        alone, a note of nothing but a comment none)?"""
        row = self._file_row(db, os.path.abspath(os.path.expanduser(path)))[1]
        return row is None or bool(store.file_chunks(db, row["id"], texts=True))

    def _searched(self, space):
        """What answers nearest_to_any for the space: its own index, or (the vectors in
        Milvus alone: [store] local_vectors = false) the Milvus collection holding the space;
        a str saying why neither can."""
        if not space.vectors.remote:
            return space.vectors
        backend = self.p.backend
        view = backend.view if backend is not None and backend.serving else None
        if view is None or view[1] != space.id:
            state = backend.state if backend is not None else "not configured"
            return f"the vectors are in Milvus alone, which cannot answer yet (milvus {state})"
        return _CollectionVectors(backend, view)

    def _related_source(self, db, path: str | None, text: str | None):
        """(line spans, vectors, file ids to leave out, path, the chunks' text hashes) of what
        related is asked of: a note's stored vectors (or its unsaved buffer's), or a text
        embedded now."""
        if path is not None:
            p = os.path.abspath(os.path.expanduser(path))
            for b in self.p.buffers.active():
                if str(b.path) == p:
                    # what was typed counts: its new texts are embedded first (a few, by the
                    # buffers thread; bounded wait)
                    self.p.buffers.wait_embedded(RELATED_WAIT)
                    pairs = self.p.buffers.vectors_of(b)
                    own = {b.file_id} if b.file_id is not None else set()
                    return ([{"line_start": c.record.line_start, "line_end": c.record.line_end}
                             for c, _ in pairs], np.array([v for _, v in pairs]), own,
                            printable(p), [c.record.text_hash for c, _ in pairs])
            src, row = self._file_row(db, p)
            if src is None:
                raise OpError(P.NOT_FOUND, f"related: {path} is not in any source")
            if row is None:
                raise OpError(P.NOT_FOUND, f"related: {path} is not indexed")
            if row["status"] in ("skipped", "failed"):  # (it said "no text to compare")
                raise OpError(P.NOT_FOUND, f"related: {path} is not indexed: {row['status']}, "
                              f"{row['reason']}")
            chunks = store.file_chunks(db, row["id"], texts=True)
            ids, vecs = self.p.vectors.vectors_of(db, self.p.vectors.active,
                                                  [c[0] for c in chunks])
            span = {c[0]: {"line_start": c[1], "line_end": c[2]} for c in chunks}
            digest = {c[0]: c[3] for c in chunks}
            return [span[i] for i in ids][:RELATED_CHUNKS], vecs[:RELATED_CHUNKS], \
                {row["id"]}, printable(p), [digest[i] for i in ids][:RELATED_CHUNKS]
        if len(text.encode("utf-8", "surrogatepass")) > self.p.cfg.max_file_bytes:
            raise OpError(P.BAD_ARGS, "related: the text is over the file size limit")
        from ragd.ingest import chunker, markdown
        pieces = chunker.chunk_doc(markdown.parse(text, ""), self.p.cfg.chunk_tokens,
                                   self.p.cfg.chunk_overlap)[:RELATED_CHUNKS]
        active = self.p.vectors.active
        engine = self.p.engines.query_engine_ready(active.model if active else None)
        if engine is None or not pieces:
            return [], np.empty((0, 1)), set(), None, []
        model = engine.model
        texts = [model.doc_prefix + chunker.embed_text(c.heading, c.body)[:4000]
                 for c in pieces]
        try:  # someone waits: bulk paused meanwhile
            vecs = self.p.engines.embed_waited(
                model, lambda e: e.client.embed(texts, timeout=30), engine)
        except (EngineError, EngineUnavailable) as e:
            raise OpError(P.UNAVAILABLE, f"related: the embedding engine: {e}") from None
        return ([{"line_start": c.line_start, "line_end": c.line_end} for c in pieces], vecs,
                set(), None, [c.text_hash for c in pieces])


class _CollectionVectors:
    """A Milvus collection read as a space's vectors are, for related.nearest_notes."""

    def __init__(self, backend, view):
        self.backend, self.view = backend, view

    def nearest_to_any(self, queries, k: int, exclude_files=()):
        return self.backend.nearest_to_any(self.view, queries, k, exclude_files)
