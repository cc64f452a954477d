"""The socket protocol against the real daemon: framing, bad input, concurrency, peer checks."""

from __future__ import annotations

import json
import os
import socket
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest

from ragd import protocol as P
from ragd.server import peer_allowed, peer_uid


def raw(d) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(d.socket))
    return s


def read_frame(s: socket.socket) -> dict | None:
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (n,) = P.HEADER.unpack(head)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return msgpack.unpackb(body, raw=False)


def read_line(f) -> dict:
    return json.loads(f.readline())


@pytest.fixture
def daemon(make_daemon):
    with make_daemon() as d:
        d.wait_idle()
        yield d


def test_msgpack_round_trip_and_ids(daemon):
    s = raw(daemon)
    s.sendall(P.pack({"id": "abc", "op": "ping"}))
    reply = read_frame(s)
    assert reply["id"] == "abc" and reply["result"]["pid"] == daemon.proc.pid
    # Pipelined requests are answered in order.
    s.sendall(P.pack({"id": 1, "op": "ping"}) + P.pack({"id": 2, "op": "sources"}))
    assert read_frame(s)["id"] == 1
    assert read_frame(s)["result"][0]["name"] == "obsidian-tasks-docs"
    s.close()


def test_garbage_payload_gets_an_error_and_the_connection_goes_on(daemon):
    s = raw(daemon)
    junk = b"\xc1\xc1\xc1 this is not msgpack"
    s.sendall(P.HEADER.pack(len(junk)) + junk)
    reply = read_frame(s)
    assert reply["id"] is None and reply["error"]["code"] == P.BAD_FRAME
    s.sendall(P.pack({"id": 7, "op": "ping"}))
    assert read_frame(s)["id"] == 7
    s.close()


def test_requests_that_are_not_requests(daemon):
    s = raw(daemon)
    cases = [
        ([1, 2, 3], None, P.BAD_REQUEST),
        ({"id": 1}, 1, P.BAD_REQUEST),
        ({"id": 2, "op": 42}, 2, P.BAD_REQUEST),
        ({"id": 3, "op": "explode"}, 3, P.UNKNOWN_OP),
        ({"id": 4, "op": "search", "args": {}}, 4, P.BAD_ARGS),
        ({"id": 5, "op": "search", "args": {"query": 12}}, 5, P.BAD_ARGS),
        ({"id": 6, "op": "search", "args": {"query": "x", "k": "many"}}, 6, P.BAD_ARGS),
        ({"id": 7, "op": "search", "args": {"query": "x", "k": 0}}, 7, P.BAD_ARGS),
        ({"id": 8, "op": "search", "args": {"query": "x", "colour": "red"}}, 8, P.BAD_ARGS),
        ({"id": 9, "op": "search", "args": {"query": "x", "mode": "psychic"}}, 9, P.BAD_ARGS),
        ({"id": 10, "op": "search", "args": {"query": "x", "sources": ["nope"]}}, 10, P.NOT_FOUND),
        ({"id": 11, "op": "search", "args": ["query"]}, 11, P.BAD_ARGS),
        ({"id": 12, "op": "reindex", "args": {"source": "nope"}}, 12, P.NOT_FOUND),
    ]
    for msg, want_id, code in cases:
        s.sendall(P.pack(msg))
        reply = read_frame(s)
        assert reply["id"] == want_id, msg
        assert reply["error"]["code"] == code, (msg, reply)
        assert reply["error"]["message"]
    # both of two arguments where one is wanted: the message says "not both"
    for op, args in (("related", {"path": "/x.md", "text": "y"}),
                     ("get", {"path": "/x.md", "path_bytes": "L3gubWQ="})):
        s.sendall(P.pack({"id": 13, "op": op, "args": args}))
        reply = read_frame(s)
        assert reply["error"]["code"] == P.BAD_ARGS and reply["error"]["message"].endswith(
            ", not both"), reply
    s.sendall(P.pack({"id": 99, "op": "search", "args": {"query": "!!! ??? ..."}}))
    assert read_frame(s)["result"]["results"] == []  # nothing searchable, not an error
    s.close()


def test_oversized_frame_is_refused_and_closed(daemon):
    s = raw(daemon)
    s.sendall(P.HEADER.pack(P.MAX_FRAME + 1))
    reply = read_frame(s)
    assert reply["error"]["code"] == P.FRAME_TOO_LARGE
    assert s.recv(1) == b""  # closed
    s.close()
    assert daemon.call("ping")["pid"] == daemon.proc.pid


def test_truncated_frame_then_hangup(daemon):
    s = raw(daemon)
    s.sendall(P.HEADER.pack(100) + b"\x81\xa2id")
    s.close()
    assert daemon.call("ping")["pid"] == daemon.proc.pid


def test_json_lines(daemon):
    s = raw(daemon)
    f = s.makefile("rb")
    s.sendall(b'{"id": 1, "op": "search", "args": {"query": "chrono library", "k": 2}}\n')
    reply = read_line(f)
    assert reply["id"] == 1 and len(reply["result"]["results"]) == 2
    s.sendall(b'{"id": 2, "op": \n')  # broken JSON: an error, the line framing survives
    reply = read_line(f)
    assert reply["id"] is None and reply["error"]["code"] == P.BAD_FRAME
    s.sendall(b'{"id": 3, "op": "nope"}\n{"id": 4, "op": "ping"}\n')
    assert read_line(f)["error"]["code"] == P.UNKNOWN_OP
    assert read_line(f)["result"]["pid"] == daemon.proc.pid
    s.sendall(b"\xff\xfe{{{\n")
    assert read_line(f)["error"]["code"] == P.BAD_FRAME
    s.close()


