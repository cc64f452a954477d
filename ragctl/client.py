"""What every ragctl command shares: where the daemon listens, a call to it, its reply printed
as JSON or for people, and the one-line failure ragctl exits with.

It imports nothing from ragd but the protocol module, and finds the socket the same way ragd
does (--socket, $RAGD_SOCKET, else --config / $RAGD_CONFIG / the XDG config).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ragd import protocol as P


class Fail(Exception):
    """A one-line failure for the user; ragctl exits with its code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Down(Fail):
    """No ragd answers at the socket (and its config is not what to fix first)."""


_warned: set[str] = set()
_unsaid: list[str] = []  # the warning of a config read leniently, said once a daemon answers


def _socket(args) -> Path:
    """Where the daemon listens. A config file that is not valid TOML (being edited) still
    names it: a running daemon goes on with the config it read before, and can be asked, told
    to reload or stopped; ragctl says why it read the file leniently, once — when a daemon
    answers (with none, connect says what to fix instead)."""
    def broken(why: str) -> None:
        if why not in _warned:
            _warned.add(why)
            if getattr(args, "command", None) != "reload":  # (its refusal says why, once)
                _unsaid.append(f"ragctl: warning: {why}. The socket was taken from its "
                               f"[daemon] section as written; the running ragd goes on with "
                               f"the config it read before (fix the file, then 'ragctl "
                               f"reload')")
    path = P.socket_path(args.socket, args.config, broken=broken)
    if args.socket or os.environ.get("RAGD_SOCKET"):  # named: that one
        return path
    return where_it_runs(args.config, path)


def where_it_runs(config_arg, path: Path) -> Path:
    """The socket the daemon started with this config file listens at: `path` (as the file
    says), unless nothing answers there and the daemon's run record names another socket where
    it answers — the file was edited (or emptied) since that daemon started, and it reads its
    socket at start only. Said once on stderr, with how to move it."""
    try:
        cfg = P.find_config(config_arg)
    except OSError:
        return path
    rec = P.recorded_socket(cfg) if cfg is not None else None
    if rec is None or rec[0] == path or _ping(path) is not None:
        return path
    info = _ping(rec[0])
    if info is None or info.get("pid") != rec[1]:
        return path
    why = (f"ragd (pid {rec[1]}) listens at {rec[0]}, not at {path} as {cfg} says now: it "
           f"reads its socket at start only ('ragctl stop && ragctl start' moves it)")
    if why not in _warned_moved:
        _warned_moved.add(why)
        print(f"ragctl: warning: {why}", file=sys.stderr)
    return rec[0]


_warned_moved: set[str] = set()


def connect(args, timeout: float | None = 30.0) -> P.Client:
    path = _socket(args)
    try:
        client = P.Client(path, timeout=timeout)
    except P.NotRunning:
        _unsaid.clear()
        if _warned:  # its config is not valid TOML: that is what to fix first
            raise Fail(f"{sorted(_warned)[0]}; and no ragd answers at {path} (fix the file, "
                       f"then 'ragctl start')", 2)
        raise Down(f"ragd is not running (no daemon at {path}); start it with 'ragctl start'")
    except PermissionError:
        raise Fail(f"permission denied on {path}: is ragd running as another user?")
    while _unsaid:
        print(_unsaid.pop(0), file=sys.stderr)
    return client


def call(args, op: str, timeout: float | None = 30.0, **kw):
    with connect(args, timeout) as c:
        return c.call(op, **kw)


def emit(args, obj, human) -> None:
    if args.json:
        print(json.dumps(obj, ensure_ascii=False, indent=None))
    else:
        human(obj)


def _ping(path) -> dict | None:
    """The daemon's ping reply, or None when nothing answers at path."""
    try:
        with P.Client(path, timeout=5) as c:
            return c.call("ping")
    except (P.NotRunning, OSError, P.ProtocolError):
        return None


def _interactive(args) -> bool:
    """Progress lines only for a person at a terminal: not when piped, not with --json."""
    return not args.json and sys.stdout.isatty()
