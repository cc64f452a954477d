"""The Unix-socket server: accepts clients, frames messages, hands requests to the ops.

Each connection gets its own thread, so a slow or stuck client holds only its own thread and
never blocks the others; requests on one connection are answered in order. The socket lives in
a 0700 directory with mode 0600, and every connection's peer uid is checked (SO_PEERCRED):
another user is refused even if the file modes were loosened.

Nothing a client sends can take the daemon down: undecodable payloads and bad requests get an
error reply and the connection goes on; only broken framing (an oversized frame, a line with no
end) closes the connection, after an error reply.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import select
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ragd import protocol as P
from ragd.replies import AfterReply, OpError, Stream
from ragd.workers import Worker

log = logging.getLogger("ragd.server")

SEND_TIMEOUT = 30.0  # a client that stops reading for this long is dropped
# A message begun must go on arriving: a frame or line that gets no byte for this long is
# dropped with its connection (held half-sent, each would keep a thread and a connection slot
# for good). Between messages a connection may stay silent as long as it likes (an editor's).
FRAME_IDLE = 10.0
# A refused connection (over max_connections, another user) is answered by a thread of its
# own, which waits this long for the client's first byte to answer in its encoding; at most
# REFUSERS of them at once, past which the reply goes out at once, as msgpack unless the
# client's first byte is already there.
REFUSE_WAIT = 1.0
REFUSERS = 64


def _peer_closed(conn: socket.socket) -> bool:
    """Has the client closed its end (EOF waiting to be read)? Never blocks: a request it
    sent meanwhile is data, not EOF, and stays to be read."""
    try:
        if not select.select([conn], [], [], 0)[0]:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):
        return True


class Session:
    """One connection's state: what an op keeps for as long as its client is connected (an
    editor's unsaved buffers), released when the connection ends, however it ends."""

    _ids = itertools.count(1)

    def __init__(self):
        self.id = next(Session._ids)
        self._closers: list[Callable[[], None]] = []

    def on_close(self, fn: Callable[[], None]) -> None:
        if fn not in self._closers:
            self._closers.append(fn)

    def close(self) -> None:
        for fn in self._closers:
            try:
                fn()
            except Exception:
                log.exception("releasing a connection's state")


M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_malloc_arenas(n: int = 2) -> None:
    """glibc gives threads that allocate at once their own heaps (up to 8 per core), each
    keeping what it freed: after 200 clients at once the daemon's RSS kept climbing from storm
    to storm (69, 92, 91, 105 MB); with 2 heaps it levels off (87, 85, 87 MB). A no-op where
    there is no glibc."""
    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, n)
    except (OSError, AttributeError):
        pass


class _Trimmer:
    """malloc_trim at most once a second, whichever connection thread ends a burst: its own
    lock, so two threads finishing at once neither both trim nor race on the time."""

    def __init__(self):
        self._lock = threading.Lock()
        self._at = 0.0
        try:
            self._trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # no glibc
            self._trim = None

    def __call__(self) -> None:
        if self._trim is None:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._at < 1.0:
                return
            self._at = now
        self._trim(0)


