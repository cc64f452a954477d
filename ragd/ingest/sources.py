"""Which files of a source ragd indexes, and reading them with a reason when it cannot.

Globs match the path relative to the source root, with ``/`` separators: ``*`` stays inside
one folder, ``**/`` spans any number of folders (including none), ``?`` is one character.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import stat as stat_mod
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ragd.config import Source


@functools.lru_cache(maxsize=512)
def glob_regex(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    # DOTALL: a file name may hold a newline, and "odd/**" must still match it
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@functools.lru_cache(maxsize=256)
def _any_of(patterns: tuple[str, ...], ignore_case: bool = False) -> re.Pattern | None:
    """One regex for a list of globs: a scan asks it of every file (179k files: the scan
    alone 1.82 -> 1.50 s, median of 4; a restart of the 1M-chunk index 9.8-10.0 -> 8.7-9.3 s,
    3 runs each, since the scan shares the interpreter with the vector load)."""
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{glob_regex(p).pattern})" for p in patterns),
                      re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def matches(relpath: str, patterns, ignore_case: bool = False) -> bool:
    rx = _any_of(tuple(patterns), ignore_case)
    return rx is not None and rx.match(relpath) is not None


# Editor and sync debris, by file name (names starting with "." are skipped anyway).
DEBRIS = ("*.swp", "*.swo", "*~", "*.tmp", "*.sync-conflict-*", "*.crdownload", "*.part")


def gitignore_rules(text: str) -> list[tuple[re.Pattern, bool]]:
    """(regex on the relative path, negated) per rule of a .gitignore-style file: # comments,
    ! negation, a trailing / for folders, a / inside anchors to the root, ** across folders."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        if neg:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.strip("/") if dir_only else line
        anchored = "/" in line
        body = glob_regex(line.lstrip("/")).pattern[:-2]  # drop the \Z
        prefix = "" if anchored else "(?:.*/)?"
        suffix = "/.*" if dir_only else "(?:/.*)?"
        rules.append((re.compile(prefix + body + suffix + r"\Z", re.DOTALL), neg))
    return rules


def obsidian_rules(filters: list) -> list[tuple[re.Pattern, bool]]:
    """The vault's "Excluded files" (userIgnoreFilters in .obsidian/app.json): a path prefix,
    or a /regex/."""
    rules = []
    for f in filters:
        if not isinstance(f, str) or not f:
            continue
        if len(f) > 2 and f.startswith("/") and f.endswith("/"):
            try:
                rules.append((re.compile(f[1:-1]), False))
            except re.error:
                continue
        else:
            rules.append((re.compile(re.escape(f) + ".*", re.DOTALL), False))
    return rules


class Rules:
    """Everything that decides whether a source indexes a path: its globs, the debris names,
    .ragignore at its root and, for a vault, Obsidian's excluded files."""

    def __init__(self, source: Source):
        self.source = source
        self.ignore: list[tuple[re.Pattern, bool]] = []
        try:
            self.ignore += gitignore_rules((source.root / ".ragignore").read_text(
                encoding="utf-8", errors="replace"))
        except OSError:
            pass
        if source.kind == "obsidian":
            try:
                app = json.loads((source.root / ".obsidian" / "app.json").read_text())
                self.ignore += obsidian_rules(app.get("userIgnoreFilters") or [])
            except (OSError, ValueError, AttributeError):
                pass
        # compiled once (a scan asks of every file: at 181k files, looking them up by their
        # patterns at each call was a third of the scan's time)
        # A document folder's globs ignore case: REPORT.PDF and Notes.MD are documents, as
        # they are to Windows and macOS. A vault's follow Obsidian, for which Notes.MD is
        # not a note (its file types are case-sensitive).
        fold = source.kind == "folder"
        self._debris = _any_of(DEBRIS)
        self._include = _any_of(tuple(source.include), fold)
        self._exclude = _any_of(tuple(source.exclude), fold)

    def wanted(self, relpath: str, listed: bool = False) -> bool:
        """listed: the path comes from a listing that enters no dot-folder (scan)."""
        name = relpath.rsplit("/", 1)[-1]
        if (name.startswith(".") if listed else any(
                p.startswith(".") for p in relpath.split("/"))):  # .obsidian/, .git/, dotfiles
            return False
        if self._debris.match(name):
            return False
        if self._include is None or not self._include.match(relpath) or (
                self._exclude is not None and self._exclude.match(relpath)):
            return False
        ignored = False
        for pattern, neg in self.ignore:  # the last matching rule wins, as in git
            if pattern.match(relpath):
                ignored = not neg
        return not ignored



