"""The MCP wire as ragd's server speaks it: protocol versions and eras, JSON-RPC error codes,
who we say we are, and the shapes of replies (errors, tool failures, the stateless era's stamp).

Both eras of the protocol are served by one process:

* the handshake era, 2024-11-05, 2025-06-18 and 2025-11-25: ``initialize`` settles a version
  for the process (the requested one if we speak it, else our newest, as those revisions
  prescribe), then requests carry no version; a 2024-11-05 client gets that revision's shapes
  (no titles, annotations, output schemas or structuredContent: the text carries it all);
* the stateless era, 2026-07-28: every request names its version and the client's capabilities
  in ``params._meta``; ``server/discover`` lists what we speak; results carry ``resultType``
  and our ``serverInfo``; a version we do not speak gets UnsupportedProtocolVersionError
  (-32022) with the versions we do.

A request with a modern ``_meta`` version is served statelessly even after an ``initialize``,
and an ``initialize`` is accepted after modern requests: the revisions allow a dual-era server
to serve both on one stream.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from ragd import protocol as P

MODERN = ("2026-07-28",)
# newest first: the counter-offer is HANDSHAKE[0]. (2025-03-26 is not spoken: it requires
# JSON-RPC batches, which no other revision has; its clients are offered 2025-11-25.)
HANDSHAKE = ("2025-11-25", "2025-06-18", "2024-11-05")
# Revisions from before tool titles, annotations, output schemas and structuredContent.
UNSTRUCTURED = ("2024-11-05",)
# Revisions that make arguments failing a tool's input schema a JSON-RPC error (-32602), not
# a tool result.
ARGS_PROTOCOL_ERROR = ("2025-06-18", "2024-11-05")
SUPPORTED = MODERN + HANDSHAKE

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

# JSON-RPC 2.0 error codes, and the one MCP code we send.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_PROTOCOL_VERSION = -32022

MAX_LINE = P.MAX_FRAME  # a longer message is refused and skipped, never read whole
LIST_TTL_MS = 3_600_000  # tools/list and server/discover never change while we run

try:
    VERSION = metadata.version("ragd")
except metadata.PackageNotFoundError:  # run from a bare checkout
    VERSION = "unknown"

SERVER_INFO = {"name": "ragd", "title": "ragd: search your notes and documents",
               "version": VERSION}
CAPABILITIES = {"tools": {"listChanged": False}}
INSTRUCTIONS = (
    "ragd searches the user's own notes and documents on this machine (Obsidian vaults and "
    "folders), kept up to date as files change. Call `search` first (keywords and meaning, "
    "fused); every hit gives a file path and a line range. Call `get` with `path:START-END` "
    "to read a hit with what surrounds it, or a whole file (a long one comes in parts: each "
    "result names the lines to ask for next). `related` finds the notes closest "
    "to a note (or a passage). `status` lists the sources (their names restrict `search`) and "
    "says whether indexing has caught up.")


class RpcError(Exception):
    """A JSON-RPC error reply: the request itself was wrong (or we are)."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class ToolError(Exception):
    """A tool call that could not be answered: an ``isError`` result the model can act on."""


# The methods each era serves.
HANDSHAKE_METHODS = {"initialize", "ping", "tools/list", "tools/call"}
MODERN_METHODS = {"server/discover", "tools/list", "tools/call"}
METHODS = HANDSHAKE_METHODS | MODERN_METHODS


def id_key(req_id: Any) -> tuple[str, Any]:
    return (type(req_id).__name__, req_id)  # 1 and "1" are different ids


def not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def clip(data: bytes, limit: int = 500) -> str:
    text = data.decode("utf-8", "replace").rstrip("\n")
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def error(req_id: Any, code: int, message: str, data: Any = None) -> dict:
    err: dict = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": req_id, "error": err}


def said_by(tool: str, message: str) -> str:
    """Every failure of a tool starts with its name, as the daemon's own errors start with
    their op's (the same names): "search: no source named 'x'", "get: ragd is not running"."""
    return message if message.startswith(f"{tool}: ") else f"{tool}: {message}"


def tool_error(tool: str, message: str) -> dict:
    return {"content": [{"type": "text", "text": said_by(tool, message)}], "isError": True}


def stamp(result: dict, era: str) -> dict:
    """A 2026-07-28 result says it is complete and who answered; older ones carry neither,
    and a 2024-11-05 tool result has no structuredContent."""
    if era in UNSTRUCTURED:
        result = {k: v for k, v in result.items() if k != "structuredContent"}
    if era in MODERN:
        result = {**result, "resultType": "complete",
                  "_meta": {**result.get("_meta", {}), META_SERVER_INFO: SERVER_INFO}}
    return result
