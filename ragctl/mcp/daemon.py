"""ragd as the tools see it: one request to the running daemon per tool call, on a fresh
connection. A daemon started (or restarted) after this server is found on the next call; when
none answers, the call is a ToolError that says so while the server keeps running."""

from __future__ import annotations

import socket
import threading
import tomllib
from typing import Any

from ragd import protocol as P
from ragctl.mcp.wire import ToolError

CALL_TIMEOUT = 30.0  # seconds ragd may take to answer one op (search adds its own wait)


class Call:
    """One tool call in flight: cancelling it closes its connection to ragd."""

    def __init__(self):
        self.cancelled = False
        self._conn: P.Client | None = None
        self._lock = threading.Lock()

    def attach(self, conn: P.Client) -> None:
        with self._lock:
            self._conn = conn
            if self.cancelled:
                self._hang_up()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            self._hang_up()

    def _hang_up(self) -> None:
        if self._conn is not None:
            try:
                self._conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Daemon:
    """ragd as the tools see it: an op in, a result or a ToolError out."""

    def __init__(self, socket_opt: str | None, config_opt: str | None):
        self.socket_opt, self.config_opt = socket_opt, config_opt

    def path(self):
        # Looked up on every call, so a config written (or fixed) later is followed.
        try:
            return P.socket_path(self.socket_opt, self.config_opt)
        except (OSError, tomllib.TOMLDecodeError, P.ConfigUnreadable) as e:
            raise ToolError(f"cannot read the ragd config to find its socket: {e}") from None

    def call(self, call: Call, op: str, timeout: float = CALL_TIMEOUT, **args) -> Any:
        path = self.path()
        try:
            conn = P.Client(path, timeout=timeout)
        except P.NotRunning:
            raise ToolError(f"ragd is not running (no daemon at {path}). Start it with "
                            f"'ragctl start', then call this tool again.") from None
        except PermissionError:
            raise ToolError(f"permission denied on {path}: is ragd running as another "
                            f"user?") from None
        except OSError as e:
            raise ToolError(f"cannot reach ragd at {path}: {e}") from None
        call.attach(conn)
        try:
            return conn.call(op, **args)
        except P.DaemonError as e:
            raise ToolError(f"{e.message} ({e.code})") from None
        except TimeoutError:
            raise ToolError(f"ragd did not answer within {timeout:.0f} s") from None
        except (OSError, P.ProtocolError) as e:
            raise ToolError(f"lost the connection to ragd: {e}") from None
        finally:
            conn.close()
