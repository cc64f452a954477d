"""The model registry says what was checked: `ragctl models` marks an entry whose source was never
verified against its publisher, instead of presenting it like the others."""

from __future__ import annotations

import json
import re

import pytest

from conftest import EMBED_MODEL, RERANK_MODEL, ragctl
from ragctl.admin import models_lines
from ragd.engines import models
from ragd.engines.models import ModelSpec


def line_of(lines: list[str], name: str) -> str:
    (line,) = [ln for ln in lines if re.search(rf"\s{re.escape(name)}\s", ln)]
    return line


def test_registry_entries_name_a_source_and_pin_only_checked_hashes():
    for spec in models.REGISTRY.values():
        if spec.pypi is not None and spec.pypi.gguf:  # a GGUF shipped as is: its sha256 pinned
            assert spec.pypi.gguf.endswith(".gguf") and spec.sha256, spec.name
        elif spec.pypi is not None:
            assert re.fullmatch(r"[0-9a-f]{64}", spec.pypi.safetensors_sha256), spec.name
        else:
            assert spec.hf_repo and spec.hf_repo.count("/") == 1, spec.name
            assert spec.hf_file and spec.hf_file.endswith(".gguf"), spec.name
        if spec.sha256 is not None:
            assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256), spec.name
            assert spec.verified, f"{spec.name}: a pinned sha256 nobody checked"


def test_unverified_entries_are_shown_as_unverified(monkeypatch, tmp_path):
    monkeypatch.setitem(models.REGISTRY, "guessed-embedder", ModelSpec(
        "guessed-embedder", "embedding", 384, "mean", 512, hf_repo="someone/guessed-GGUF",
        hf_file="guessed.Q8_0.gguf"))
    folder = models.models_dir(tmp_path)
    folder.mkdir()
    (folder / "my-own.gguf").write_bytes(b"GGUF")
    res = {"dir": str(folder), "configured": {"embedding": "all-MiniLM-L6-v2", "reranker": ""},
           "models": models.list_models(tmp_path)}
    lines = models_lines(res)
    assert "UNVERIFIED" in line_of(lines, "guessed-embedder")
    assert sum("UNVERIFIED" in ln for ln in lines) == 1
    assert "[sha256 pinned]" in line_of(lines, "nomic-embed-text-v1.5")
    assert "[sha256 pinned]" in line_of(lines, "all-MiniLM-L6-v2")
    assert "[sha256 from the hub at download]" in line_of(lines, "e5-small-v2")
    own = line_of(lines, "my-own")
    assert "local file" in own and "[" not in own


def test_ragctl_models_reports_what_was_verified(make_daemon):
    d = make_daemon()
    with d:
        out = ragctl("--config", d.config, "models")
        listed = json.loads(ragctl("--config", d.config, "--json", "models").stdout)
    assert out.returncode == 0, out.stderr
    rows = {m["name"]: m for m in listed["models"]}
    for name, spec in models.REGISTRY.items():
        assert rows[name]["verified"] is spec.verified
        assert rows[name]["sha256_pinned"] is bool(spec.pypi or spec.sha256)
        line = line_of(out.stdout.splitlines(), name)
        assert ("UNVERIFIED" in line) is (not spec.verified)


def test_a_gguf_by_path_is_recognised_by_its_probe_vector_only():
    """models.recognise: the probe's first numbers must agree with a registry model's (another
    build of the same weights differs in the third decimal); another model's vector, or one of
    other dimensions, is nobody."""
    import numpy as np

    from ragd.engines.models import REGISTRY, recognise
    spec = REGISTRY["all-MiniLM-L6-v2"]
    rng = np.random.default_rng(7)
    tail = rng.normal(0, 0.05, 384 - len(spec.probe))
    same = np.concatenate([np.asarray(spec.probe) + rng.normal(0, 0.002, len(spec.probe)), tail])
    assert recognise(same) is spec
    assert recognise(rng.normal(0, 0.05, 384)) is None
    assert recognise(same[:256]) is None  # dims differ
    shuffled = np.concatenate([rng.permutation(spec.probe), tail])
    assert recognise(shuffled) is None


def test_a_model_file_that_cannot_serve_its_role_is_refused_before_an_engine_starts(tmp_path):
    """A fresh-user walk set a README as the embedding model ("switching" for good while the
    engine failed), the shared cross-encoder as the embedding model (a switch to meaningless
    vectors) and MiniLM as the generator (llama.cpp aborted at every retry, gdb's backtrace
    in status). Each is refused with what the file is; the right roles are taken."""
    text = tmp_path / "README.md"
    text.write_text("# models\n")
    (empty := tmp_path / "empty.gguf").write_bytes(b"")
    (junk := tmp_path / "junk.gguf").write_bytes(bytes(range(256)))
    for value, role, needle in (
            (text, "embedding", "is not a GGUF model file (it is a text file)"),
            (empty, "embedding", "is not a GGUF model file (it is empty)"),
            (junk, "embedding", "is not a GGUF model file (it does not begin as one does)"),
            (RERANK_MODEL, "embedding", "is a reranker (a cross-encoder: it has a "
                                        "classification head), not an embedding model"),
            (EMBED_MODEL, "generator", "is an encoder (bert): it embeds or ranks text"),
            (RERANK_MODEL, "generator", "is an encoder (bert)"),
            # (a second walk: MiniLM as the reranker put BM25's 68th result first)
            (EMBED_MODEL, "reranker", "has no classification head: it is not a reranker")):
        with pytest.raises(models.ModelError) as e:
            models.resolve(str(value), role, tmp_path)
        assert needle in str(e.value), (value, role, str(e.value))
    assert models.resolve(str(EMBED_MODEL), "embedding", tmp_path).path == EMBED_MODEL
    assert models.resolve(str(RERANK_MODEL), "reranker", tmp_path).path == RERANK_MODEL