class Seen(NamedTuple):
    """A file as a scan saw it. A tuple, so that a scan compares its files with the files
    table's (relpath, size, mtime_ns) rows as sets (store.file_stats), in C, rather than
    building an object per row and comparing them one by one in Python."""
    relpath: str
    size: int
    mtime_ns: int


@dataclass
class Listing:
    """What a scan saw: the wanted files, and the folders (or entries) it could not list.

    A file under an unlisted folder is neither present nor absent: it is not known, and must
    not be taken as deleted."""
    files: dict[str, Seen]
    unlisted: dict[str, str]  # relative path of a folder or entry ("" = the root) -> why

    def covers(self, relpath: str) -> bool:
        """Did the scan see the place where relpath would be (so its absence is real)?"""
        for d in self.unlisted:
            if d == "" or relpath == d or relpath.startswith(d + "/"):
                return False
        return True


def scan(source: Source) -> Listing:
    """Walk the source: each wanted entry but folders with its stat, and what could not be
    listed.

    Dot-folders are not entered. Symlinked folders are not followed (no loops); a symlink is
    listed with the target's stat, and a broken one with size -1 so it can be recorded as
    skipped with its reason (as is one leading outside the source: check_inside, and what is
    not a regular file: read_bytes).
    """
    root = str(source.root)
    rules = Rules(source)
    files: dict[str, Seen] = {}
    unlisted: dict[str, str] = {}
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            it = os.scandir(os.path.join(root, rel_dir) if rel_dir else root)
        except OSError as e:
            unlisted[rel_dir] = e.strerror or str(e)
            continue
        try:
            with it:
                for entry in it:
                    if entry.name.startswith("."):
                        continue
                    rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(rel)
                            continue
                        if not rules.wanted(rel, listed=True):
                            continue
                        try:
                            st = entry.stat(follow_symlinks=True)
                        except OSError:  # broken symlink or loop
                            files[rel] = Seen(rel, -1, 0)
                            continue
                        # Not only regular files: a FIFO, a device or a link to one (or to a
                        # folder) is listed too, so that it is recorded skipped with its
                        # reason, as when an event names it; left out, a scan would take
                        # its row for a file deleted
                        files[rel] = Seen(rel, st.st_size, st.st_mtime_ns)
                    except OSError as e:
                        unlisted[rel] = e.strerror or str(e)
        except OSError as e:  # the listing broke off part way
            unlisted[rel_dir] = e.strerror or str(e)
    return Listing(files, unlisted)


class Unreadable(Exception):
    """The file cannot be indexed; the message is the reason shown to the user. retry: an
    error of access (permission, I/O), not of the content, so the file is tried again later
    and what was indexed of it is kept meanwhile."""

    def __init__(self, reason: str, retry: bool = False):
        super().__init__(reason)
        self.retry = retry


