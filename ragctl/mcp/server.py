"""The MCP session on stdio: one JSON-RPC 2.0 message per line, UTF-8, read from stdin and
answered on stdout (which carries nothing else; logs go to stderr); end of stdin ends it.

The reader thread parses and answers everything but tool calls itself; each tool call runs in
a thread of its own (at most MAX_CALLS at once against ragd), so a ping or a cancellation is
read while calls wait. Which era a request belongs to, and the replies' shapes: wire.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, BinaryIO

from ragctl.mcp.daemon import Call, Daemon
from ragctl.mcp.schema import BadArguments, check
from ragctl.mcp.tools import TOOLS, Tool
from ragctl.mcp.wire import (ARGS_PROTOCOL_ERROR, CAPABILITIES, HANDSHAKE, HANDSHAKE_METHODS,
                             INSTRUCTIONS, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST,
                             LIST_TTL_MS, MAX_LINE, META_CAPABILITIES, META_VERSION,
                             METHOD_NOT_FOUND, METHODS, MODERN, MODERN_METHODS, PARSE_ERROR,
                             SERVER_INFO, SUPPORTED, UNSTRUCTURED,
                             UNSUPPORTED_PROTOCOL_VERSION, RpcError, ToolError, clip, error,
                             id_key, not_json, said_by, stamp, tool_error)

log = logging.getLogger("ragctl.mcp")

MAX_CALLS = 4  # tool calls served at once; more wait for a slot in their own threads
MAX_PENDING = 64  # tool calls in flight (served or waiting) before new ones are refused
EOF_GRACE = 10.0  # at end of input, calls in flight get this long to answer


class Server:
    def __init__(self, daemon: Daemon, out: BinaryIO):
        self.daemon = daemon
        self.out = out
        self.handshake_version: str | None = None  # set by initialize
        self._write = threading.Lock()
        self._inflight: dict[tuple, Call] = {}
        self._inflight_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CALLS)
        self._workers: list[threading.Thread] = []
        self.gone = False  # stdout is closed: the client went away

    # -- input ----------------------------------------------------------------------------------

    def serve(self, inp: BinaryIO) -> int:
        while not self.gone:
            line = inp.readline(MAX_LINE + 1)
            if not line:
                break
            if len(line) > MAX_LINE:
                self.send(error(None, INVALID_REQUEST, f"message over {MAX_LINE} bytes"))
                while line and not line.endswith(b"\n"):  # skip the rest of it
                    line = inp.readline(MAX_LINE + 1)
                continue
            if line.strip():
                self.handle(line)
        self._drain(EOF_GRACE)
        log.info("end of input: exiting")
        return 0

    def handle(self, line: bytes) -> None:
        log.debug("<- %s", clip(line))
        try:
            msg = json.loads(line, parse_constant=not_json)
        except ValueError as e:  # bad JSON (NaN and Infinity included) or bad UTF-8
            self.send(error(None, PARSE_ERROR, f"Parse error: {e}"))
            return
        if isinstance(msg, list):
            self.send(error(None, INVALID_REQUEST, "JSON-RPC batches are not part of MCP; send "
                                                    "one message per line"))
            return
        if not isinstance(msg, dict):
            self.send(error(None, INVALID_REQUEST, "a message must be a JSON object"))
            return
        has_id, req_id = "id" in msg, msg.get("id")
        if has_id and (not isinstance(req_id, (str, int)) or isinstance(req_id, bool)):
            self.send(error(None, INVALID_REQUEST, "'id' must be a string or an integer"))
            return
        method = msg.get("method")
        if method is None and ("result" in msg or "error" in msg):
            log.warning("ignoring a response from the client (this server sends no requests)")
            return
        reply_id = req_id if has_id else None
        if msg.get("jsonrpc") != "2.0":
            self.send(error(reply_id, INVALID_REQUEST, "'jsonrpc' must be \"2.0\""))
            return
        if not isinstance(method, str):
            self.send(error(reply_id, INVALID_REQUEST, "'method' must be a string"))
            return
        params = msg.get("params")
        params = {} if params is None else params
        if not has_id:
            self.notification(method, params)
            return
        if not isinstance(params, dict):
            self.send(error(req_id, INVALID_PARAMS, "'params' must be an object"))
            return
        try:
            era = self.era(method, params)
            if method == "tools/call":
                self.start_call(req_id, era, params)
                return
            result = self.dispatch(method, era, params)
        except RpcError as e:
            self.send(error(req_id, e.code, e.message, e.data))
            return
        self.send({"jsonrpc": "2.0", "id": req_id, "result": stamp(result, era)})

    def notification(self, method: str, params: Any) -> None:
        """Notifications get no reply, whatever they are."""
        if method == "notifications/initialized":
            log.debug("client initialized (%s)", self.handshake_version)
        elif method == "notifications/cancelled" and isinstance(params, dict):
            key = id_key(params.get("requestId"))
            with self._inflight_lock:
                call = self._inflight.get(key)
            if call is not None:
                log.info("request %r cancelled: %s", params.get("requestId"),
                         params.get("reason") or "no reason given")
                call.cancel()
        else:
            log.debug("notification %s ignored", method)

    # -- eras -----------------------------------------------------------------------------------

    def era(self, method: str, params: dict) -> str:
        """The protocol version a request is served under, or the RpcError refusing it."""
        if method not in METHODS:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            raise RpcError(INVALID_PARAMS, "'params._meta' must be an object")
        if method == "initialize":
            return "handshake"
        if meta is not None and META_VERSION in meta:
            version = meta[META_VERSION]
            if not isinstance(version, str):
                raise RpcError(INVALID_PARAMS, f"'_meta.{META_VERSION}' must be a string")
            if version not in MODERN:
                how = (f"; {version} is a handshake-era version: send initialize to use it"
                       if version in HANDSHAKE else "")
                raise RpcError(UNSUPPORTED_PROTOCOL_VERSION, f"Unsupported protocol "
                               f"version{how}", {"supported": list(SUPPORTED),
                                                 "requested": version})
            if not isinstance(meta.get(META_CAPABILITIES), dict):
                raise RpcError(INVALID_PARAMS, f"'_meta.{META_CAPABILITIES}' (an object) is "
                               f"required on every {version} request")
            if method not in MODERN_METHODS:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method} is not part "
                               f"of protocol {version}")
            return version
        if method == "ping":  # allowed before initialize
            return self.handshake_version or HANDSHAKE[0]
        if method in MODERN_METHODS and method not in HANDSHAKE_METHODS:
            raise RpcError(INVALID_PARAMS, f"{method} needs '_meta.{META_VERSION}' "
                           f"({', '.join(MODERN)}) and '_meta.{META_CAPABILITIES}'")
        if self.handshake_version is None:
            raise RpcError(INVALID_PARAMS, f"no protocol version: send initialize first "
                           f"({', '.join(HANDSHAKE)}), or give the version ({', '.join(MODERN)})"
                           f" in '_meta.{META_VERSION}' with the client's capabilities in "
                           f"'_meta.{META_CAPABILITIES}'")
        return self.handshake_version

    def dispatch(self, method: str, era: str, params: dict) -> dict:
        if method == "initialize":
            return self.initialize(params)
        if method == "ping":
            return {}
        if method == "server/discover":
            return {"supportedVersions": list(SUPPORTED), "capabilities": CAPABILITIES,
                    "instructions": INSTRUCTIONS, "ttlMs": LIST_TTL_MS, "cacheScope": "public"}
        if method == "tools/list":
            if params.get("cursor") is not None:
                raise RpcError(INVALID_PARAMS, "Invalid cursor: tools/list has one page")
            result: dict = {"tools": [t.listing(era not in UNSTRUCTURED)
                                      for t in TOOLS.values()]}
            if era in MODERN:
                result.update(ttlMs=LIST_TTL_MS, cacheScope="public")
            return result
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")  # pragma: no cover

    def initialize(self, params: dict) -> dict:
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            raise RpcError(INVALID_PARAMS, "initialize: 'protocolVersion' must be a string")
        for key in ("capabilities", "clientInfo"):
            if key in params and not isinstance(params[key], dict):
                raise RpcError(INVALID_PARAMS, f"initialize: '{key}' must be an object")
        # The handshake revisions: answer with the version asked for if we speak it, else with
        # our newest (the client then decides whether it can go on).
        version = asked if asked in HANDSHAKE else HANDSHAKE[0]
        client = params.get("clientInfo") or {}
        log.info("initialize from %s %s: protocol %s%s", client.get("name", "a client"),
                 client.get("version", ""), version,
                 "" if version == asked else f" (it asked for {asked})")
        self.handshake_version = version
        info = ({k: v for k, v in SERVER_INFO.items() if k != "title"}
                if version in UNSTRUCTURED else SERVER_INFO)
        return {"protocolVersion": version, "capabilities": CAPABILITIES,
                "serverInfo": info, "instructions": INSTRUCTIONS}

    # -- tool calls -----------------------------------------------------------------------------

    def start_call(self, req_id: Any, era: str, params: dict) -> None:
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call: 'name' must be a string")
        tool = TOOLS.get(name)
        if tool is None:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        args = params.get("arguments")
        args = {} if args is None else args
        if not isinstance(args, dict):
            raise RpcError(INVALID_PARAMS, "tools/call: 'arguments' must be an object")
        try:
            check(tool.input_schema, args, "arguments")
        except BadArguments as e:
            if era in ARGS_PROTOCOL_ERROR:
                raise RpcError(INVALID_PARAMS, said_by(name, str(e))) from None
            self.send({"jsonrpc": "2.0", "id": req_id,
                       "result": stamp(tool_error(name, str(e)), era)})
            return
        key, call = id_key(req_id), Call()
        with self._inflight_lock:
            if key in self._inflight:
                raise RpcError(INVALID_REQUEST, f"id {req_id!r} is already used by a request "
                                                f"in flight")
            busy = len(self._inflight) >= MAX_PENDING
            if not busy:
                self._inflight[key] = call
        if busy:
            self.send({"jsonrpc": "2.0", "id": req_id, "result": stamp(tool_error(
                name, f"{MAX_PENDING} tool calls are already in flight; try again when some "
                      f"have answered"), era)})
            return
        # The call waits for a slot in its own thread, never the reader: with every slot taken
        # (ragd slow or stopped), a ping or a cancellation was read only once a call timed out.
        worker = threading.Thread(target=self._run, args=(req_id, key, call, tool, args, era),
                                  name=f"call-{name}", daemon=True)
        self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    def _run(self, req_id, key, call: Call, tool: Tool, args: dict, era: str) -> None:
        reply = None
        try:
            with self._slots:
                if not call.cancelled:  # (cancelled while it waited: it never runs)
                    reply = self._reply(req_id, call, tool, args, era)
        finally:
            with self._inflight_lock:
                self._inflight.pop(key, None)
        if reply is None or call.cancelled:  # the client no longer waits for it
            log.debug("no reply to cancelled request %r", req_id)
            return
        self.send(reply)

    def _reply(self, req_id, call: Call, tool: Tool, args: dict, era: str) -> dict:
        try:
            try:
                structured, text = tool.run(self.daemon, call, args)
                result = {"content": [{"type": "text", "text": text}],
                          "structuredContent": structured, "isError": False}
            except ToolError as e:
                result = tool_error(tool.name, str(e))
            return {"jsonrpc": "2.0", "id": req_id, "result": stamp(result, era)}
        except Exception as e:  # a bug here: say so, keep serving
            log.exception("tool %s failed", tool.name)
            return error(req_id, INTERNAL_ERROR, f"Internal error: {type(e).__name__}: {e}")

    def _drain(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for w in self._workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if w.is_alive():
                log.warning("exiting with a tool call still waiting for ragd")
                return

    # -- output ---------------------------------------------------------------------------------

    def send(self, msg: dict) -> None:
        data = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        log.debug("-> %s", clip(data))
        with self._write:
            if self.gone:
                return
            try:
                self.out.write(data)
                self.out.flush()
            except (BrokenPipeError, ValueError):  # closed under us: the client is gone
                self.gone = True
