"""`ragctl models pull` against a local HTTP server standing in for the model hub (nothing on
this machine can reach the real one): streamed, resumable, sha256-verified, atomic."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import ragctl

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Hub(BaseHTTPRequestHandler):
    """/<mode>/<repo>/resolve/main/<file>: mode good | corrupt | flaky | unsigned | missing."""
    requests: list[tuple[str, str | None]] = []
    flaky_served = False

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        mode = self.path.split("/")[1]
        Hub.requests.append((self.path, self.headers.get("Range")))
        if mode == "missing":
            self.send_error(404)
            return
        body = PAYLOAD
        if mode == "corrupt":
            body = PAYLOAD[:1000] + b"X" + PAYLOAD[1001:]
        start = 0
        rng = self.headers.get("Range")
        if rng and mode != "unsigned":
            start = int(rng.split("=")[1].rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        if mode != "unsigned":
            self.send_header("X-Linked-Etag", f'"{SHA}"')
        self.end_headers()
        if mode == "flaky" and not Hub.flaky_served:
            Hub.flaky_served = True
            self.wfile.write(body[start:start + 300_000])  # then hang up mid-file
            self.wfile.flush()
            self.connection.close()
            return
        self.wfile.write(body[start:])


@pytest.fixture
def hub():
    Hub.requests, Hub.flaky_served = [], False
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def pull(d, name):
    return ragctl("--config", d.config, "--json", "models", "pull", name)


def test_pull_good_then_listed(make_daemon, hub, tmp_path):
    d = make_daemon(extra=f'[embedding]\nmodel = ""\n[models]\nhub_url = "{hub}"\n')
    with d:
        r = pull(d, "good/tiny/tiny.gguf")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        dest = tmp_path / "data" / "models" / "tiny.gguf"
        assert out["path"] == str(dest) and out["sha256"] == SHA and out["bytes"] == len(PAYLOAD)
        assert dest.read_bytes() == PAYLOAD
        assert Hub.requests == [("/good/tiny/resolve/main/tiny.gguf", None)]
        listed = json.loads(ragctl("--config", d.config, "--json", "models").stdout)
        assert any(m["name"] == "tiny" and m["installed"] for m in listed["models"])
        assert any(m["name"] == "all-MiniLM-L6-v2" for m in listed["models"])
        again = json.loads(pull(d, "good/tiny/tiny.gguf").stdout)
        assert again["already_installed"] is True and len(Hub.requests) == 1


def test_corrupt_download_is_rejected_and_nothing_is_left(make_daemon, hub, tmp_path):
    d = make_daemon(extra=f'[embedding]\nmodel = ""\n[models]\nhub_url = "{hub}"\n')
    with d:
        r = pull(d, "corrupt/tiny/tiny.gguf")
        assert r.returncode == 1
        assert "sha256 mismatch" in r.stderr and "deleted" in r.stderr
        assert list((tmp_path / "data" / "models").iterdir()) == []
        r = pull(d, "unsigned/tiny/tiny.gguf")
        assert r.returncode == 1 and "refusing an unverified file" in r.stderr
        r = pull(d, "missing/tiny/tiny.gguf")
        assert r.returncode == 1 and "HTTP 404" in r.stderr
        r = pull(d, "no-such-model")
        assert r.returncode == 1 and "unknown model 'no-such-model'" in r.stderr
        assert d.call("ping")  # the daemon lives on


def test_interrupted_download_resumes(make_daemon, hub, tmp_path):
    d = make_daemon(extra=f'[embedding]\nmodel = ""\n[models]\nhub_url = "{hub}"\n')
    with d:
        r = pull(d, "flaky/tiny/tiny.gguf")
        assert r.returncode == 1 and "resume" in r.stderr
        part = tmp_path / "data" / "models" / "tiny.gguf.part"
        kept = part.stat().st_size
        assert 200_000 < kept <= 300_000  # what arrived, less at most one 64 KiB block
        assert not (tmp_path / "data" / "models" / "tiny.gguf").exists()
        r = pull(d, "flaky/tiny/tiny.gguf")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["resumed"] is True and out["sha256"] == SHA
        assert Hub.requests[-1][1] == f"bytes={kept}-"
        assert (tmp_path / "data" / "models" / "tiny.gguf").read_bytes() == PAYLOAD
        assert not part.exists()
