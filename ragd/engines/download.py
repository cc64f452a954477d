"""Downloading GGUF files from Hugging Face: streamed, resumable, sha256-verified, atomic.

The file grows as ``<name>.part`` beside its destination. An interrupted download resumes with
an HTTP Range request. The sha256 is checked against the registry's pinned hash, else the hash
the hub publishes for the file (``X-Linked-Etag`` on its resolve URL); with neither the file is
refused. Only a verified file is renamed into place; a corrupt one is deleted.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Callable

import requests

DEFAULT_HUB = "https://huggingface.co"
_SHA256 = re.compile(r'^(?:W/)?"?([0-9a-f]{64})"?$')


class DownloadError(Exception):
    """The download failed; nothing unverified was left in place."""


def hub_url(base: str, repo: str, filename: str, revision: str = "main") -> str:
    return f"{base.rstrip('/')}/{repo}/resolve/{revision}/{filename}"


def published_sha256(resp: requests.Response) -> str | None:
    """The sha256 the hub states for the file: X-Linked-Etag (LFS files, on the redirect), else
    an ETag that is a bare sha256."""
    for r in [*resp.history, resp]:
        for header in ("x-linked-etag", "etag"):
            m = _SHA256.match(r.headers.get(header, "").strip())
            if m:
                return m.group(1)
    return None


def download(url: str, dest: Path, sha256: str | None = None,
             progress: Callable[[int, int | None], None] | None = None,
             timeout: float = 30.0, chunk: int = 1 << 16) -> dict:
    # Small blocks: a block being read when the connection drops is lost, so at most `chunk`
    # bytes are fetched twice on resume.
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        resp = requests.get(url, headers=headers, stream=True, timeout=timeout)
    except requests.RequestException as e:
        raise DownloadError(f"cannot reach {url}: {e}") from None
    with resp:
        if resp.status_code == 416 and have:  # the part is already whole: verify it below
            total, resumed = have, True
            body = iter(())
        elif resp.status_code in (200, 206):
            resumed = resp.status_code == 206 and have > 0
            if not resumed:
                have = 0  # the server ignored the range: start again
            length = resp.headers.get("content-length")
            total = have + int(length) if length and length.isdigit() else None
            body = resp.iter_content(chunk)
        else:
            raise DownloadError(f"HTTP {resp.status_code} from {url}")
        expected = (sha256 or published_sha256(resp) or "").lower() or None
        if expected is None:
            raise DownloadError(f"no sha256 to verify {url} against (the registry pins none and "
                                f"the server published none); refusing an unverified file")
        h = hashlib.sha256()
        if have:
            with open(part, "rb") as f:
                while block := f.read(chunk):
                    h.update(block)
        done, last = have, 0.0
        try:
            with open(part, "ab" if have else "wb") as f:
                for block in body:
                    f.write(block)
                    h.update(block)
                    done += len(block)
                    now = time.monotonic()
                    if progress and now - last >= 0.2:
                        progress(done, total)
                        last = now
                f.flush()
                os.fsync(f.fileno())
        except requests.RequestException as e:
            raise DownloadError(f"download interrupted at {done} bytes ({e}); run the same "
                                f"command again to resume") from None
    if total is not None and done < total:
        raise DownloadError(f"download interrupted at {done} of {total} bytes; run the same "
                            f"command again to resume")
    digest = h.hexdigest()
    if digest != expected:
        part.unlink(missing_ok=True)
        raise DownloadError(f"sha256 mismatch for {url}: got {digest}, expected {expected}; "
                            f"the corrupt download was deleted")
    os.replace(part, dest)
    if progress:
        progress(done, total)
    return {"path": str(dest), "bytes": done, "sha256": digest, "resumed": resumed}
