"""``ragctl mcp``: a Model Context Protocol server on stdin/stdout that answers from ragd.

A thin bridge: each tool call is one request to the running daemon over its socket; nothing is
indexed, cached or ranked here. One room per concern:

* ``wire``: protocol versions and eras, error codes, the shapes of replies;
* ``server``: the session on stdio (framing, eras, dispatch, tool calls in their threads);
* ``tools``: each tool's schemas and the daemon op it runs; ``schema``: checking arguments;
* ``render``: the results as text; ``daemon``: one connection to ragd per call.
"""

from __future__ import annotations

import logging
import sys

from ragctl.mcp.daemon import Daemon
from ragctl.mcp.server import Server
from ragctl.mcp.wire import SUPPORTED, ToolError

log = logging.getLogger("ragctl.mcp")


def run(socket_opt: str | None, config_opt: str | None, verbose: bool = False) -> int:
    """Serve MCP on this process's stdin/stdout until end of input."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ragctl mcp: %(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout is the protocol's: a stray print must not corrupt it
    daemon = Daemon(socket_opt, config_opt)
    try:
        where = str(daemon.path())
    except ToolError as e:
        where = str(e)
    log.info("serving MCP on stdio (protocol %s); ragd socket: %s", ", ".join(SUPPORTED), where)
    try:
        return Server(daemon, out).serve(sys.stdin.buffer)
    except KeyboardInterrupt:
        return 130
