"""Search filters: which files a search may answer from.

Applied before the top k of each ranking: BM25 joins them into its FTS5 query; the vector
search masks the matrix rows by file before picking its k nearest. So a source with 1% of the
chunks gets a full list of candidates, not the few that survive a filter after ranking.

- sources: source names;
- path: a glob on the path relative to its source root (``*`` and ``?`` as SQLite GLOB: ``*``
  spans folders too, so ``Projects/*`` is everything under Projects); a path with no wildcard
  is that file or that folder (``Projects`` is ``Projects`` and ``Projects/*``). It ignores
  the case of ASCII letters, as SQLite's lower() does: ``*.pdf`` finds REPORT.PDF, which a
  document folder indexes (its include globs ignore case), and ``projects`` the Projects
  folder; and the form of accented letters (``café`` typed composed finds a file named
  decomposed, as macOS writes it, and the other way round);
- tag: an Obsidian tag (``#`` optional); a nested tag ``a/b`` matches the filter ``a``;
- since / before: the note's date (Unix seconds), since inclusive: the date it states
  (files.note_date_ns: its frontmatter's updated, else date, else created; a document's
  headers; a daily note's file name; a PDF's metadata: ragd/dates.py), else its file's
  modification time, which a copy or a sync makes new.
"""

from __future__ import annotations

import fnmatch
import sqlite3
import unicodedata
from dataclasses import dataclass

import numpy as np


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")  # as SQLite


@dataclass(frozen=True)
class Filters:
    sources: tuple[str, ...] | None = None
    path: str | None = None
    tag: str | None = None
    since: float | None = None
    before: float | None = None
    exclude_files: tuple[int, ...] = ()  # files an unsaved buffer stands in for

    @property
    def active(self) -> bool:
        return bool(self.exclude_files) or self.narrowed

    @property
    def narrowed(self) -> bool:
        """Did the user narrow the search (not only an editor's buffer standing in)?"""
        return any(v is not None for v in (self.sources, self.path, self.tag, self.since,
                                           self.before))

    def admits_buffer(self, source: str, rel: str) -> bool:
        """Does an unsaved buffer (of this source and path) pass? Tags and dates are of the
        file as indexed: a buffer passes them only when they are not asked for."""
        if self.sources is not None and source not in self.sources:
            return False
        if self.path is not None and not any(fnmatch.fnmatchcase(rel.translate(_LOWER), g)
                                             for g in path_globs(self.path)):
            return False
        return self.tag is None and self.since is None and self.before is None

    def where(self, f: str = "f") -> tuple[str, list]:
        """A SQL condition on the files table aliased `f` (and its parameters)."""
        conds, params = [], []
        if self.sources is not None:
            conds.append(f"{f}.source IN ({','.join('?' * len(self.sources))})")
            params += list(self.sources)
        if self.path is not None:
            globs = path_globs(self.path)
            conds.append("(" + " OR ".join(f"lower({f}.relpath) GLOB ?" for _ in globs) + ")")
            params += globs
        if self.tag is not None:
            tag = self.tag.lstrip("#")
            conds.append(f"EXISTS (SELECT 1 FROM json_each({f}.meta, '$.tags') t WHERE "
                         f"t.value = ? COLLATE NOCASE OR t.value LIKE ? ESCAPE '\\')")
            params += [tag, _like_prefix(tag) + "/%"]
        if self.since is not None:
            conds.append(f"COALESCE({f}.note_date_ns, {f}.mtime_ns) >= ?")
            params.append(int(self.since * 1e9))
        if self.before is not None:
            conds.append(f"COALESCE({f}.note_date_ns, {f}.mtime_ns) < ?")
            params.append(int(self.before * 1e9))
        if self.exclude_files:
            conds.append(f"{f}.id NOT IN ({','.join('?' * len(self.exclude_files))})")
            params += list(self.exclude_files)
        return (" AND ".join(conds) or "1"), params

    def file_ids(self, db: sqlite3.Connection) -> np.ndarray:
        """The ids of the files that pass (sorted), for the rankings' masks. Read as one
        string: a row object per file cost 9 ms for 18k files, this 3.6."""
        cond, params = self.where("f")
        ids = db.execute(f"SELECT group_concat(id) FROM (SELECT f.id AS id FROM files f "
                         f"WHERE {cond} ORDER BY f.id)", params).fetchone()[0]
        return np.fromstring(ids, dtype=np.int64, sep=",") if ids else np.empty(0, np.int64)


def path_globs(path: str) -> list[str]:
    """The globs a path filter stands for: itself when it has a wildcard; else the file of that
    name and everything in the folder of that name ('Getting Started' matched nothing: only
    'Getting Started/*' did)."""
    path = path.translate(_LOWER)  # (matched against the lower-cased path)
    if any(c in path for c in "*?["):
        globs = [path]
    else:
        path = path.strip("/")
        globs = [path, path + "/*"]
    # A name is stored as the file system gives it: composed (NFC, as typed) or decomposed
    # (NFD, as macOS and its sync tools write "café"). Either form of the filter finds either.
    return list(dict.fromkeys(unicodedata.normalize(form, g) for form in ("NFC", "NFD")
                              for g in globs))


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
