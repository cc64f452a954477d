"""The ops of an editor's unsaved buffers: while its connection holds one, search and
related see its text instead of the file's (index/buffers.py)."""

from __future__ import annotations

import os

from ragd.index.buffers import BufferError
from ragd.ops import args
from ragd.ops.parts import Parts
from ragd.replies import OpError


class BufferOps:
    def __init__(self, parts: Parts):
        self.p = parts

    def cmd_buffer_set(self, session, path: str, text: str, version: int | None) -> dict:
        """While this connection holds it, search and related see this text instead of the
        file's (see index/buffers.py)."""
        args.absolute("buffer_set", path)
        try:
            out = self.p.buffers.set(session.id, path, text, version)
        except BufferError as e:
            raise OpError(e.code, str(e)) from None
        session.on_close(lambda: self.p.buffers.drop_session(session.id))
        return out

    def cmd_buffer_drop(self, session, path: str) -> dict:
        args.absolute("buffer_drop", path)
        p = os.path.abspath(os.path.expanduser(path))
        return {"dropped": self.p.buffers.drop(session.id, p)}