# After a burst of clients (each with its buffers and a read connection) has gone: glibc keeps
# freed memory in its heaps; malloc_trim returns what it can to the system, so the daemon's RSS
# goes back down. A no-op where there is no glibc.
_give_back_memory = _Trimmer()


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end, or None where the platform cannot tell."""
    if hasattr(socket, "SO_PEERCRED"):
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid
    return None  # macOS: the 0700 directory is the guard


def peer_allowed(uid: int | None, own_uid: int) -> bool:
    return uid is None or uid == own_uid


def prepare_socket_path(path: Path) -> None:
    """Create the socket's directory (0700) and remove a stale socket file.

    Raises RuntimeError if a live daemon already answers on the path.
    """
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, exist_ok=True)
        os.chmod(parent, 0o700)
    elif parent.stat().st_mode & 0o077:
        # Not ours to tighten (it may be /tmp); the 0600 socket and the uid check still hold.
        log.warning("the socket's folder %s is open to other users; ragd refuses their "
                    "connections, but a private (0700) folder is better", parent)
    if path.exists() or path.is_symlink():
        try:
            with P.Client(path, timeout=2.0) as c:
                info = c.call("ping")
        except (P.NotRunning, OSError, P.ProtocolError, P.DaemonError):
            log.info("removing stale socket %s", path)
            path.unlink()
        else:
            raise RuntimeError(f"another ragd (pid {info.get('pid')}) already serves the "
                               f"socket {path}; stop it with 'ragctl stop' or set daemon.socket")


class FrameStalled(Exception):
    """A message was begun and nothing more of it came for FRAME_IDLE seconds."""


def encoding_of(conn: socket.socket, wait: float) -> str:
    """The encoding a client speaks, from its first byte (not consumed), waiting up to `wait`
    seconds for it; msgpack when none comes."""
    try:
        if wait > 0:
            poll = select.poll()  # (not select: a descriptor past 1024 is out of its range)
            poll.register(conn, select.POLLIN)
            if not poll.poll(wait * 1000):
                return P.MSGPACK
        first = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, ValueError):
        return P.MSGPACK
    return P.encoding_of_first(first)


def linger_close(conn: socket.socket, max_bytes: int = 1 << 20, seconds: float = 0.5) -> None:
    """Close after an error reply so the peer still reads it.

    Closing a socket whose peer's data is unread resets the connection, and the reset can
    destroy the reply in flight; so stop writing, read and drop what is still coming (bounded),
    then close.
    """
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(seconds)
        seen = 0
        while seen < max_bytes:
            chunk = conn.recv(65536)
            if not chunk:
                break
            seen += len(chunk)
    except OSError:
        pass
    conn.close()


class Server:
    def __init__(self, path: Path, dispatch: Callable[[str, dict], Any], max_connections: int):
        self.path = path
        self.dispatch = dispatch
        self.max_connections = max_connections
        self.own_uid = os.getuid()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._refusing = 0  # refuse threads running
        self._lock = threading.Lock()
        self._closing = False
        self._accept = Worker("accept", self._accept_loop)

    def start(self) -> None:
        prepare_socket_path(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the file is born 0600: no window where others may connect
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(1024)  # a burst of clients waits its turn (capped by somaxconn)
        self._listener = sock
        self._accept.start()
        log.info("listening on %s", self.path)

    def close(self) -> None:
        """Stop accepting, remove the socket file, and end open connections."""
        self._closing = True
        if self._listener is not None:
            # Remove the file first, so no new client finds a dying daemon.
            try:
                if self.path.exists():
                    self.path.unlink()
            except OSError:
                pass
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._accept.stop(timeout=5)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    # -- accepting ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except OSError as e:
                if self._closing:
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors or memory: accepting again at once would spin.
                    log.warning("cannot accept a connection: %s; pausing 0.5 s", e)
                    time.sleep(0.5)
                continue
            with self._lock:
                n = len(self._conns)
                full = n >= self.max_connections
                if not full:
                    self._conns.add(conn)
            if full:
                # Said once a burst, not per connection: a flood would fill the log.
                if not self._refusing:
                    log.warning("refusing connections: %d open (daemon.max_connections)", n)
                self._refuse_later(conn, P.UNAVAILABLE,
                                   f"ragd is busy: {n} connections (limit "
                                   f"{self.max_connections}); try again in a moment")
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="conn",
                                 daemon=True).start()
            except RuntimeError as e:  # no thread can be started (a resource limit)
                with self._lock:
                    self._conns.discard(conn)
                log.warning("cannot serve a connection: %s", e)
                self._refuse_later(conn, P.UNAVAILABLE,
                                   f"ragd cannot serve more connections now: {e}")

    def _refuse_later(self, conn: socket.socket, code: str, message: str) -> None:
        """Refuse without holding up the accept thread: a refusal waits for the client's first
        byte and for it to read the reply (linger_close), and done on the accept thread each
        one would hold up every client behind it."""
        with self._lock:
            spare = self._refusing < REFUSERS
            if spare:
                self._refusing += 1
        if spare:
            try:
                threading.Thread(target=self._refusing_one, args=(conn, code, message),
                                 name="refuse", daemon=True).start()
                return
            except RuntimeError:
                with self._lock:
                    self._refusing -= 1
        # (so many at once: answered now, in the encoding of a first byte already there)
        try:
            conn.setblocking(False)
            conn.send(P.pack(P.error_reply(None, code, message), encoding_of(conn, 0)))
        except OSError:
            pass
        conn.close()

    def _refusing_one(self, conn: socket.socket, code: str, message: str) -> None:
        try:
            self._refuse(conn, code, message)
        finally:
            with self._lock:
                self._refusing -= 1

    def _refuse(self, conn: socket.socket, code: str, message: str) -> None:
        """An error reply, in the client's encoding (a JSON-lines client cannot read a msgpack
        frame), then close, letting it read the reply."""
        try:
            encoding = encoding_of(conn, REFUSE_WAIT)
            conn.settimeout(1.0)
            conn.sendall(P.pack(P.error_reply(None, code, message), encoding))
        except OSError:
            pass
        linger_close(conn)

    # -- one connection -------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        session = Session()
        try:
            uid = peer_uid(conn)
            if not peer_allowed(uid, self.own_uid):
                log.warning("refused a connection from uid %s", uid)
                self._refuse(conn, P.FORBIDDEN, f"uid {uid} may not use this daemon (owned by "
                             f"uid {self.own_uid})")
                return
            conn.settimeout(None)
            first = conn.recv(1, socket.MSG_PEEK)
            if not first:
                return
            conn.settimeout(SEND_TIMEOUT)  # bounds sendall; reads block in recv below
            encoding = P.encoding_of_first(first)
            try:
                if encoding == P.JSONL:
                    self._serve_jsonl(conn, session)
                else:
                    self._serve_msgpack(conn, session)
            except FrameStalled as e:
                self._send(conn, P.error_reply(None, P.BAD_FRAME, str(e)), encoding)
                linger_close(conn)
        except (ConnectionError, TimeoutError, OSError):
            pass
        except Exception:
            log.exception("connection handler crashed")
        finally:
            session.close()
            with self._lock:
                self._conns.discard(conn)
                last = not self._conns
            conn.close()
            if last:
                _give_back_memory()

    def _recv_exact(self, conn: socket.socket, n: int, begun: bool = True) -> bytes | None:
        """n bytes, or None at the end of the connection. `begun`: they are part of a message
        already begun, which must go on arriving (FRAME_IDLE); else the first may take as long
        as the client likes (a connection idle between requests)."""
        buf = bytearray()
        while len(buf) < n:
            conn.settimeout(FRAME_IDLE if begun or buf else None)
            try:
                chunk = conn.recv(min(n - len(buf), 1 << 20))
            except TimeoutError:
                raise FrameStalled(f"an incomplete message: nothing more of it came for "
                                   f"{FRAME_IDLE:.0f} s; closing the connection") from None
            if not chunk:
                return None
            buf += chunk
        conn.settimeout(SEND_TIMEOUT)
        return bytes(buf)

    def _serve_msgpack(self, conn: socket.socket, session: Session) -> None:
        while True:
            header = self._recv_exact(conn, P.HEADER.size, begun=False)
            if header is None:
                return
            (length,) = P.HEADER.unpack(header)
            if length > P.MAX_FRAME:
                self._send(conn, P.error_reply(None, P.FRAME_TOO_LARGE,
                                               f"frame of {length} bytes; the limit is "
                                               f"{P.MAX_FRAME}"), P.MSGPACK)
                linger_close(conn)
                return
            payload = self._recv_exact(conn, length)
            if payload is None:
                return
            self._handle(conn, payload, P.MSGPACK, session)

    def _serve_jsonl(self, conn: socket.socket, session: Session) -> None:
        buf = bytearray()
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > P.MAX_FRAME:
                    self._send(conn, P.error_reply(None, P.FRAME_TOO_LARGE,
                                                   f"line over {P.MAX_FRAME} bytes"), P.JSONL)
                    linger_close(conn)
                    return
                conn.settimeout(FRAME_IDLE if buf.strip() else None)  # (a line begun)
                try:
                    chunk = conn.recv(1 << 16)
                except TimeoutError:
                    raise FrameStalled(f"an incomplete line: nothing more of it came for "
                                       f"{FRAME_IDLE:.0f} s; closing the connection") from None
                conn.settimeout(SEND_TIMEOUT)
                if not chunk:
                    return
                buf += chunk
                continue
            line, buf = bytes(buf[:nl]), buf[nl + 1:]
            if line.strip():
                self._handle(conn, line, P.JSONL, session)

    def _handle(self, conn: socket.socket, payload: bytes, encoding: str,
                session: Session | None = None) -> None:
        try:
            msg = P.unpack_payload(payload, encoding)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            what = "JSON" if encoding == P.JSONL else "msgpack"
            self._send(conn, P.error_reply(None, P.BAD_FRAME, f"payload is not valid {what}: "
                                           f"{e}"), encoding)
            return
        if not isinstance(msg, dict):
            self._send(conn, P.error_reply(None, P.BAD_REQUEST,
                                           f"a request must be a map, got {type(msg).__name__}"),
                       encoding)
            return
        req_id = msg.get("id")
        op, args = msg.get("op"), msg.get("args", {})
        if args is None:
            args = {}
        if not isinstance(op, str) or not op:
            self._send(conn, P.error_reply(req_id, P.BAD_REQUEST, "the request has no 'op' "
                                           "string"), encoding)
            return
        if not isinstance(args, dict):
            self._send(conn, P.error_reply(req_id, P.BAD_ARGS, "'args' must be a map"), encoding)
            return
        try:
            result = self.dispatch(op, args, session)
            then = None
            if isinstance(result, AfterReply):
                result, then = result.result, result.then
            if isinstance(result, Stream):
                try:
                    for item in result.items:
                        if item is None:
                            if _peer_closed(conn):
                                raise ConnectionResetError("the client closed the connection")
                            continue
                        self._send(conn, {"id": req_id, "result": item, "final": False},
                                   encoding)
                finally:  # (the client gone: its work stops now, not when collected)
                    close = getattr(result.items, "close", None)
                    if close is not None:
                        close()
                result = result.last()
            self._send(conn, {"id": req_id, "result": result}, encoding)
            if then is not None:
                then()
        except OpError as e:
            self._send(conn, P.error_reply(req_id, e.code, e.message), encoding)
        except (ConnectionError, TimeoutError):
            raise
        except Exception as e:
            log.exception("op %r failed", op)
            self._send(conn, P.error_reply(req_id, P.INTERNAL, f"{type(e).__name__}: {e}"),
                       encoding)

    def _send(self, conn: socket.socket, msg: dict, encoding: str) -> None:
        try:
            data = P.pack(msg, encoding)
        except (TypeError, ValueError, OverflowError) as e:  # a ragd bug
            log.error("cannot encode the reply to request %r: %s", msg.get("id"), e)
            data = P.pack(P.error_reply(msg.get("id"), P.INTERNAL, f"cannot encode reply: {e}"),
                          encoding)
        if len(data) > P.MAX_FRAME + P.HEADER.size:
            # The client would refuse it: say so instead (ops page their replies to fit).
            log.error("the reply to request %r is %d bytes, over the %d-byte frame limit",
                      msg.get("id"), len(data), P.MAX_FRAME)
            data = P.pack(P.error_reply(msg.get("id"), P.REPLY_TOO_LARGE,
                                        f"the reply would be {len(data)} bytes, over the "
                                        f"{P.MAX_FRAME}-byte limit; ask for less (a smaller k "
                                        f"or limit)"), encoding)
        conn.sendall(data)
