"""HTTP client for a llama.cpp server listening on a Unix socket (stdlib http.client).

One keep-alive connection per thread: the indexer's embedder and search threads each talk to the
engine without sharing a connection.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading

import numpy as np


class EngineUnavailable(Exception):
    """The engine is not answering (not started, restarting, dead or hung)."""


class EngineError(Exception):
    """The engine answered with an error (the request, not the engine, is at fault)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class EngineClient:
    def __init__(self, socket_path: str, timeout: float = 120.0):
        self.socket_path = str(socket_path)
        self.timeout = timeout
        self._local = threading.local()

    def _conn(self, timeout: float) -> _UnixConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _UnixConnection(self.socket_path, timeout)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: dict | None = None,
                timeout: float | None = None):
        timeout = self.timeout if timeout is None else timeout
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (1, 2):  # a kept-alive connection the server closed: retry once, fresh
            conn = self._conn(timeout)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop()
                if attempt == 2:
                    raise EngineUnavailable(f"engine at {self.socket_path} closed the connection")
            except (FileNotFoundError, ConnectionRefusedError) as e:
                self._drop()
                raise EngineUnavailable(f"no engine at {self.socket_path}: {e}") from None
            except (TimeoutError, socket.timeout):
                self._drop()
                raise EngineUnavailable(f"engine at {self.socket_path} did not answer in "
                                        f"{timeout:.1f}s") from None
            except OSError as e:
                self._drop()
                raise EngineUnavailable(f"engine at {self.socket_path}: {e}") from None
        if resp.status == 503:
            raise EngineUnavailable("engine is loading its model")
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"error": {"message": raw[:200].decode(errors="replace")}}
        if resp.status >= 400:
            err = payload.get("error") if isinstance(payload, dict) else None
            msg = err.get("message") if isinstance(err, dict) else str(payload)[:200]
            raise EngineError(resp.status, msg or "error")
        return payload

    # -- the API -------------------------------------------------------------------------------

    def health(self, timeout: float = 2.0) -> bool:
        try:
            return self.request("GET", "/health", timeout=timeout).get("status") == "ok"
        except (EngineUnavailable, EngineError):
            return False

    def tokenize(self, text: str, timeout: float | None = None) -> list[int]:
        return self.request("POST", "/tokenize", {"content": text, "add_special": False},
                            timeout=timeout)["tokens"]

    def detokenize(self, tokens: list[int], timeout: float | None = None) -> str:
        return self.request("POST", "/detokenize", {"tokens": tokens}, timeout=timeout)["content"]

    def fit(self, text: str, limit: int, count: bool = False,
            timeout: float | None = None) -> tuple[str, int | None]:
        """The text cut to at most `limit` of this model's tokens, and its own token count.
        Without `count`, a text of at most `limit` UTF-8 bytes is returned as it is, uncounted
        (None): a token is at least a byte, so only long texts are sent to the engine."""
        if not count and len(text.encode()) <= limit:
            return text, None
        tokens = self.tokenize(text, timeout)
        if len(tokens) <= limit:
            return text, len(tokens)
        return self.detokenize(tokens[:limit], timeout), len(tokens)

    def embed(self, texts: list[str], timeout: float | None = None) -> np.ndarray:
        """L2-normalised float32 vectors, one row per text, in order."""
        out = self.request("POST", "/v1/embeddings", {"input": texts}, timeout=timeout)
        rows = sorted(out["data"], key=lambda d: d["index"])
        if len(rows) != len(texts):
            raise EngineError(500, f"asked for {len(texts)} embeddings, got {len(rows)}")
        m = np.asarray([r["embedding"] for r in rows], dtype=np.float32)
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return m / norms

    def chat_stream(self, body: dict, timeout: float | None = None):
        """POST /v1/chat/completions with stream=true and yield its events (the parsed JSON of
        each server-sent ``data:`` line) until ``[DONE]``. A dedicated connection, closed at the
        end or when the caller stops iterating (the server then stops generating). `timeout`
        bounds each read, not the whole answer. An engine that dies mid-stream (EOF before
        [DONE], a reset) raises EngineUnavailable; an error the server reports, EngineError."""
        timeout = self.timeout if timeout is None else timeout
        conn = _UnixConnection(self.socket_path, timeout)
        try:
            try:
                conn.request("POST", "/v1/chat/completions",
                             body=json.dumps({**body, "stream": True}).encode(),
                             headers={"Content-Type": "application/json",
                                      "Accept": "text/event-stream"})
                resp = conn.getresponse()
                if resp.status != 200:
                    raw = resp.read()
                    if resp.status == 503:
                        raise EngineUnavailable("engine is loading its model")
                    try:
                        err = json.loads(raw).get("error", {})
                        msg = err.get("message") if isinstance(err, dict) else str(err)
                    except (ValueError, AttributeError):
                        msg = raw[:200].decode(errors="replace")
                    raise EngineError(resp.status, msg or "error")
                while True:
                    line = resp.readline()
                    if not line:
                        raise EngineUnavailable(f"engine at {self.socket_path} ended the answer "
                                                f"before its end (it stopped or died)")
                    line = line.strip()
                    if line.startswith(b"error:"):
                        raise EngineError(500, line[6:].strip().decode(errors="replace"))
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments (": ping")
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    event = json.loads(data)
                    if isinstance(event, dict) and "error" in event:
                        err = event["error"]
                        raise EngineError(err.get("code", 500) if isinstance(err, dict) else 500,
                                          err.get("message", str(err)) if isinstance(err, dict)
                                          else str(err))
                    yield event
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise EngineUnavailable(f"no engine at {self.socket_path}: {e}") from None
            except (TimeoutError, socket.timeout):
                raise EngineUnavailable(f"engine at {self.socket_path} sent nothing for "
                                        f"{timeout:.0f}s") from None
            except (http.client.HTTPException, OSError, ValueError) as e:
                raise EngineUnavailable(f"engine at {self.socket_path} broke off the answer: "
                                        f"{type(e).__name__}: {e}") from None
        finally:
            conn.close()

    def rerank(self, query: str, documents: list[str], timeout: float | None = None) -> list[float]:
        """One relevance score per document, in the documents' order."""
        out = self.request("POST", "/v1/rerank", {"query": query, "documents": documents,
                                                  "top_n": len(documents)}, timeout=timeout)
        scores = [0.0] * len(documents)
        for r in out["results"]:
            scores[r["index"]] = float(r["relevance_score"])
        return scores
