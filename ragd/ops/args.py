"""What every op takes, checked before it runs: its arguments (ARGS: name -> type, default;
REQUIRED for none), absolute paths, bounded queries, and the source a request names.
"""

from __future__ import annotations

import base64
import math
import os
from pathlib import Path
from typing import Any

from ragd import protocol as P
from ragd.replies import OpError

REQUIRED = object()

ARGS: dict[str, dict[str, tuple[type | tuple[type, ...], Any]]] = {
    "ping": {},
    "status": {},
    "sources": {},
    "search": {"query": (str, REQUIRED), "k": (int, None), "mode": (str, None),
               "sources": (list, None), "rerank": (bool, None), "wait": ((int, float), 0),
               "path": (str, None), "tag": (str, None), "since": ((int, float, str), None),
               "before": ((int, float, str), None), "group": (str, "note")},
    "get": {"path": (str, None), "path_bytes": (str, None), "line_start": (int, None),
            "line_end": (int, None)},
    "reindex": {"source": (str, None)},
    "files": {"source": (str, None), "status": (str, None), "limit": (int, 1000),
              "after": (str, None)},
    "gc": {"grace_hours": ((int, float), None)},
    "events": {},
    "wait": {"timeout": ((int, float), 60), "vectors": (bool, False)},
    "models": {},
    "models_pull": {"name": (str, REQUIRED)},
    "buffer_set": {"path": (str, REQUIRED), "text": (str, REQUIRED), "version": (int, None)},
    "buffer_drop": {"path": (str, REQUIRED)},
    "related": {"path": (str, None), "path_bytes": (str, None), "text": (str, None),
                "k": (int, 10)},
    "ask": {"question": (str, REQUIRED), "k": (int, None), "max_tokens": (int, None),
            "sources": (list, None), "path": (str, None), "tag": (str, None)},
    "reload": {},
    "stop": {},
}


def check_args(op: str, args: dict) -> dict:
    spec = ARGS[op]
    unknown = set(args) - set(spec)
    if unknown:
        raise OpError(P.BAD_ARGS, f"{op}: unknown argument(s) {', '.join(sorted(map(str, unknown)))}"
                      f"; it takes {', '.join(spec) or 'none'}")
    out = {}
    for name, (typ, default) in spec.items():
        if name not in args or args[name] is None:
            if default is REQUIRED:
                raise OpError(P.BAD_ARGS, f"{op}: missing argument '{name}'")
            out[name] = default
            continue
        value = args[name]
        if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
            kind = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise OpError(P.BAD_ARGS, f"{op}: '{name}' must be {kind}, "
                          f"got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise OpError(P.BAD_ARGS, f"{op}: '{name}' must be a finite number, got {value}")
        for v in (value if isinstance(value, list) else [value]):
            if isinstance(v, str) and not _encodable(v):
                raise OpError(P.BAD_ARGS, f"{op}: '{name}' is not valid Unicode (a lone "
                              f"surrogate)")
        out[name] = value
    return out


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def path_of(op: str, path: str | None, path_bytes: str | None) -> str | None:
    """A path given as text or as its bytes in base64 (path_bytes: a name that is not UTF-8,
    as replies give it, wire_path), as the str the file system takes."""
    if path_bytes is None:
        return path
    if path is not None:
        raise OpError(P.BAD_ARGS, f"{op}: give 'path' or 'path_bytes', not both")
    try:
        return os.fsdecode(base64.b64decode(path_bytes, validate=True))
    except ValueError:  # (binascii.Error is one)
        raise OpError(P.BAD_ARGS, f"{op}: 'path_bytes' is not base64") from None


def absolute(op: str, path: str) -> None:
    """A path argument must be absolute (or start with ~): a relative one would be resolved
    against the daemon's working folder, which is not the client's. A NUL character is
    refused first: no file has one, and the OS calls that resolve the path raise on it (an
    internal error)."""
    if "\0" in path:
        raise OpError(P.BAD_ARGS, f"{op}: path contains a NUL character")
    if not os.path.isabs(os.path.expanduser(path)):
        raise OpError(P.BAD_ARGS, f"{op}: path must be absolute (as search results give it), "
                      f"got {path!r}")
    # No file can have such a name (NAME_MAX, PATH_MAX), and the OS calls that resolve it
    # raise ENAMETOOLONG: said here as the bad argument it is.
    longest = max(path.split("/"), key=lambda part: len(part.encode("utf-8", "surrogateescape")))
    if (n := len(longest.encode("utf-8", "surrogateescape"))) > NAME_MAX:
        raise OpError(P.BAD_ARGS, f"{op}: a name in the path is {n} bytes long; a file or "
                      f"folder name is at most {NAME_MAX} bytes")
    if (n := len(path.encode("utf-8", "surrogateescape"))) >= PATH_MAX:
        raise OpError(P.BAD_ARGS, f"{op}: the path is {n} bytes long; a path is under "
                      f"{PATH_MAX} bytes")


NAME_MAX, PATH_MAX = 255, 4096  # bytes, as Linux (and macOS: 255, 1024) file systems allow


# The longest query: past it a search costs seconds of BM25 over every word, of the whole-note
# BM25 and of matching lines, growing with its length, for nothing a longer query adds (the
# embedding model reads its first 256 tokens).
MAX_QUERY_BYTES = 8192
MAX_QUERY_WORDS = 1000


def bounded(op: str, name: str, text: str) -> None:
    size, words = len(text.encode("utf-8")), len(text.split())
    if size > MAX_QUERY_BYTES or words > MAX_QUERY_WORDS:
        raise OpError(P.BAD_ARGS, f"{op}: the {name} is {size} bytes, {words} words; at most "
                      f"{MAX_QUERY_BYTES} bytes and {MAX_QUERY_WORDS} words (for the notes "
                      f"most like a passage, use related with its text)")



def source(cfg, op: str, name: str):
    """The configured source a request names (case aside: Config.named), or NOT_FOUND listing
    the known names."""
    src = cfg.named(name)
    if src is None:
        raise OpError(P.NOT_FOUND, f"{op}: no source named {name!r}; known: "
                      f"{', '.join(s.name for s in cfg.sources) or 'none'}")
    return src


def under(path: str, root: Path) -> bool:
    try:
        Path(path).relative_to(root)
        return True
    except ValueError:
        return False


# ops whose state belongs to the connection: their handler takes the session first
SESSION_OPS = {"buffer_set", "buffer_drop", "related"}


class NoSession:
    """The session of an in-process call: nothing to release on hang-up."""
    id = 0

    def on_close(self, fn) -> None:
        pass


NO_SESSION = NoSession()
