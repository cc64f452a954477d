"""`ragctl mcp`: a real server process on stdio, bridging to a real daemon over its socket.

The first tests write raw JSON-RPC lines (both eras of the protocol, every kind of bad input);
the last ones drive it with the official MCP Python SDK's stdio client, as an agent would.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import jsonschema
import pytest

from conftest import (BM25_ONLY, RERANK_MODEL, bulk_embedding_stopped, engine_config,
                      small_vault, wait_embedded)

MODERN = "2026-07-28"
PHRASE = "markdown-backed Kanban boards"
NOTE = "Other Plugins/Kanban Plugin.md"


def meta(version=MODERN, **extra) -> dict:
    return {"_meta": {"io.modelcontextprotocol/protocolVersion": version,
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "0"},
                      **extra}}


class Mcp:
    """A `ragctl mcp` process, its stdout read line by line on a thread. Every line it prints
    must be a JSON-RPC message: anything else on stdout fails the test."""

    def __init__(self, *opts, tmp: Path, verbose: bool = False):
        self.stderr_path = tmp / f"mcp-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "ragctl", *map(str, opts), "mcp",
                                      *(["--verbose"] if verbose else [])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next = 1000
        self.rest: list[dict] = []  # what came after close()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, msg) -> None:
        data = msg if isinstance(msg, bytes) else json.dumps(msg).encode() + b"\n"
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, timeout: float = 60.0) -> dict:
        line = self.lines.get(timeout=timeout)
        assert line is not None, f"stdout closed; stderr:\n{self.stderr()}"
        msg = json.loads(line)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert msg["jsonrpc"] == "2.0" and ("result" in msg) != ("error" in msg), msg
        return msg

    def nothing(self, seconds: float = 0.3) -> None:
        with pytest.raises(queue.Empty):
            self.lines.get(timeout=seconds)

    def request(self, method: str, params: dict | None = None, req_id=None) -> dict:
        if req_id is None:
            self._next += 1
            req_id = self._next
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        reply = self.recv()
        assert reply["id"] == req_id, reply
        return reply

    def result(self, method: str, params: dict | None = None) -> dict:
        reply = self.request(method, params)
        assert "result" in reply, reply
        return reply["result"]

    def error(self, method: str, params: dict | None = None) -> dict:
        reply = self.request(method, params)
        assert "error" in reply, reply
        return reply["error"]

    def call(self, tool: str, arguments: dict | None = None, modern: bool = False) -> dict:
        params: dict = {"name": tool, "arguments": arguments or {}}
        if modern:
            params.update(meta())
        return self.result("tools/call", params)

    def initialize(self, version: str = "2025-11-25") -> dict:
        res = self.result("initialize", {"protocolVersion": version, "capabilities": {},
                                         "clientInfo": {"name": "pytest", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return res

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self, timeout: float = 15.0) -> int:
        """End of input; the server must exit by itself, having printed nothing more than
        replies."""
        self.proc.stdin.close()
        rc = self.proc.wait(timeout)
        self._stderr.close()
        while (line := self.lines.get(timeout=5)) is not None:
            self.rest.append(json.loads(line))
        return rc

    def __enter__(self) -> "Mcp":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            try:
                self.close()
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()


@pytest.fixture
def vault(tmp_path) -> Path:
    return small_vault(tmp_path / "vault")


@pytest.fixture
def daemon(make_daemon, vault):
    with make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "obsidian"}]) as d:
        d.wait_idle()
        yield d


def text_of(result: dict) -> str:
    assert [c["type"] for c in result["content"]] == ["text"]
    return result["content"][0]["text"]


def tool_schemas(tools: list[dict]) -> dict:
    return {t["name"]: t for t in tools}


# ---------------------------------------------------------------------------------------------
# Raw JSON-RPC

@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_handshake_era(daemon, vault, tmp_path, version):
    with Mcp("--config", daemon.config, tmp=tmp_path) as m:
        init = m.initialize(version)
        assert init["protocolVersion"] == version
        assert init["serverInfo"]["name"] == "ragd" and init["serverInfo"]["version"]
        assert init["capabilities"] == {"tools": {"listChanged": False}}
        assert "search" in init["instructions"] and "resultType" not in init

        listing = m.result("tools/list")
        assert "resultType" not in listing and "ttlMs" not in listing
        tools = tool_schemas(listing["tools"])
        assert list(tools) == ["search", "get", "status", "related"]
        for t in tools.values():
            assert t["annotations"]["readOnlyHint"] is True
            assert t["inputSchema"]["type"] == "object" and t["outputSchema"]["type"] == "object"
            jsonschema.Draft202012Validator.check_schema(t["inputSchema"])
            jsonschema.Draft202012Validator.check_schema(t["outputSchema"])
        assert tools["search"]["inputSchema"]["required"] == ["query"]

        res = m.call("search", {"query": PHRASE, "k": 3, "mode": "bm25"})
        assert res["isError"] is False and "resultType" not in res
        jsonschema.validate(res["structuredContent"], tools["search"]["outputSchema"])
        hits = res["structuredContent"]["results"]
        top = hits[0]
        assert top["path"] == str(vault / NOTE) and top["source"] == "notes"
        assert 1 <= top["line_start"] <= top["line_end"] and top["heading"].startswith("Kanban")
        assert len(hits) == 3 and hits[0]["score"] >= hits[1]["score"]
        text = text_of(res)
        assert f"{top['path']}:{top['line_start']}-{top['line_end']}" in text
        assert top["text"] in text

        got = m.call("get", {"path": f"{top['path']}:{top['line_start']}-{top['line_end']}"})
        assert got["isError"] is False
        jsonschema.validate(got["structuredContent"], tools["get"]["outputSchema"])
        assert got["structuredContent"]["text"].strip() == top["text"]
        assert top["text"] in text_of(got)
        explicit = m.call("get", {"path": top["path"], "line_start": 1, "line_end": 3})
        assert explicit["structuredContent"]["text"] == "---\npublish: true\n---"

        st = m.call("status")
        assert st["isError"] is False
        jsonschema.validate(st["structuredContent"], tools["status"]["outputSchema"])
        src = st["structuredContent"]["sources"][0]
        assert (src["name"], src["files"], src["kind"]) == ("notes", 15, "obsidian")
        assert src["chunks"] > 15 and st["structuredContent"]["idle"] is True
        assert "15 files" in text_of(st) and "keyword (BM25) search only" in text_of(st)
        assert m.close() == 0
    assert "initialize from pytest" in m.stderr()


def test_a_2024_11_05_client_gets_that_revisions_shapes(daemon, vault, tmp_path):
    """A client that speaks only 2024-11-05 is answered in it (offered 2025-11-25, it would
    have to disconnect): tools without titles, annotations or output schemas, results as
    text alone, and arguments that fail the schema a JSON-RPC error, as that revision has."""
    with Mcp("--config", daemon.config, tmp=tmp_path) as m:
        init = m.initialize("2024-11-05")
        assert init["protocolVersion"] == "2024-11-05"
        assert init["serverInfo"] == {"name": "ragd", "version": init["serverInfo"]["version"]}
        tools = tool_schemas(m.result("tools/list")["tools"])
        assert list(tools) == ["search", "get", "status", "related"]
        for t in tools.values():
            assert set(t) == {"name", "description", "inputSchema"}, t
        res = m.call("search", {"query": PHRASE, "k": 3, "mode": "bm25"})
        assert res["isError"] is False and set(res) == {"content", "isError"}, res
        assert f"{vault / NOTE}:" in text_of(res)
        err = m.error("tools/call", {"name": "search", "arguments": {"query": PHRASE, "k": 0}})
        assert err["code"] == -32602 and err["message"].startswith("search: "), err
        bad = m.call("get", {"path": str(vault / "no such note.md")})
        assert bad["isError"] is True and set(bad) == {"content", "isError"}, bad
        assert m.close() == 0


def test_stateless_era(daemon, vault, tmp_path):
    with Mcp("--socket", daemon.socket, tmp=tmp_path) as m:
        disc = m.result("server/discover", meta())
        assert disc["resultType"] == "complete"
        assert disc["supportedVersions"] == ["2026-07-28", "2025-11-25", "2025-06-18",
                                             "2024-11-05"]
        assert disc["capabilities"] == {"tools": {"listChanged": False}}
        assert disc["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "ragd"
        assert disc["ttlMs"] > 0 and disc["cacheScope"] == "public" and disc["instructions"]

        listing = m.result("tools/list", meta())
        assert listing["resultType"] == "complete" and listing["ttlMs"] > 0
        assert [t["name"] for t in listing["tools"]] == ["search", "get", "status", "related"]
        tools = tool_schemas(listing["tools"])

        res = m.call("search", {"query": PHRASE, "k": 2}, modern=True)
        assert res["resultType"] == "complete" and res["isError"] is False
        assert res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "ragd"
        jsonschema.validate(res["structuredContent"], tools["search"]["outputSchema"])
        assert res["structuredContent"]["results"][0]["path"] == str(vault / NOTE)
        assert res["structuredContent"]["mode"] == "bm25"  # no embedding model configured
        st = m.call("status", modern=True)
        assert st["resultType"] == "complete" and st["structuredContent"]["pid"] == daemon.proc.pid

        # Every request stands alone: one without its version is refused, whatever came before.
        err = m.error("tools/list")
        assert err["code"] == -32602 and "initialize" in err["message"]
        params = meta()
        del params["_meta"]["io.modelcontextprotocol/clientCapabilities"]
        err = m.error("tools/list", params)
        assert err["code"] == -32602 and "clientCapabilities" in err["message"]
        assert m.error("ping", meta())["code"] == -32601  # removed in 2026-07-28
        assert m.error("server/discover")["code"] == -32602
        # ... and a handshake on the same stream is served too (a dual-era server may).
        assert m.initialize("2025-06-18")["protocolVersion"] == "2025-06-18"
        assert "resultType" not in m.result("tools/list")
        assert m.result("tools/list", meta())["resultType"] == "complete"
        assert m.close() == 0


def test_version_negotiation(tmp_path):
    """No daemon needed: none of this reaches it."""
    with Mcp("--socket", tmp_path / "none.sock", tmp=tmp_path) as m:
        assert m.result("ping") == {}  # allowed before initialize
        for asked in ("2099-01-01", "2025-11-25", "2025-06-18", "2024-11-05", "banana"):
            for method in ("server/discover", "tools/list"):
                err = m.error(method, meta(asked))
                assert err["code"] == -32022, (asked, err)
                assert err["message"].startswith("Unsupported protocol version")
                assert err["data"] == {"supported": ["2026-07-28", "2025-11-25", "2025-06-18",
                                                     "2024-11-05"], "requested": asked}
        assert m.error("tools/list", meta(20260728))["code"] == -32602
        assert m.error("tools/list", {"_meta": "2026-07-28"})["code"] == -32602
        err = m.error("tools/list")  # neither era
        assert err["code"] == -32602 and "initialize" in err["message"]
        # The handshake revisions: a version we do not speak is answered with our newest.
        for asked, got in (("2025-06-18", "2025-06-18"), ("2024-11-05", "2024-11-05"),
                           ("2025-03-26", "2025-11-25"), ("2026-07-28", "2025-11-25"),
                           ("1.0", "2025-11-25")):
            assert m.initialize(asked)["protocolVersion"] == got
        for bad in ({}, {"protocolVersion": 20250618},
                    {"protocolVersion": "2025-06-18", "capabilities": []}):
            assert m.error("initialize", bad)["code"] == -32602
        assert m.close() == 0


def test_tool_errors_while_ragd_is_not_running(make_daemon, vault, tmp_path):
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "obsidian"}])
    with Mcp("--config", d.config, tmp=tmp_path) as m:
        m.initialize()
        for tool, args in (("status", {}), ("search", {"query": "kanban"}),
                           ("get", {"path": str(vault / NOTE)}),
                           ("related", {"path": str(vault / NOTE)})):
            res = m.call(tool, args)
            assert res["isError"] is True and "structuredContent" not in res
            assert text_of(res) == (f"{tool}: ragd is not running (no daemon at {d.socket}). "
                                    f"Start it with 'ragctl start', then call this tool again.")
        assert m.result("tools/list")["tools"]  # the server itself goes on
        with d:  # ragd comes up: the next call finds it, without restarting the bridge
            d.wait_idle()
            res = m.call("search", {"query": PHRASE})
            assert res["isError"] is False
            assert res["structuredContent"]["results"][0]["path"] == str(vault / NOTE)
            res = m.call("related", {"path": str(vault / NOTE)})  # no embedding model here
            assert res["isError"] is True and "no embedding model is configured" in text_of(res)
        res = m.call("status")  # and goes away again
        assert res["isError"] is True and "not running" in text_of(res)
        assert m.close() == 0


def test_bad_requests_get_errors_and_the_server_goes_on(daemon, vault, tmp_path):
    with Mcp("--config", daemon.config, tmp=tmp_path) as m:
        m.initialize("2025-11-25")
        # Protocol errors: the request itself is wrong.
        cases = [
            ({"name": "nope"}, -32602, "Unknown tool: nope"),
            ({}, -32602, "tools/call: 'name' must be a string"),
            ({"name": "search", "arguments": ["query"]}, -32602,
             "tools/call: 'arguments' must be an object"),
        ]
        for params, code, message in cases:
            err = m.error("tools/call", params)
            assert (err["code"], err["message"]) == (code, message)
        assert m.error("tools/call", [1, 2])["code"] == -32602  # params not an object
        for method in ("resources/list", "prompts/list", "logging/setLevel", "nope"):
            assert m.error(method)["code"] == -32601
        assert m.error("tools/list", {"cursor": "page-2"})["code"] == -32602

        # Tool errors: the model can fix them (isError results, 2025-11-25 on).
        cases = [
            ("search", {}, "search: missing argument 'query'"),
            ("search", {"query": ""}, "search: 'query' must not be empty"),
            ("search", {"query": "x", "k": "ten"}, "search: 'k' must be integer, got string"),
            ("search", {"query": "x", "k": 0}, "search: 'k' must be at least 1, got 0"),
            ("search", {"query": "x", "k": 51}, "search: 'k' must be at most 50, got 51"),
            ("search", {"query": "x", "k": True}, "search: 'k' must be integer, got boolean"),
            ("search", {"query": "x", "k": 2.5}, "search: 'k' must be integer, got number"),
            ("search", {"query": "x", "mode": "psychic"},
             "search: 'mode' must be one of hybrid, vector, bm25, got 'psychic'"),
            ("search", {"query": "x", "sources": "notes"},
             "search: 'sources' must be array, got string"),
            ("search", {"query": "x", "sources": [1]},
             "search: 'sources'[0] must be string, got integer"),
            ("search", {"query": "x", "colour": "red"},
             "search: unknown argument(s) 'colour'; it takes query, k, mode, sources, rerank, "
             "path, tag, since, before, wait"),
            ("search", {"query": "x", "since": [2024]},
             "search: 'since' must be string or number, got array"),
            ("status", {"verbose": True}, "status: unknown argument(s) 'verbose'; it takes none"),
            ("get", {"path": str(vault / NOTE), "line_start": 0},
             "get: 'line_start' must be at least 1, got 0"),
        ]
        for tool, args, message in cases:
            res = m.call(tool, args)
            assert res["isError"] is True and text_of(res) == message, (args, res)
        # 2.0 is an integer to JSON Schema (and to an agent's JSON encoder): taken as 2
        res = m.call("search", {"query": "recurring tasks", "k": 2.0})
        assert res.get("isError") is not True, res
        assert len(res["structuredContent"]["results"]) == 2, res
        # the daemon's filters (a fresh-user walk: an agent could not narrow by tag or date)
        res = m.call("search", {"query": "custom statuses", "path": "How To/*", "k": 5})
        hits = res["structuredContent"]["results"]
        assert hits and all("/How To/" in h["path"] for h in hits), res
        res = m.call("search", {"query": "recurring tasks", "since": "bogus"})
        assert res["isError"] is True and "since" in text_of(res), res
        # ... and what only the daemon can tell, it tells.
        res = m.call("search", {"query": "x", "sources": ["nope"]})
        assert res["isError"] is True and "no source named 'nope'" in text_of(res)
        res = m.call("get", {"path": str(tmp_path / "ragd.stderr")})
        assert res["isError"] is True and "not inside a configured source" in text_of(res)
        res = m.call("get", {"path": "/etc/passwd:1-2"})
        assert res["isError"] is True and "root:" not in text_of(res)
        res = m.call("get", {"path": f"{vault / NOTE}:9999"})
        assert res["isError"] is True and "past the end" in text_of(res)

        # 2025-06-18 made invalid arguments a protocol error.
        m.initialize("2025-06-18")
        err = m.error("tools/call", {"name": "search", "arguments": {"k": 3}})
        assert (err["code"], err["message"]) == (-32602, "search: missing argument 'query'")

        # Broken messages: the reply has id null when the id could not be read.
        raw = [
            (b"{not json\n", None, -32700),
            (b"\xff\xfe\n", None, -32700),
            (b'{"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"x": NaN}}\n', None,
             -32700),
            (b"[]\n", None, -32600),
            (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]\n', None, -32600),
            (b'"ping"\n', None, -32600),
            (b'{"jsonrpc": "1.0", "id": 5, "method": "ping"}\n', 5, -32600),
            (b'{"id": 6, "method": "ping"}\n', 6, -32600),
            (b'{"jsonrpc": "2.0", "id": 7, "method": 42}\n', 7, -32600),
            (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}\n', None, -32600),
            (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}\n', None, -32600),
            (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}\n', None, -32600),
        ]
        for line, want_id, code in raw:
            m.send(line)
            reply = m.recv()
            assert (reply["id"], reply["error"]["code"]) == (want_id, code), (line, reply)
        m.send(b"\n   \n")  # blank lines are nothing
        m.send({"jsonrpc": "2.0", "id": 99, "result": {}})  # a response: we sent no request
        m.nothing()
        m.send(b'{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {"pad": "'
               + b"x" * (8 * 1024 * 1024) + b'"}}\n')
        assert m.recv()["error"]["code"] == -32600  # over the line limit, skipped
        assert m.result("ping") == {}
        res = m.call("search", {"query": PHRASE, "k": 1})
        assert res["structuredContent"]["results"][0]["path"] == str(vault / NOTE)
        assert m.close() == 0


def test_notifications_get_no_reply(tmp_path):
    with Mcp("--socket", tmp_path / "none.sock", tmp=tmp_path, verbose=True) as m:
        for msg in ({"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 12345, "reason": "changed my mind"}},
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "bad"},
                    {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
                    {"jsonrpc": "2.0", "method": "notifications/whatever", "params": [1]},
                    {"jsonrpc": "2.0", "method": "tools/list"}):  # a request without id
            m.send(msg)
        m.nothing()
        assert m.request("ping", req_id="after")["result"] == {}
        assert m.close() == 0
    log = m.stderr()  # --verbose: every message in and out, on stderr
    assert '<- {"jsonrpc": "2.0", "method": "notifications/whatever"' in log
    assert '-> {"jsonrpc":"2.0","id":"after","result":{}}' in log


def test_end_of_input_exits_after_answering(daemon, tmp_path):
    """A one-shot pipeline: every request answered (the tool calls too), then exit 0."""
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "sh", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "search", "arguments": {"query": PHRASE, "k": 1}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "status"}},
    ]
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ragctl", "--config", str(daemon.config), "mcp"],
                       input="".join(json.dumps(x) + "\n" for x in lines).encode(),
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    replies = {m["id"]: m for m in map(json.loads, r.stdout.splitlines())}
    assert set(replies) == {1, 2, 3}
    assert replies[2]["result"]["structuredContent"]["results"][0]["path"].endswith(NOTE)
    assert replies[3]["result"]["isError"] is False
    assert b"end of input" in r.stderr
    assert time.monotonic() - t0 < 30


@pytest.fixture
def silent(tmp_path):
    """A daemon that accepts and never answers (a bare listening socket: the real one cannot
    be made to hang on purpose); its socket path."""
    sock_path = tmp_path / "silent.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    sock.listen(16)
    try:
        yield sock_path
    finally:
        sock.close()


def test_a_cancelled_call_gets_no_reply(silent, tmp_path):
    """Cancelling a call to a daemon that never answers hangs up on it; no reply is sent for
    it."""
    with Mcp("--socket", silent, tmp=tmp_path) as m:
        m.initialize()
        m.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                "params": {"name": "status"}})
        m.nothing(0.5)
        m.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": "slow", "reason": "took too long"}})
        assert m.request("ping", req_id="next")["result"] == {}  # not stuck behind it
        t0 = time.monotonic()
        assert m.close() == 0
        assert time.monotonic() - t0 < 5  # nothing left in flight to wait for
        assert m.rest == []
        assert "request 'slow' cancelled: took too long" in m.stderr()


def test_calls_waiting_on_a_hung_daemon_do_not_block_the_reader(silent, tmp_path):
    """More tool calls than the server runs at once, all waiting on a daemon that never
    answers: a ping is still answered at once, and cancellations are read (the reader used to
    wait for a free slot: the ping came after 30 s, when the calls timed out)."""
    with Mcp("--socket", silent, tmp=tmp_path) as m:
        m.initialize()
        ids = [f"slow{i}" for i in range(6)]  # MAX_CALLS is 4
        for i in ids:
            m.send({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                    "params": {"name": "status"}})
        t0 = time.monotonic()
        assert m.request("ping", req_id="next")["result"] == {}
        assert time.monotonic() - t0 < 3
        for i in ids:
            m.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": i, "reason": "hung"}})
        assert m.request("ping", req_id="again")["result"] == {}
        assert m.close() == 0 and m.rest == []  # no reply to any cancelled call
        assert m.stderr().count("cancelled: hung") == len(ids)


def test_hybrid_search_with_the_real_engine(make_daemon, vault, tmp_path):
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        wait_embedded(d)
        with Mcp("--config", d.config, tmp=tmp_path) as m:
            res = m.call("search", {"query": "show my tasks on a kanban board", "k": 5},
                         modern=True)
            out = res["structuredContent"]
            assert res["isError"] is False and out["mode"] == "hybrid"
            assert out["degraded"] is False and out["results"]
            assert any(h["path"] == str(vault / NOTE) for h in out["results"])
            assert out["low_confidence"] is False and out["confidence"] > 0.25
            # words no note holds, nothing close in meaning: the agent is told so, and given
            # no notes to pad the answer with
            res = m.call("search", {"query": "xyzzyplugh qwertyuiop", "k": 2}, modern=True)
            weak = res["structuredContent"]
            assert weak["results"] == [] and weak["reason"].startswith("nothing relevant"), weak
            assert "No results for 'xyzzyplugh qwertyuiop' (nothing relevant" in text_of(res)
            st = m.call("status", modern=True)["structuredContent"]
            emb = st["engines"]["embedding"]
            assert emb["state"] == "ready" and emb["vectors"] > 0 and emb["pending_texts"] == 0
            assert "embedding engine: ready" in text_of(m.call("status", modern=True))

            # related: the notes closest to a note, itself left out; the same as the daemon's
            # related op says, checked against the tool's output schema.
            schema = tool_schemas(m.result("tools/list", meta())["tools"])["related"]
            res = m.call("related", {"path": str(vault / NOTE), "k": 4}, modern=True)
            out = res["structuredContent"]
            assert res["isError"] is False and out["of"] == str(vault / NOTE)
            jsonschema.validate(out, schema["outputSchema"])
            direct = d.call("related", path=str(vault / NOTE), k=4)
            assert [h["path"] for h in out["results"]] == [r["path"] for r in direct["results"]]
            assert 1 <= len(out["results"]) <= 4
            assert str(vault / NOTE) not in [h["path"] for h in out["results"]]
            for h in out["results"]:
                assert h["link"]["to"] == {"line_start": h["line_start"],
                                           "line_end": h["line_end"]}
            text = text_of(res)
            assert text.startswith(f"{len(out['results'])} notes related to {vault / NOTE}")
            assert out["results"][0]["path"] in text
            # a passage instead of a note: a kanban passage finds the kanban note
            res = m.call("related", {"text": "A board with columns of cards, each card a task "
                                             "in a markdown file: kanban."}, modern=True)
            assert res["isError"] is False and res["structuredContent"]["of"] is None
            assert str(vault / NOTE) in [h["path"] for h in res["structuredContent"]["results"]]
            res = m.call("related", {"path": str(vault / NOTE), "text": "x"}, modern=True)
            assert res["isError"] and "either 'path'" in text_of(res)
            res = m.call("related", {}, modern=True)
            assert res["isError"] and "either 'path'" in text_of(res)
            res = m.call("related", {"path": "/not/in/any/source.md"}, modern=True)
            assert res["isError"] and "not in any source" in text_of(res)
            assert m.close() == 0


def test_status_says_vectors_are_still_coming_while_files_are_indexed(make_daemon, vault,
                                                                       tmp_path):
    """Status' `idle` is about files: with every file indexed and vectors still being computed,
    the headline said "index up to date". The bulk engine is stopped (SIGSTOP) once the first
    vectors are in, so texts are left to embed."""
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "obsidian"}],
                    extra=engine_config())
    with d:
        d.wait_idle()
        with bulk_embedding_stopped(d):
            with Mcp("--config", d.config, tmp=tmp_path) as m:
                schema = tool_schemas(m.result("tools/list", meta())["tools"])["status"]
                res = m.call("status", modern=True)
                out = res["structuredContent"]
                jsonschema.validate(out, schema["outputSchema"])
                todo = out["engines"]["embedding"]["pending_texts"]
                assert out["idle"] is True and todo > 0, out
                head = text_of(res).splitlines()[0]
                assert "up to date" not in head, head
                assert f"vectors still being computed ({todo} texts to embed)" in head, head
                # a search says it too: an agent read keyword-only results as the whole answer
                search = tool_schemas(m.result("tools/list", meta())["tools"])["search"]
                res = m.call("search", {"query": "recurring tasks"}, modern=True)
                found = res["structuredContent"]
                jsonschema.validate(found, search["outputSchema"])
                assert 0 < found["vector_coverage"] < 1, found.get("vector_coverage")
                assert f"(vectors cover {100 * found['vector_coverage']:.0f}% of the passages" \
                    in text_of(res), text_of(res)[:300]
                assert m.close() == 0
            # before the vectors are loaded and counted, pending_texts is null (the schema
            # said integer)
            from ragctl.mcp.render import status_text
            out["engines"]["embedding"]["pending_texts"] = None
            jsonschema.validate(out, schema["outputSchema"])
            assert "vectors not counted yet" in status_text(out).splitlines()[0]


# ---------------------------------------------------------------------------------------------
# The official MCP Python SDK as the client

def sdk_session(mode: str, *opts):
    from mcp import Client, StdioServerParameters
    server = StdioServerParameters(command=sys.executable,
                                   args=["-m", "ragctl", *map(str, opts), "mcp"],
                                   env=dict(os.environ))
    return Client(server, mode=mode)


@pytest.mark.parametrize("mode,version", [("legacy", "2025-11-25"), ("auto", MODERN)])
def test_sdk_client(daemon, vault, mode, version):
    async def session():
        async with sdk_session(mode, "--config", daemon.config) as c:
            assert c.session.protocol_version == version
            tools = (await c.list_tools()).tools
            assert [t.name for t in tools] == ["search", "get", "status", "related"]
            assert all(t.annotations.read_only_hint for t in tools)

            # The SDK checks structuredContent against each tool's outputSchema.
            res = await c.call_tool("search", {"query": PHRASE, "k": 3})
            assert not res.is_error
            top = res.structured_content["results"][0]
            assert top["path"] == str(vault / NOTE)
            assert PHRASE in top["text"] and top["path"] in res.content[0].text

            res = await c.call_tool("get", {"path": f"{top['path']}:{top['line_start']}"
                                                    f"-{top['line_end']}"})
            assert not res.is_error and res.structured_content["text"].strip() == top["text"]

            res = await c.call_tool("status", {})
            assert not res.is_error
            assert res.structured_content["sources"][0]["files"] == 15

            res = await c.call_tool("search", {"query": "x", "mode": "psychic"})
            assert res.is_error and "'mode' must be one of" in res.content[0].text

    anyio.run(session)


def test_sdk_client_when_ragd_is_not_running(tmp_path):
    async def session():
        async with sdk_session("auto", "--socket", tmp_path / "none.sock") as c:
            res = await c.call_tool("status", {})
            assert res.is_error and "ragd is not running" in res.content[0].text
            res = await c.call_tool("search", {"query": "anything"})
            assert res.is_error and "ragd is not running" in res.content[0].text

    anyio.run(session)


def test_search_text_says_why_a_reply_is_weak_and_when_a_file_is_gone(tmp_path):
    """The tool's text for people and models: a low confidence with most words found is
    below the similarity threshold (no note close in meaning), not "few words"; a stale hit
    whose file is not on disk says so, not "changed"."""
    from ragctl.mcp.render import search_text

    here = tmp_path / "a.md"
    here.write_text("x\n")
    hit = {"path": str(here), "source": "n", "line_start": 1, "line_end": 1, "heading": "A",
           "score": 0.5, "text": "x", "stale": True}
    out = {"query": "what is the capital of france", "mode": "hybrid", "degraded": False,
           "reason": None, "confidence": 0.55, "low_confidence": True,
           "results": [hit, {**hit, "path": str(tmp_path / "gone.md")}]}
    text = search_text(out)
    assert "low confidence 0.55" in text and "no note is close in meaning" in text
    assert "few of" not in text
    assert text.count("(file changed since indexed") == 1
    assert text.count("(file gone from disk since indexed)") == 1
    out.update(confidence=0.1)
    assert "few of the query's distinctive words" in search_text(out)


# ---------------------------------------------------------------------------------------------
# What each tool tells an agent

def test_search_hits_carry_the_title_and_the_matching_lines(daemon, vault, tmp_path):
    """Each hit has its note's title and the lines that hold the query's words (the daemon's
    match_lines), with their text as in the file; the readable text shows both."""
    direct = daemon.call("search", query=PHRASE, k=3, mode="bm25")["results"]
    with Mcp("--config", daemon.config, tmp=tmp_path) as m:
        schema = tool_schemas(m.result("tools/list", meta())["tools"])["search"]
        res = m.call("search", {"query": PHRASE, "k": 3, "mode": "bm25"}, modern=True)
        out = res["structuredContent"]
        jsonschema.validate(out, schema["outputSchema"])
        text = text_of(res)
        assert m.close() == 0
    assert [h["path"] for h in out["results"]] == [r["path"] for r in direct]
    assert direct[0]["match_lines"], direct[0]
    for h, r in zip(out["results"], direct):
        assert h["title"] == r["title"] and h["match_lines"] == r["match_lines"]
        lines = Path(h["path"]).read_text(encoding="utf-8").split("\n")
        assert h["matches"] == [{"line": n, "text": lines[n - 1]} for n in r["match_lines"]]
        assert all(PHRASE.split()[1].lower() in x["text"].lower() or "kanban" in
                   x["text"].lower() or "board" in x["text"].lower() for x in h["matches"])
    top = out["results"][0]
    assert top["title"] == "Kanban Plugin"
    block = text.split(f"[1] {top['path']}:")[1].split("\n[2] ")[0]
    assert block.splitlines()[1] == "matching lines:"
    for x in top["matches"]:
        assert f"  {x['line']}: {x['text'].strip()}" in block


def test_a_hit_from_an_editors_unsaved_text_says_so(daemon, vault, tmp_path):
    """An editor's unsaved buffer stands in for its file in every client's search: an agent
    got its lines unmarked, and `get` of that range read other lines of the saved file (or
    none past its end). The hit says `unsaved`, and its text tells the agent."""
    note = vault / "Other Plugins" / "Kanban Plugin.md"
    saved = note.read_text(encoding="utf-8")
    with daemon.client() as editor:
        editor.call("buffer_set", path=str(note),
                    text="\n" * 40 + saved + "\nflumbersnatch is here\n")
        with Mcp("--config", daemon.config, tmp=tmp_path) as m:
            schema = tool_schemas(m.result("tools/list", meta())["tools"])["search"]
            res = m.call("search", {"query": "flumbersnatch", "mode": "bm25"}, modern=True)
            assert m.close() == 0
    out = res["structuredContent"]
    jsonschema.validate(out, schema["outputSchema"])
    hit = out["results"][0]
    assert hit["path"] == str(note) and hit["unsaved"] is True, out
    assert "(unsaved text in an editor, not on disk: get reads the saved file" in \
        text_of(res), text_of(res)


def test_rerank_wanted_without_a_reranker_is_said(daemon, tmp_path):
    """rerank: true on a daemon with no reranker was silently ignored: the result says it was
    not reranked and why (the daemon's rerank_reason), in its text too."""
    with Mcp("--config", daemon.config, tmp=tmp_path) as m:
        m.initialize()
        res = m.call("search", {"query": PHRASE, "k": 3, "rerank": True})
        out = res["structuredContent"]
        assert res["isError"] is False and out["results"]
        assert out["reranked"] is False
        assert out["rerank_reason"] == "no reranker is configured"
        assert text_of(res).splitlines()[0] == "(not reranked: no reranker is configured)"
        res = m.call("search", {"query": PHRASE, "k": 3})  # not asked for: nothing to say
        assert "rerank_reason" not in res["structuredContent"]
        assert "reranked" not in text_of(res)
        assert m.close() == 0


def test_rerank_with_the_real_reranker(make_daemon, vault, tmp_path):
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "obsidian"}],
                    extra=BM25_ONLY + f'[reranker]\nmodel = "{RERANK_MODEL}"\n'
                                      f'budget_ms = 120000\n')  # (the machine may be busy)
    with d:
        d.wait_idle()
        deadline = time.monotonic() + 60
        while d.call("status")["engines"]["reranker"]["state"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with Mcp("--config", d.config, tmp=tmp_path) as m:
            res = m.call("search", {"query": PHRASE, "k": 3, "rerank": True}, modern=True)
            out = res["structuredContent"]
            assert res["isError"] is False and out["results"]
            assert out["reranked"] is True and "rerank_reason" not in out
            assert "not reranked" not in text_of(res)
            assert m.close() == 0


def test_get_caps_a_long_file_and_says_which_lines_to_ask_for(daemon, vault, tmp_path):
    """get with no range returned a whole 76k-character file. A reply holds at most
    GET_MAX_CHARS characters of whole lines; the rest is named as a range to ask for, and
    asking for it, range after range, gives back the whole file."""
    from ragctl.mcp.tools import GET_MAX_CHARS

    big = vault / "Big.md"
    lines = [f"line {i}: " + "lorem ipsum dolor sit amet " * 3 for i in range(1, 2501)]
    big.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert len(big.read_text()) > 3 * GET_MAX_CHARS
    wide = vault / "Wide.md"
    wide.write_text("w" * (GET_MAX_CHARS + 5000) + "\nsecond line\n", encoding="utf-8")
    with Mcp("--config", daemon.config, tmp=tmp_path) as m:
        assert "a long one comes in parts" in m.initialize()["instructions"]
        schema = tool_schemas(m.result("tools/list")["tools"])["get"]
        assert f"at most {GET_MAX_CHARS:,} characters a call" in schema["description"]
        res = m.call("get", {"path": str(big)})
        out = res["structuredContent"]
        jsonschema.validate(out, schema["outputSchema"])
        n = out["line_end"]
        assert out["truncated"] is True and 1 < n < 2500 and out["lines_total"] == 2500
        assert len(out["text"]) <= GET_MAX_CHARS and out["text"] == "\n".join(lines[:n])
        assert len("\n".join(lines[:n + 1])) > GET_MAX_CHARS  # as many whole lines as fit
        assert out["rest"] == {"line_start": n + 1, "line_end": 2500}
        note = (f"[Truncated: lines 1-{n} sent; ask for lines {n + 1}-2500 (path "
                f"'{big}:{n + 1}-2500') for the rest, or a part of them.]")
        text = text_of(res)
        assert text.splitlines()[1] == note and text.endswith("\n\n" + note)
        got = [out["text"]]
        while "rest" in out:  # as an agent follows the note
            rest = out["rest"]
            out = m.call("get", {"path": f"{big}:{rest['line_start']}-{rest['line_end']}"}
                         )["structuredContent"]
            assert out["line_start"] == rest["line_start"] and len(out["text"]) <= GET_MAX_CHARS
            got.append(out["text"])
        assert "\n".join(got) == "\n".join(lines) and len(got) >= 4
        # a range that fits: as asked, and nothing said
        res = m.call("get", {"path": str(big), "line_start": 10, "line_end": 12})
        assert res["structuredContent"]["truncated"] is False
        assert "rest" not in res["structuredContent"] and "Truncated" not in text_of(res)
        assert res["structuredContent"]["text"] == "\n".join(lines[9:12])
        # one line longer than a reply: its start, said, then the next line
        res = m.call("get", {"path": str(wide)})
        out = res["structuredContent"]
        assert out["line_cut"] is True and out["truncated"] is True and out["line_end"] == 1
        assert out["text"] == "w" * GET_MAX_CHARS and out["rest"] == {"line_start": 2,
                                                                       "line_end": 2}
        assert f"line 1 is longer than {GET_MAX_CHARS:,} characters" in text_of(res)
        assert m.call("get", {"path": f"{wide}:2"})["structuredContent"]["text"] == "second line"
        assert m.close() == 0


def test_every_tool_error_starts_with_the_tools_name(daemon, vault, tmp_path):
    """One prefix style for every failure a tool reports, as the daemon's errors start with
    their op: "<tool>: …". (The bridge's own said nothing of the tool: "give either 'path'…",
    "ragd is not running …".)"""
    with Mcp("--config", daemon.config, tmp=tmp_path) as m:
        m.initialize()
        cases = [("search", {"query": "x", "sources": ["nope"]}, "no source named 'nope'"),
                 ("search", {"query": "x", "k": 0}, "'k' must be at least 1, got 0"),
                 ("get", {"path": "/etc/passwd"}, "not inside a configured source"),
                 ("get", {"path": f"{vault / NOTE}:9999"}, "past the end"),
                 ("get", {"path": f"{vault / NOTE}:5-9", "line_start": 1},
                  "the path ends in a range (:5-9) and line_start or line_end is given too"),
                 ("related", {}, "give either 'path' (a note) or 'text' (a passage)"),
                 ("related", {"path": str(vault / NOTE)}, "no embedding model is configured"),
                 ("status", {"x": 1}, "unknown argument(s) 'x'")]
        for tool, args, said in cases:
            res = m.call(tool, args)
            text = text_of(res)
            assert res["isError"] is True and said in text, (tool, args, text)
            assert text.startswith(f"{tool}: ") and not text.startswith(f"{tool}: {tool}:"), \
                text
        assert m.close() == 0
