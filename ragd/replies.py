"""What an op returns besides a plain result, and how it fails: the shapes of the replies the
server sends (ragd/server.py frames them, docs/protocol.md documents them). Its own module so
that the ops and the search code that builds their replies (ragd/search/ask.py) need not
import the server.
"""

from __future__ import annotations

from typing import Any, Callable


class OpError(Exception):
    """An error reply: raise it from an op with a protocol error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Stream:
    """Return this from an op to send several replies: each item of `items` is sent with
    ``"final": false`` and the stream ends with one ``"final": true`` reply carrying `last()`.
    An item None sends nothing: it asks whether the client is still there (its connection
    closed: the stream stops, as when a reply cannot be sent), for work that writes nothing
    for a while — an answer held back until it cites a note."""

    def __init__(self, items, last: Callable[[], Any]):
        self.items = items
        self.last = last


class AfterReply:
    """Return this from an op to run `then` once the reply has been sent (e.g. stop)."""

    def __init__(self, result: Any, then: Callable[[], None]):
        self.result = result
        self.then = then
