"""Which files of a source ragd indexes, and reading them with a reason when it cannot.

Globs match the path relative to the source root, with ``/`` separators: ``*`` stays inside
one folder, ``**/`` spans any number of folders (including none), ``?`` is one character.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

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
    return re.compile("".join(out) + r"\Z")


def matches(relpath: str, patterns: tuple[str, ...]) -> bool:
    return any(glob_regex(p).match(relpath) for p in patterns)


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
        rules.append((re.compile(prefix + body + suffix + r"\Z"), neg))
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
            rules.append((re.compile(re.escape(f) + ".*"), False))
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

    def wanted(self, relpath: str) -> bool:
        parts = relpath.split("/")
        if any(p.startswith(".") for p in parts):  # .obsidian/, .git/, .trash/, dotfiles
            return False
        if matches(parts[-1], DEBRIS):
            return False
        if not matches(relpath, self.source.include) or matches(relpath, self.source.exclude):
            return False
        ignored = False
        for pattern, neg in self.ignore:  # the last matching rule wins, as in git
            if pattern.match(relpath):
                ignored = not neg
        return not ignored



@dataclass(frozen=True)
class Seen:
    relpath: str
    size: int
    mtime_ns: int


def scan(source: Source) -> Iterator[Seen]:
    """Walk the source and yield each wanted regular file with its stat.

    Dot-folders are not entered. Symlinked folders are not followed (no loops); a symlinked file
    is yielded with the target's stat, and a broken one with size -1 so it can be recorded as
    skipped with its reason.
    """
    root = str(source.root)
    rules = Rules(source)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            it = os.scandir(os.path.join(root, rel_dir) if rel_dir else root)
        except OSError:
            continue
        with it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(rel)
                        continue
                    if not rules.wanted(rel):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=True)
                    except OSError:  # broken symlink or loop
                        yield Seen(rel, -1, 0)
                        continue
                    if entry.is_file(follow_symlinks=True):
                        yield Seen(rel, st.st_size, st.st_mtime_ns)
                except OSError:
                    continue


class Unreadable(Exception):
    """The file cannot be indexed; the message is the reason shown to the user."""


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


def read_bytes(path: Path, max_bytes: int) -> Content:
    """Stat, size-check, read and hash one file (no decoding)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise Unreadable("broken symlink") from None
        raise Unreadable("file vanished") from None
    except OSError as e:
        if e.errno == 40:  # ELOOP
            raise Unreadable("symlink loop") from None
        raise Unreadable(f"cannot stat: {e.strerror}") from None
    if st.st_size > max_bytes:
        raise Unreadable(f"too large ({st.st_size} bytes; the limit is index.max_file_bytes = "
                         f"{max_bytes})")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except PermissionError:
        raise Unreadable("permission denied") from None
    except OSError as e:
        raise Unreadable(f"cannot read: {e.strerror}") from None
    if len(data) > max_bytes:
        raise Unreadable(f"too large (over {max_bytes} bytes)")
    return Content(text="", hash=content_hash(data), size=len(data), mtime_ns=st.st_mtime_ns,
                   warning=None, data=data)


def read(path: Path, max_bytes: int) -> Content:
    """Read one text file. Raises Unreadable with the reason when it cannot be indexed."""
    content = read_bytes(path, max_bytes)
    data = content.data
    if b"\0" in data[:8192]:
        raise Unreadable("binary file (contains NUL bytes)")
    warning = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        warning = f"invalid UTF-8 at byte {e.start}; undecodable bytes replaced"
    if text.startswith("\ufeff"):
        text = text[1:]
    content.text, content.warning, content.data = text, warning, b""
    return content