def test_json_lines_may_begin_with_white_space_or_a_byte_order_mark(daemon):
    """A JSON client that wrote a space, a newline or a UTF-8 BOM first got a msgpack reply
    about a 538999586-byte frame it never sent (a fresh-user walk): those bytes can start no
    msgpack frame under MAX_FRAME, so they mean JSON lines too."""
    for start in (b"  ", b"\n\n", b"\t", b"\r\n", b"\xef\xbb\xbf"):
        s = raw(daemon)
        f = s.makefile("rb")
        s.sendall(start + b'{"id": 7, "op": "ping"}\n{"id": 8, "op": "ping"}\n')
        assert read_line(f)["id"] == 7, start
        assert read_line(f)["result"]["pid"] == daemon.proc.pid, start
        s.close()


def test_json_line_without_end_is_bounded(daemon):
    s = raw(daemon)
    s.sendall(b'{"id": 1, "op": "ping", "pad": "' + b"x" * (P.MAX_FRAME + 10))
    f = s.makefile("rb")
    assert read_line(f)["error"]["code"] == P.FRAME_TOO_LARGE
    s.close()
    assert daemon.call("ping")


def test_32_concurrent_searches_during_a_reindex(daemon):
    daemon.call("reindex")
    queries = ["recurring task", "done date", "chrono library reads dates", "custom filters",
               "query file defaults", "dataview", "priority emoji", "global filter"]
    n_clients, per_client = 32, 5
    barrier = threading.Barrier(n_clients)

    def client(i):
        with daemon.client() as c:
            barrier.wait()
            out = []
            for j in range(per_client):
                res = c.call("search", query=queries[(i + j) % len(queries)], k=5)
                out.append(len(res["results"]))
            return out

    with ThreadPoolExecutor(n_clients) as ex:
        counts = list(ex.map(client, range(n_clients)))
    assert len(counts) == n_clients
    # Every search answered; they ran while files were being rewritten, and found things.
    assert all(len(c) == per_client for c in counts)
    assert sum(map(sum, counts)) > 0
    st = daemon.wait_idle()
    assert st["totals"]["files_indexed"] == 2 * 118


def test_a_stuck_client_blocks_nobody(daemon):
    stuck = [raw(daemon) for _ in range(5)]
    for s in stuck:
        s.sendall(P.HEADER.pack(1000) + b"\x81")  # half a frame, then silence
    silent = raw(daemon)  # connected, never sends
    t0 = time.monotonic()
    for _ in range(20):
        assert daemon.call("search", query="recurring", k=1)["results"]
    assert time.monotonic() - t0 < 10
    for s in stuck + [silent]:
        s.close()


def test_peer_check_unit():
    assert peer_allowed(os.getuid(), os.getuid())
    assert not peer_allowed(os.getuid() + 1, os.getuid())
    assert peer_allowed(None, os.getuid())  # platforms without SO_PEERCRED: the 0700 dir guards
    a, b = socket.socketpair(socket.AF_UNIX)
    assert peer_uid(a) == os.getuid()
    a.close()
    b.close()


def test_socket_modes(daemon):
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.socket.parent).st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_foreign_uid_is_refused(make_daemon):
    # Open the file modes so that only the SO_PEERCRED check stands between 'nobody' and us
    # (pytest's own temp root is private, so the socket lives in a folder of its own).
    run = tempfile.mkdtemp(prefix="ragd-peer-", dir="/tmp")
    try:
        with make_daemon(socket=Path(run) / "ragd" / "ragd.sock") as daemon:
            _foreign_ping(daemon)
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _foreign_ping(daemon):
    os.chmod(daemon.socket.parent.parent, 0o711)
    os.chmod(daemon.socket.parent, 0o711)
    os.chmod(daemon.socket, 0o666)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes 'nobody' and asks for a ping
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(str(daemon.socket))
            s.sendall(P.pack({"id": 1, "op": "ping"}))
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            os.write(w, data)
        except BaseException as e:
            os.write(w, f"child: {e!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    assert not data.startswith(b"child:"), data
    (n,) = P.HEADER.unpack(data[:4])
    reply = msgpack.unpackb(data[4:4 + n], raw=False)
    assert reply["error"]["code"] == P.FORBIDDEN
    assert "uid 65534" in reply["error"]["message"]
    assert daemon.call("ping")["pid"] == daemon.proc.pid


def test_run_records_name_the_running_daemons_only(tmp_path):
    """A daemon's run record (protocol.run_record): keyed by its config's real path; a stop
    removes it only while it is still its own; the records of killed daemons (a dead pid) go
    at the next daemon's start."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    cfg, other = tmp_path / "a.toml", tmp_path / "b.toml"
    cfg.write_text("")
    other.write_text("")
    (tmp_path / "link.toml").symlink_to(cfg)
    P.write_run_record(cfg, tmp_path / "a.sock", env)
    assert P.recorded_socket(tmp_path / "link.toml", env) == (tmp_path / "a.sock", os.getpid())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    P.run_record(other, env).write_text(json.dumps(
        {"config": str(other), "socket": "/nowhere.sock", "pid": dead.pid}))
    P.write_run_record(cfg, tmp_path / "a2.sock", env)  # (a start again: the dead one goes)
    assert P.recorded_socket(other, env) is None
    assert P.recorded_socket(cfg, env) == (tmp_path / "a2.sock", os.getpid())
    P.run_record(cfg, env).write_text(json.dumps(
        {"config": str(cfg), "socket": "/later.sock", "pid": 1}))  # a later daemon's
    P.drop_run_record(cfg, env)
    assert P.recorded_socket(cfg, env) == (Path("/later.sock"), 1)  # not this one's to drop
    assert P.recorded_socket(None, env) is None
