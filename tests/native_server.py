"""A native ``llama-server`` for the tests, built from source with nothing but PyPI and Debian.

llama.cpp's server is not packaged in Debian 12, but the sdist of llama-cpp-python on PyPI vendors
llama.cpp (``vendor/llama.cpp``, with ``tools/server``). ``ensure()`` downloads that sdist with
pip (pinned version, sha256 checked against a constant), builds only the ``llama-server`` target
with cmake and the system compiler (CPU only, Release, static, no web UI, no network at build
time) and caches the binary outside the checkout:

    $RAGD_NATIVE_CACHE/llama-server-<version>-<flags>/llama-server
    (default ~/.cache/ragd-test/llama-server-<version>-<flags>/llama-server)

It is built only when missing (about 5 minutes on 2 cores), under a file lock so that two test
runs on one machine build it once, for AVX2 when this machine's CPU has it (see _isa_flags;
not -march=native, which a VM's CPU list can mislead): do not copy the cache to a machine
without it. A failed build raises NativeBuildError carrying the tail of
the build log (the log itself stays in the cache folder). ``RAGD_LLAMA_SERVER`` names an existing
binary instead (nothing is built).

    python tests/native_server.py      # build (if missing) and print the binary's path
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python on PyPI
# sha256 of llama_cpp_python-0.3.36.tar.gz as PyPI publishes it
# (https://pypi.org/simple/llama-cpp-python/, the #sha256= fragment of the sdist's link).
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",       # one self-contained binary to cache
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",           # no HTTPS: it serves a local socket (this llama.cpp has
                                     # no libcurl dependency left; LLAMA_CURL is deprecated)
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # no npm, no Hugging Face fetch
    "-DGGML_CUDA=OFF", "-DGGML_VULKAN=OFF", "-DGGML_METAL=OFF",  # CPU only
    "-DGGML_CCACHE=OFF",
]


def _isa_flags() -> list[str]:
    """The instruction sets to build for, named (not -march=native): a VM may list CPU
    features its hypervisor does not give the process. On an Intel Xeon with AMX, a native
    build died at the first embedding (SIGILL, or SIGSEGV) where the bundled engine, which
    picks its code at run time, ran. AVX2 with FMA and F16C (any x86-64 since 2013) when
    /proc/cpuinfo lists them, else ggml's generic code."""
    try:
        with open("/proc/cpuinfo") as f:
            words = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        words = set()
    flags = ["-DGGML_NATIVE=OFF"]
    if {"avx", "avx2", "fma", "f16c", "bmi2"} <= words:
        flags += ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                  "-DGGML_BMI2=ON"]
    return flags


CMAKE_FLAGS += _isa_flags()
# What ragd's command line needs of the binary (checked in its --help before it is cached).
NEEDED_FLAGS = ["--embedding", "--reranking", "--pooling", "--ubatch-size", "--parallel",
                "--no-webui", ".sock", "--jinja", "--cache-ram"]


class NativeBuildError(Exception):
    """llama-server could not be obtained; the message ends with the build log's tail."""


def cache_dir() -> Path:
    """One folder per version and build flags: changing either builds afresh."""
    base = os.environ.get("RAGD_NATIVE_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "ragd-test"
    flags = hashlib.sha256(" ".join(CMAKE_FLAGS).encode()).hexdigest()[:8]
    return root / f"llama-server-{VERSION}-{flags}"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _run(what: str, cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "ab") as f:
        f.write(f"\n$ {' '.join(cmd)}\n".encode())
        f.flush()
        try:
            proc = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=f,
                                  stderr=subprocess.STDOUT)
        except OSError as e:
            raise NativeBuildError(f"cannot run {cmd[0]} ({e}): building llama-server needs "
                                   f"cmake, make and a C++ compiler (Debian: apt install cmake "
                                   f"make g++)") from None
    if proc.returncode != 0:
        raise NativeBuildError(f"{what} failed (exit {proc.returncode}); the end of {log}:\n"
                               f"{_tail(log)}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def check_binary(binary: Path) -> None:
    """The binary runs and offers every flag ragd passes."""
    try:
        proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeBuildError(f"{binary} does not run: {e}") from None
    text = proc.stdout + proc.stderr
    missing = [f for f in NEEDED_FLAGS if f not in text]
    if proc.returncode != 0 or missing:
        raise NativeBuildError(f"{binary} --help (exit {proc.returncode}) lacks {missing}:\n"
                               f"{text[-2000:]}")


def build(dest: Path, log: Path) -> None:
    work = dest.parent / "build-tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    _run("pip download", [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                          ":all:", "--disable-pip-version-check", "-d", str(work),
                          f"llama-cpp-python=={VERSION}"], log)
    sdist = work / SDIST
    if not sdist.is_file():
        raise NativeBuildError(f"pip download left no {SDIST} in {work}; log {log}:\n"
                               f"{_tail(log)}")
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        raise NativeBuildError(f"{SDIST}: sha256 {digest} is not the pinned {SDIST_SHA256}; "
                               f"refusing to build it")
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise NativeBuildError(f"{SDIST} has no {prefix}")
        tar.extractall(work, members, filter="data")
    src = work / prefix
    out = work / "build"
    jobs = str(os.cpu_count() or 2)
    _run("cmake (configure)", ["cmake", "-S", str(src), "-B", str(out), *CMAKE_FLAGS], log)
    _run("cmake (build)", ["cmake", "--build", str(out), "--target", "llama-server",
                           "--parallel", jobs], log)
    binary = out / "bin" / "llama-server"
    if not binary.is_file():
        raise NativeBuildError(f"the build made no {binary}; log {log}:\n{_tail(log)}")
    check_binary(binary)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copy2(binary, tmp)
    os.replace(tmp, dest)  # atomic: a half-copied binary is never taken for a cached one
    with open(log, "a") as f:
        f.write(f"\nbuilt {dest} in {time.monotonic() - t0:.0f}s\n")
    shutil.rmtree(work, ignore_errors=True)


def ensure() -> Path:
    """The path of a working llama-server: $RAGD_LLAMA_SERVER, the cached build, or a new one."""
    given = os.environ.get("RAGD_LLAMA_SERVER")
    if given:
        binary = Path(given)
        check_binary(binary)
        return binary
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / "llama-server"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run building it: wait for its result
        if not dest.is_file():
            log = folder / "build.log"
            log.write_text(f"building llama-server from llama-cpp-python {VERSION}\n")
            build(dest, log)
    return dest


if __name__ == "__main__":
    t0 = time.monotonic()
    try:
        path = ensure()
    except NativeBuildError as e:
        sys.exit(str(e))
    print(f"{path} ({time.monotonic() - t0:.0f}s)")