@dataclass
class Content:
    text: str
    hash: str
    size: int
    mtime_ns: int
    warning: str | None = None
    data: bytes = b""


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def printable(name: str) -> str:
    """A path or name as shown to people and sent on the wire: bytes that were not UTF-8
    (surrogate-escaped by os functions) become U+FFFD."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def wire_path(path: str) -> dict:
    """A path as replies carry it: {"path": printable}, and for a name that is not UTF-8 (its
    printable form lost bytes) also "path_bytes", its exact bytes in base64, which `get`
    takes back."""
    shown = printable(path)
    if shown == path:
        return {"path": path}
    return {"path": shown,
            "path_bytes": base64.b64encode(os.fsencode(path)).decode("ascii")}


class Vanished(Unreadable):
    """The file is not there (any more)."""


class Outside(Unreadable):
    """The path leads out of its source (through a link, maybe swapped in a moment ago)."""


class Swapped(Unreadable):
    """What lies at the path changed while it was opened: a folder or file on it was replaced
    by a link (or another file) between its resolution and its opening. Tried again later."""

    def __init__(self, reason: str = "its path changed while it was read (a folder or file on "
                                     "it was replaced, by a link or another file)"):
        super().__init__(reason, retry=True)


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# A folder on the way: O_PATH (Linux) needs no read permission, as a path lookup does not.
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | _CLOEXEC


def real_inside(root: Path, path: Path) -> Path:
    """path with every link resolved, which must lie inside root (a real path); else Outside.
    A link anywhere on it counts, not only the file's own: a folder swapped for a link to
    another folder leads out of the source as surely."""
    try:
        real = Path(os.path.realpath(path))
    except OSError:  # a link on it removed while it was being resolved
        raise Swapped() from None
    if root not in real.parents:
        raise Outside(f"a link to a file outside the source ({real}): ragd does not follow "
                      f"links out of its sources")
    return real


def open_inside(root: Path, real: Path) -> int:
    """A descriptor of the file at `real` (a path under root with no link in it), opened one
    name at a time from root and following no link (openat with O_NOFOLLOW): what is opened
    is what lies there now. Resolving a path, checking it and then opening it again by name
    can be raced: a folder swapped for a link to an outside folder in between leads the open
    out of the source."""
    parts = real.relative_to(root).parts
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except OSError as e:
        raise Unreadable(f"cannot open its source's folder: {e.strerror}", retry=True) from None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        raise Vanished("file vanished") from None
    except PermissionError:
        raise Unreadable("permission denied", retry=True) from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):  # a link where none was
            raise Swapped() from None
        raise Unreadable(f"cannot open: {e.strerror}", retry=True) from None
    finally:
        os.close(fd)
    return out


def check_inside(source: Source, path: Path) -> None:
    """A linked file is indexed when the link stays inside its source; one leading out of it
    (a note linked to ~/.ssh/config, or /etc/passwd) is skipped with this reason. `get` never
    serves a file outside the sources, whatever the path says: search showed what get refused."""
    try:
        link = path.is_symlink()
    except PermissionError:  # its folder cannot be searched (chmod 000 since it was listed)
        raise Unreadable("permission denied", retry=True) from None
    except OSError as e:
        raise Unreadable(f"cannot stat: {e.strerror}", retry=True) from None
    if link:
        real = Path(os.path.realpath(path))
        root = Path(os.path.realpath(source.root))
        if not real.exists():  # a broken link or a loop, wherever it points: read_bytes says
            return             # which (a dangling one was called "a link outside the source")
        if root not in real.parents:
            raise Unreadable(f"a link to a file outside the source ({real}): ragd does not "
                             f"follow links out of its sources")
        # A link to a note the source indexes anyway is that note twice, and its copy went
        # stale: an edit of the target is heard under the target's path only, and the link's
        # old text could outrank the note. A link to a file the
        # source's rules leave out (a dot-folder, an ignored one) is how it gets indexed.
        target = real.relative_to(root).as_posix()
        if real.is_file() and Rules(source).wanted(target):  # (a link to a folder is not)
            raise Unreadable(f"a link to {target}, which is indexed under its own name")


@contextlib.contextmanager
def opened(path: Path, max_bytes: int, root: Path | None = None):
    """(descriptor, stat) of one regular file, checked (not a FIFO or a device, not too large)
    before it is read, and opened without blocking (a FIFO would wait for a writer forever).
    With `root` (its source's folder) the file is the one `path` leads to inside root, opened
    so that no link swapped in meanwhile is followed (real_inside, open_inside); without it,
    as the path says. Raises Unreadable with the reason."""
    try:
        os.stat(path)  # (for its errors: what a link leads to, whether it leads anywhere)
    except FileNotFoundError:
        if path.is_symlink():
            raise Unreadable("broken symlink") from None
        raise Vanished("file vanished") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Unreadable("symlink loop") from None
        raise Unreadable(f"cannot stat: {e.strerror}", retry=True) from None
    if root is not None:
        path = real_inside(root, path)
    try:  # (no link left to follow with root: what is there, not what it leads to)
        st = os.lstat(path) if root is not None else os.stat(path)
    except FileNotFoundError:
        raise Vanished("file vanished") from None
    except OSError as e:
        raise Unreadable(f"cannot stat: {e.strerror}", retry=True) from None
    if stat_mod.S_ISLNK(st.st_mode):  # a link there since it was resolved
        raise Swapped()
    if not stat_mod.S_ISREG(st.st_mode):
        raise Unreadable(f"not a regular file ({_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise Unreadable(f"too large ({st.st_size} bytes; the limit is index.max_file_bytes = "
                         f"{max_bytes})")
    if root is not None:
        fd = open_inside(root, path)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
        except FileNotFoundError:
            raise Vanished("file vanished") from None
        except PermissionError:
            raise Unreadable("permission denied", retry=True) from None
        except OSError as e:
            raise Unreadable(f"cannot open: {e.strerror}", retry=True) from None
    try:
        try:
            fst = os.fstat(fd)
        except OSError as e:
            raise Unreadable(f"cannot read: {e.strerror}", retry=True) from None
        if not stat_mod.S_ISREG(fst.st_mode):  # swapped for something else since the stat
            raise Unreadable(f"not a regular file ({_kind(fst.st_mode)})")
        if root is not None and (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise Swapped()
        yield fd, fst
    finally:
        os.close(fd)


def read_bytes(path: Path, max_bytes: int, root: Path | None = None) -> Content:
    """Stat, size-check, read and hash one file (no decoding), as `opened` opens it."""
    with opened(path, max_bytes, root) as (fd, st):
        return read_fd(fd, st, max_bytes)


def read_fd(fd: int, st: os.stat_result, max_bytes: int) -> Content:
    """The Content of an opened file: up to max_bytes of it (more is 'too large')."""
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise Unreadable(f"cannot read: {e.strerror}", retry=True) from None
    if len(data) > max_bytes:
        raise Unreadable(f"too large (over {max_bytes} bytes)")
    return Content(text="", hash=content_hash(data), size=len(data), mtime_ns=st.st_mtime_ns,
                   warning=None, data=data)


def _kind(mode: int) -> str:
    for test, name in ((stat_mod.S_ISFIFO, "a FIFO"), (stat_mod.S_ISSOCK, "a socket"),
                       (stat_mod.S_ISCHR, "a character device"), (stat_mod.S_ISBLK,
                                                                  "a block device"),
                       (stat_mod.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a file"


# A file whose characters are more than this share undecodable is not text (a binary without
# NUL bytes in its first 8 KiB): skipped with the reason, not indexed as chunks of garbage.
NOT_TEXT_SHARE = 0.25


def read(path: Path, max_bytes: int, root: Path | None = None) -> Content:
    """Read one text file (inside root: see opened). Raises Unreadable with the reason when it
    cannot be indexed."""
    return decode(read_bytes(path, max_bytes, root))


def decode(content: Content) -> Content:
    """A file's bytes as text (a file that is not text: Unreadable with the reason)."""
    data = content.data
    if b"\0" in data[:8192]:
        raise Unreadable("binary file (contains NUL bytes)")
    warning = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        bad = text.count("\ufffd")
        if bad > NOT_TEXT_SHARE * len(text):  # random bytes: about half; Latin-1 prose: few %
            raise Unreadable(f"not text: {100 * bad // len(text)}% of it is not valid UTF-8 "
                             f"(a binary file?)") from None
        warning = f"invalid UTF-8 at byte {e.start}; undecodable bytes replaced"
    if text.startswith("\ufeff"):
        text = text[1:]
    content.text, content.warning, content.data = text, warning, b""
    return content


def stat_of(path: Path) -> tuple[int, int]:
    """(size, mtime_ns) as the scan sees them; (-1, 0) for what cannot be stat'ed (as scan)."""
    try:
        st = path.stat()
    except OSError:
        return -1, 0
    return st.st_size, st.st_mtime_ns
