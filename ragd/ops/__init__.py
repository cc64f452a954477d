"""The ops a client can ask for. ``search`` on the wire is ``cmd_search`` here and ``ragctl
search`` on the command line; docs/protocol.md documents each one.

One family of ops per file, each a class holding the running parts it reads (parts.py):
status.py (ping, status, sources, wait), search.py (search, ask), related.py, buffers.py
(buffer_set, buffer_drop), admin.py (get, files, reindex, events, gc, models, models_pull,
reload, stop). Ops dispatches a request to the family's ``cmd_<op>`` after args.py has checked
its arguments.
"""

from __future__ import annotations

from typing import Any

from ragd import protocol as P
from ragd.ops.admin import AdminOps
from ragd.ops.args import ARGS, NO_SESSION, SESSION_OPS, check_args
from ragd.ops.buffers import BufferOps
from ragd.ops.parts import Parts
from ragd.ops.related import RelatedOps
from ragd.ops.results import Results
from ragd.ops.search import SearchOps
from ragd.ops.status import StatusOps
from ragd.replies import OpError


class Ops:
    def __init__(self, parts: Parts):
        self.parts = parts
        results = Results(parts)
        self.status = StatusOps(parts)
        self.search = SearchOps(parts, self.status, results)
        self.admin = AdminOps(parts)
        families = (self.status, self.search, RelatedOps(parts, results), BufferOps(parts),
                    self.admin)
        self._handlers = {}
        for family in families:
            for name in dir(family):
                if name.startswith("cmd_"):
                    op = name[4:]
                    assert op in ARGS and op not in self._handlers, op
                    self._handlers[op] = getattr(family, name)
        assert self._handlers.keys() == ARGS.keys(), ARGS.keys() - self._handlers.keys()

    def dispatch(self, op: str, args: dict, session=None) -> Any:
        handler = self._handlers.get(op)
        if handler is None:
            raise OpError(P.UNKNOWN_OP, f"unknown op {op!r}; known: {', '.join(ARGS)}")
        if self.parts.stopping.is_set() and op != "ping":
            raise OpError(P.SHUTTING_DOWN, "ragd is stopping")
        if op in SESSION_OPS:  # ops whose state belongs to the connection
            return handler(session or NO_SESSION, **check_args(op, args))
        return handler(**check_args(op, args))

    def reload_config(self) -> dict:
        """SIGHUP's reload, as the reload op's (a failure is logged and shown in status)."""
        return self.admin.reload_config()
