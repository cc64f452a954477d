"""The ragd wire protocol, shared by the daemon and every client.

This module is the only part of ``ragd`` that ``ragctl`` imports, so it must stay light: standard
library and msgpack only, nothing else from ragd. It holds the framing, the error codes, the
small blocking client, and the rules for finding the daemon's socket (so that ``ragd`` and
``ragctl`` can never disagree about where it is). The full description for plugin authors is
``docs/protocol.md``; keep the two in step.

Framing. A connection speaks one of two encodings, chosen by its first byte:

* msgpack frames: a 4-byte big-endian length, then a msgpack map of that many bytes;
* JSON lines: one JSON object per line (the first byte is ``{``, or white space or a UTF-8
  byte order mark before it), for editor plugins without msgpack. A length prefix can start
  with none of these: any first byte but 0 announces a frame of over 16 MB, above
  :data:`MAX_FRAME`.

Requests are maps ``{"id": any, "op": str, "args": map}``; replies are ``{"id": same, "result":
...}`` or ``{"id": same, "error": {"code": str, "message": str}}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import struct
import time
import tomllib
import unicodedata
from pathlib import Path
from typing import Any, Iterator

import msgpack

PROTOCOL_VERSION = 1

# Size of the frame header: the payload length packed as !I, 4 bytes in network order.
HEADER = struct.Struct("!I")
# Requests are small; anything above this is refused before it is read into memory.
MAX_FRAME = 8 * 1024 * 1024
MAX_K = 1000  # results a search may ask for (search.k in the config is held to it too)
# Unicode categories whose characters the index holds as words of their own (emoji, dingbats,
# arrows, mathematical signs: FTS5's tokenizer drops them); a client marks them in results too
SYMBOL_CATEGORIES = ("So", "Sm")
# ASCII operators the index holds as words too (':=' in PEP 572, '->' in a signature): a run of
# these characters is one when the whole run is among OPERATORS (so '-->' closing a comment,
# a '---' rule, '**' of bold text are not; '==' of an Obsidian highlight is, as grep finds it)
OPERATOR_RUN = re.compile(r"[-:=<>!&|+*/?%^~.]{2,}")
OPERATORS = frozenset((":=", "->", "=>", "<-", "<=", ">=", "==", "!=", "===", "!==", "&&", "||",
                       "::", "|>", "+=", "-=", "*=", "/=", "<=>", "??", "?.", "**=", "//=",
                       "<<=", ">>=", "%="))


def operators(text: str) -> list[str]:
    """The OPERATORS of a text, in order."""
    return [m for m in OPERATOR_RUN.findall(text) if m in OPERATORS]


def signs(text: str) -> list[str]:
    """The signs of a text the index holds as words, in order: its symbol characters (of
    SYMBOL_CATEGORIES), then its OPERATORS. (Here, for ragctl marks them as ragd finds them.)"""
    chars = [] if text.isascii() else [
        ch for ch in text if ch > "\x7f" and unicodedata.category(ch) in SYMBOL_CATEGORIES]
    return chars + operators(text)


_FOLDED: dict[int, str] = {}  # code point -> what fold makes of it (for str.translate)


def fold(text: str) -> str:
    """The text as the index compares words: each letter with a diacritic as its base letter
    (FTS5's remove_diacritics: 'café' matches 'cafe'), one character for one, so that a
    position in the folded text is the same position in the text (where to mark a match).
    A sign stays itself ('≠' is no '=')."""
    if text.isascii():
        return text
    for ch in set(text):  # (each character's fold once, then translate's own loop, in C)
        if ord(ch) > 127 and ord(ch) not in _FOLDED:
            base = "".join(c for c in unicodedata.normalize("NFD", ch)
                           if not unicodedata.combining(c)) if ch.isalpha() else ch
            _FOLDED[ord(ch)] = base if len(base) == 1 else ch
    return text.translate(_FOLDED)

# Error codes. Documented in docs/protocol.md: add one there when you add one here.
BAD_FRAME = "bad_frame"  # undecodable framing or payload (not msgpack / not JSON)
FRAME_TOO_LARGE = "frame_too_large"  # a frame or line over MAX_FRAME; the connection is closed
BAD_REQUEST = "bad_request"  # decodable, but not a request map with an "op" string
UNKNOWN_OP = "unknown_op"  # no such op
BAD_ARGS = "bad_args"  # missing, unknown or ill-typed arguments
NOT_FOUND = "not_found"  # a named thing (a source, a file) does not exist
UNAVAILABLE = "unavailable"  # the op needs something that is not running or not configured
FORBIDDEN = "forbidden"  # the peer is another user; the connection is closed
SHUTTING_DOWN = "shutting_down"  # the daemon is stopping
INTERNAL = "internal"  # a bug in ragd; the message carries the exception
REPLY_TOO_LARGE = "reply_too_large"  # the reply would exceed MAX_FRAME; ask for less
BAD_CONFIG = "bad_config"  # reload: the config file cannot be used (the old one stays)

ERROR_CODES = (BAD_FRAME, FRAME_TOO_LARGE, BAD_REQUEST, UNKNOWN_OP, BAD_ARGS, NOT_FOUND,
               UNAVAILABLE, FORBIDDEN, SHUTTING_DOWN, INTERNAL, REPLY_TOO_LARGE, BAD_CONFIG)

MSGPACK = "msgpack"
JSONL = "jsonl"


class ProtocolError(Exception):
    """The peer broke the framing: the connection cannot continue."""


class DaemonError(Exception):
    """An error reply from the daemon, raised by :class:`Client`."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ConfigUnreadable(Exception):
    """The config file cannot be read (to find the socket, or to edit it); the message names
    the file."""


class NotRunning(Exception):
    """No daemon answers at the socket path (missing socket, refused, or stale)."""


# ---------------------------------------------------------------------------------------------
# Encoding

def pack(msg: dict, encoding: str = MSGPACK) -> bytes:
    """Encode one message for the wire, framing included."""
    if encoding == JSONL:
        return json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    data = msgpack.packb(msg, use_bin_type=True)
    return HEADER.pack(len(data)) + data


# The first bytes a JSON-lines client may send (see the module's docstring): a JSON client
# that writes a space, a newline or a byte order mark first would otherwise get a msgpack
# reply about a frame it never sent
JSON_FIRST = (b"{", b" ", b"\t", b"\r", b"\n", b"\xef")


def encoding_of_first(first: bytes) -> str:
    """The encoding a connection speaks, from its first byte."""
    return JSONL if first in JSON_FIRST else MSGPACK


def unpack_payload(data: bytes, encoding: str) -> Any:
    """Decode one payload (without its framing); raises ValueError when undecodable."""
    if encoding == JSONL:
        return json.loads(data.decode("utf-8").removeprefix("\ufeff"))
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ValueError(str(e) or type(e).__name__) from e


def error_reply(req_id: Any, code: str, message: str) -> dict:
    return {"id": req_id, "error": {"code": code, "message": message}}


# ---------------------------------------------------------------------------------------------
# Locating the daemon. ragd and ragctl both call these, so they agree by construction.

def xdg(name: str, fallback: str, env=os.environ) -> Path:
    value = env.get(name)
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / fallback


def find_config(cli_path: str | os.PathLike | None = None, env=os.environ) -> Path | None:
    """The config file in force: --config, else $RAGD_CONFIG, else the XDG one if it exists."""
    if cli_path:
        return Path(cli_path).expanduser()
    if env.get("RAGD_CONFIG"):
        return Path(env["RAGD_CONFIG"]).expanduser()
    candidate = xdg("XDG_CONFIG_HOME", ".config", env) / "ragd" / "config.toml"
    return candidate if candidate.exists() else None


def not_a_file(cfg: Path) -> str | None:
    """Why a config path that exists is no config file (a folder: `--config ~/.config/ragd`),
    or None. ragd and ragctl say it alike, as a config error; naming the config.toml inside
    when there is one. (Opened, a folder gave "cannot read: Is a directory", and the commands
    that edit the config an OS error.)"""
    if not cfg.is_dir():
        return None
    inside = cfg / "config.toml"
    return f"{cfg}: is a folder, not a config file" + (
        f" (did you mean {inside}?)" if inside.is_file() else "")


def default_data_dir(env=os.environ) -> Path:
    return xdg("XDG_DATA_HOME", ".local/share", env) / "ragd"


def default_socket_path(data_dir: Path, env=os.environ) -> Path:
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "ragd" / "ragd.sock"
    return data_dir / "ragd.sock"


def run_record(config: Path, env=os.environ) -> Path:
    """Where a daemon started with this config file says which socket it listens at and its
    pid, while it runs. A daemon reads [daemon] socket at its start only: edited while it runs
    (or the file emptied), the file names another socket, and a client reading the file alone
    finds nothing there — and would start a second daemon, or call a running one stopped. The
    client then asks the socket of the record (recorded_socket)."""
    runtime = env.get("XDG_RUNTIME_DIR")
    base = (Path(runtime) / "ragd" if runtime and os.path.isabs(runtime)
            else xdg("XDG_STATE_HOME", ".local/state", env) / "ragd")
    key = hashlib.sha256(os.fsencode(os.path.realpath(config))).hexdigest()[:32]
    return base / "runs" / f"{key}.json"


def write_run_record(config: Path, sock: Path, env=os.environ) -> None:
    """This daemon's record; the records of daemons no longer running (killed: a stop
    removes its own) are removed, so the folder holds no more than the daemons running."""
    path = run_record(config, env)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for other in path.parent.glob("*.json"):
        try:
            pid = int(json.loads(other.read_text())["pid"])
            os.kill(pid, 0)
        except ProcessLookupError:
            other.unlink(missing_ok=True)
        except (OSError, ValueError, KeyError, TypeError):  # (another user's pid: alive)
            pass
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"config": os.path.realpath(config), "socket": str(sock),
                               "pid": os.getpid()}))
    tmp.replace(path)


