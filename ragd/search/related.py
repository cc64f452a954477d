"""Related notes: the notes closest in meaning to a note (its chunks' vectors) or to a text,
one per note, each by the pair of chunks that links them; a section copied into many notes (a
template's, a footer) links nothing.
"""

from __future__ import annotations

import sqlite3

import numpy as np

from ragd.index import store
from ragd.search import boilerplate


BOILERPLATE_SHARE = 0.1  # related: a section in this share of its source's notes (and ...)
BOILERPLATE_MIN = 3  # ... in this many) links nothing


def distinct_sections(db, spans: list, vecs, hashes: list[str], own: set[int]):
    """The (spans, vectors) of the asked note's sections but those whose text (as read:
    chunker.read_hash) is in BOILERPLATE_SHARE of the notes of its source (of every source for
    a text) and in BOILERPLATE_MIN notes, and whether every section is shared (by that many,
    or by boilerplate.SHARED_MIN notes: then related answers nothing, as a stub of a title, a
    placeholder line and a footer has nothing of its own to link by). A section copied word
    for word into many notes — a licence footer, a template's fixed lines — is as near to
    each of them (cosine 0.99) and says nothing of what a note is about: on 121 PEPs, related
    linked a PEP to others by their identical "Copyright" section before any of its own.
    Counted within the source: a folder's footer shared by most of its documents is
    boilerplate there even beside a large vault. Sections a few notes share stay beside a
    note's own: a tag line, an included snippet. Last, how many notes share each section kept
    (for nearest_notes)."""
    if not hashes:
        return spans, vecs, False, [1] * len(spans)
    source = store.files_source(db, own)
    notes = store.indexed_files(db, source)
    shared = store.text_hash_files(db, hashes, source)
    floor = max(BOILERPLATE_MIN, BOILERPLATE_SHARE * notes)
    common = {h for h, n in shared.items() if n >= floor}
    keep = [i for i, h in enumerate(hashes) if h not in common]
    # nothing of its own: what is left is shared too, by fewer notes (a placeholder line a
    # few stubs hold, under a tenth of the source, links a stub to whatever is nearest)
    own_text = any(shared.get(hashes[i], 1) < boilerplate.SHARED_MIN for i in keep)
    if not keep or len(keep) == len(hashes):
        keep = list(range(len(hashes)))
    return ([spans[i] for i in keep], vecs[keep], not own_text,
            [shared.get(hashes[i], 1) for i in keep])


def nearest_notes(db: sqlite3.Connection, vectors, vecs, k: int, exclude, asked=None
                  ) -> list[tuple[int, tuple[int, float, int]]]:
    """The k notes closest to any of `vecs` (the asked note's chunks), the files `exclude`d
    left out: [(file id, (its closest chunk, the score, the index of the asked chunk it is
    close to))], best first. A link counts for less when either end is boilerplate, by the end
    more notes share (boilerplate.weight, as in search): a chunk many notes hold, and one of
    the asked note's sections that `asked[i]` notes share (distinct_sections): a template's
    "Action items" in three meeting notes would link each of them to every note about what
    the items name."""
    hits = vectors.nearest_to_any(vecs, k * 30, np.array(sorted(exclude), dtype=np.int64))
    common = boilerplate.shared(db, [h[0] for h in hits])
    best: dict[int, tuple[int, float, int]] = {}
    for cid, fid, score, which in hits:
        score *= boilerplate.weight(max(common.get(cid, 1), asked[which] if asked else 1))
        if fid not in best or score > best[fid][1]:
            best[fid] = (cid, score, which)
    return sorted(best.items(), key=lambda x: -x[1][1])[:k]