def drop_run_record(config: Path, env=os.environ) -> None:
    """The record gone at a stop, if it is still this process's (a later daemon's stays)."""
    path = run_record(config, env)
    if (recorded_socket(config, env) or (None, None))[1] == os.getpid():
        try:
            path.unlink()
        except OSError:
            pass


def recorded_socket(config: Path | None, env=os.environ) -> tuple[Path, int] | None:
    """(socket, pid) of the record of a daemon started with this config file, or None. Whether
    that daemon still runs is for the caller to ask (a crash leaves its record)."""
    if config is None:
        return None
    try:
        rec = json.loads(run_record(config, env).read_text())
        return Path(rec["socket"]), int(rec["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def upgrading_path(sock: Path) -> Path:
    """A file beside the socket while the daemon upgrades its index before answering (a
    migration: a minute or more at a million chunks): `ragctl start` waits on while it is
    there, instead of giving up at its usual timeout."""
    sock = Path(sock)
    return sock.with_name(sock.name + ".upgrading")


def resolve_paths(daemon_table: dict | None, env=os.environ) -> tuple[Path, Path]:
    """(data_dir, socket) from a config's ``[daemon]`` table (may be None) and the environment."""
    table = daemon_table or {}
    data_dir = Path(table["data_dir"]).expanduser() if table.get("data_dir") else default_data_dir(env)
    sock = Path(table["socket"]).expanduser() if table.get("socket") else default_socket_path(data_dir, env)
    return data_dir, sock


def socket_path(cli_socket=None, cli_config=None, env=os.environ, broken=None) -> Path:
    """Where a client finds the daemon: --socket, $RAGD_SOCKET, else as the config says.
    A config that is not valid TOML raises ConfigUnreadable; with `broken` (a function of the
    reason) its [daemon] socket and data_dir are read line by line instead, and broken told
    why: a daemon running on the config it read before can still be asked and stopped."""
    if cli_socket:
        return Path(cli_socket).expanduser()
    if env.get("RAGD_SOCKET"):
        return Path(env["RAGD_SOCKET"]).expanduser()
    cfg = find_config(cli_config, env)
    table = None
    if cfg is not None and not cfg.exists():  # named by --config or $RAGD_CONFIG: a typo
        raise ConfigUnreadable(f"{cfg}: config file not found")
    # A folder is refused, not read leniently as `broken` reads a file being edited: it names
    # no socket, and a guessed one could be another daemon's (which 'stop' would stop).
    if cfg is not None and (why := not_a_file(cfg)):
        raise ConfigUnreadable(why)
    if cfg is not None:
        try:
            with open(cfg, "rb") as f:
                table = tomllib.load(f).get("daemon")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            why = not_utf8(e) if isinstance(e, UnicodeDecodeError) else str(e)
            if broken is None:
                raise ConfigUnreadable(f"{cfg}: not valid TOML: {why}") from None
            table = _daemon_lines(cfg)
            broken(f"{cfg}: not valid TOML: {why}")
        except OSError as e:
            raise ConfigUnreadable(f"{cfg}: cannot read: {e.strerror}") from None
        if table is not None and not isinstance(table, dict):
            table = None
    return resolve_paths(table, env)[1]


def not_utf8(e: UnicodeDecodeError) -> str:
    """Why a config file is not TOML's UTF-8, for the user."""
    return f"not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start})"


_DAEMON_KEY = re.compile(r"""^(socket|data_dir)\s*=\s*(?:"([^"\\]*)"|'([^']*)')\s*(?:#.*)?$""")


def _daemon_lines(cfg: Path) -> dict:
    """The plain `socket = "…"` and `data_dir = "…"` lines of a config's [daemon] table, read
    line by line (the file is not valid TOML)."""
    table: dict = {}
    section = None
    for line in cfg.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.split("#")[0].strip()
        elif section == "[daemon]" and (m := _DAEMON_KEY.match(line)):
            table[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
    return table


# ---------------------------------------------------------------------------------------------
# A small blocking client (used by ragctl and the tests).

class Client:
    """One connection to the daemon, msgpack-framed, one request at a time."""

    def __init__(self, path: str | os.PathLike, timeout: float | None = 30.0):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        try:
            while True:
                try:
                    self.sock.connect(self.path)
                    break
                except BlockingIOError:
                    # The daemon's accept queue is full (a burst of clients): a socket with a
                    # timeout gets EAGAIN at once instead of waiting its turn. Wait it here.
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.01)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            self.sock.close()
            raise NotRunning(f"ragd is not running (no daemon at {self.path})") from e
        except OSError:
            self.sock.close()
            raise
        self._next_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, op: str, **args: Any) -> int:
        self._next_id += 1
        try:
            self.sock.sendall(pack({"id": self._next_id, "op": op, "args": args}))
        except (BrokenPipeError, ConnectionResetError):
            # The daemon refused the connection (busy, another user) and closed it before
            # the request went out: its reply is still there to read, and says why.
            refusal = self._refusal()
            if refusal is not None:
                raise refusal from None
            raise
        return self._next_id

    def _refusal(self) -> "DaemonError | None":
        try:
            reply = self.recv()
        except (OSError, ProtocolError, ValueError):
            return None
        err = reply.get("error") if isinstance(reply, dict) else None
        if not isinstance(err, dict):
            return None
        return DaemonError(err.get("code", INTERNAL), err.get("message", ""))

    def recv(self) -> dict:
        header = self._recv_exact(HEADER.size)
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME:
            raise ProtocolError(f"reply frame of {length} bytes exceeds the limit")
        return unpack_payload(self._recv_exact(length), MSGPACK)

    def call(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raise DaemonError on an error reply."""
        req_id = self.send(op, **args)
        for reply in self.replies(req_id):
            if reply.get("final", True):
                return reply["result"]
        raise ProtocolError("stream ended without a final reply")  # pragma: no cover

    def replies(self, req_id: int) -> Iterator[dict]:
        """Yield the replies to one request until its final one (streams send several)."""
        while True:
            reply = self.recv()
            if reply.get("id") != req_id:
                # id null: an error about the connection, not a request (the daemon busy,
                # another user, a frame it could not read); it says why
                if reply.get("id") is None and isinstance(reply.get("error"), dict):
                    err = reply["error"]
                    raise DaemonError(err.get("code", INTERNAL), err.get("message", ""))
                raise ProtocolError(f"reply for id {reply.get('id')!r}, expected {req_id}")
            if "error" in reply:
                err = reply["error"] or {}
                raise DaemonError(err.get("code", INTERNAL), err.get("message", ""))
            yield reply
            if reply.get("final", True):
                return

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            buf += chunk
        return bytes(buf)
