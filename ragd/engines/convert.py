"""Convert a Hugging Face BERT-family checkpoint (safetensors) to GGUF, without torch.

Covers sentence encoders (MiniLM, bge, e5, gte: ``BertModel``, pooling from sentence-transformers'
``1_Pooling/config.json``) and cross-encoders (``BertForSequenceClassification``), for which
``bert.pooler.dense`` becomes the ``cls`` head and ``classifier`` the ``cls.output`` head:
llama.cpp's rank pooling applies tanh(cls(x)) then cls.output. (llama.cpp's stock converter drops
the pooler, which silently ruins a cross-encoder's scores.)

    python -m ragd.engines.convert MODEL_DIR OUT.gguf [--outtype q8_0|f16|f32]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np


class ConvertError(Exception):
    """The checkpoint cannot be converted; the message says which file or tensor and why."""


_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_TOP = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
}
_KEEP_F32 = ("position_embd.weight", "token_types.weight")
SPECIALS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def gguf_name(name: str, cross_encoder: bool) -> str | None:
    """The GGUF tensor name of a HF tensor name, or None for tensors llama.cpp does not use."""
    if name.startswith("bert."):
        name = name[5:]
    base, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None  # embeddings.position_ids and other buffers
    if base in _TOP:
        return f"{_TOP[base]}.{kind}"
    m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", base)
    if m and m.group(2) in _LAYER:
        return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}.{kind}"
    if cross_encoder and base == "pooler.dense":
        return f"cls.{kind}"
    if cross_encoder and base == "classifier":
        return f"cls.output.{kind}"
    if base == "pooler.dense":
        return None  # a sentence encoder pools by mean/CLS; its pooler is unused
    raise ConvertError(f"unexpected tensor {name!r}: not a BERT checkpoint this converter knows")


def _load_json(path: Path, required: bool = True) -> dict:
    if not path.exists():
        if required:
            raise ConvertError(f"{path} is missing")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConvertError(f"cannot read {path}: {e}") from None


def _pooling(model_dir: Path, cross_encoder: bool) -> str:
    if cross_encoder:
        return "rank"
    pool = _load_json(model_dir / "1_Pooling" / "config.json", required=False)
    if pool.get("pooling_mode_cls_token"):
        return "cls"
    if pool.get("pooling_mode_mean_tokens", True):
        return "mean"
    raise ConvertError(f"{model_dir}: unsupported pooling {pool}")


def convert(model_dir: Path, out: Path, outtype: str = "q8_0", name: str | None = None) -> dict:
    """Convert model_dir to out (written atomically). Returns what was written."""
    import gguf
    from gguf.quants import quantize
    from safetensors.numpy import load_file

    model_dir = Path(model_dir)
    cfg = _load_json(model_dir / "config.json")
    arch = (cfg.get("architectures") or ["BertModel"])[0]
    if cfg.get("model_type") != "bert" or arch not in ("BertModel", "BertForSequenceClassification"):
        raise ConvertError(f"{model_dir}: model_type {cfg.get('model_type')!r} / {arch!r} is not "
                           "a BERT encoder or cross-encoder")
    cross = arch == "BertForSequenceClassification"
    pooling = _pooling(model_dir, cross)
    st = model_dir / "model.safetensors"
    if not st.exists():
        raise ConvertError(f"{st} is missing (only safetensors checkpoints are supported)")
    tensors = load_file(str(st))

    tok_cfg = _load_json(model_dir / "tokenizer_config.json", required=False)
    special = {**{k: v for k, v in tok_cfg.items() if k in SPECIALS},
               **_load_json(model_dir / "special_tokens_map.json", required=False)}
    special = {k: (v["content"] if isinstance(v, dict) else v) for k, v in special.items()}
    vocab_path = model_dir / "vocab.txt"
    if not vocab_path.exists():
        raise ConvertError(f"{vocab_path} is missing (a WordPiece vocab is needed)")
    vocab = vocab_path.read_text(encoding="utf-8").split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    ids = {t: i for i, t in enumerate(vocab)}
    control = set(special.values())
    tokens, types = [], []
    for t in vocab:  # llama.cpp's WPM vocab marks word starts with U+2581, not "##" continuations
        if t in control:
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL)
        elif t.startswith("##"):
            tokens.append(t[2:])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append("\u2581" + t)
            types.append(gguf.TokenType.NORMAL)

    def special_id(key: str, default: str) -> int:
        tok = special.get(key, default)
        if tok not in ids:
            raise ConvertError(f"{model_dir}: special token {tok!r} ({key}) is not in vocab.txt")
        return ids[tok]

    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "f16": gguf.GGMLQuantizationType.F16,
             "f32": gguf.GGMLQuantizationType.F32}.get(outtype)
    if qtype is None:
        raise ConvertError(f"unknown outtype {outtype!r} (q8_0, f16 or f32)")
    file_type = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "f32": gguf.LlamaFileType.ALL_F32}[outtype]

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "bert")
        w.add_name(name or cfg.get("_name_or_path") or model_dir.name)
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_layer_norm_eps(cfg.get("layer_norm_eps", 1e-12))
        w.add_causal_attention(False)
        w.add_file_type(file_type)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        if cross:
            labels = cfg.get("id2label") or {"0": "LABEL_0"}
            w.add_classifier_output_labels([labels[k] for k in sorted(labels, key=int)])
        else:
            w.add_pooling_type({"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS}[pooling])
        w.add_token_type_count(cfg.get("type_vocab_size", 2))
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("jina-v2-en")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_bos_token_id(special_id("cls_token", "[CLS]"))
        w.add_eos_token_id(special_id("sep_token", "[SEP]"))
        w.add_unk_token_id(special_id("unk_token", "[UNK]"))
        w.add_sep_token_id(special_id("sep_token", "[SEP]"))
        w.add_pad_token_id(special_id("pad_token", "[PAD]"))
        w.add_mask_token_id(special_id("mask_token", "[MASK]"))
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)
        w.add_add_sep_token(False)
        w.add_bool("tokenizer.ggml.normalizer.lowercase", bool(tok_cfg.get("do_lower_case", True)))

        written = 0
        for hf_name in sorted(tensors):
            gname = gguf_name(hf_name, cross)
            if gname is None:
                continue
            data = np.ascontiguousarray(tensors[hf_name], dtype=np.float32)
            if data.ndim == 2 and gname not in _KEEP_F32 and qtype != gguf.GGMLQuantizationType.F32:
                if qtype == gguf.GGMLQuantizationType.F16:
                    w.add_tensor(gname, data.astype(np.float16))
                elif data.shape[-1] % 32 == 0:
                    w.add_tensor(gname, quantize(data, qtype), raw_dtype=qtype)
                else:
                    w.add_tensor(gname, data)
            else:
                w.add_tensor(gname, data)
            written += 1
        if cross and not any(gguf_name(n, True) == "cls.weight" for n in tensors):
            raise ConvertError(f"{st}: a cross-encoder without bert.pooler.dense")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"path": str(out), "tensors": written, "pooling": pooling, "cross_encoder": cross,
            "outtype": outtype, "vocab": len(tokens)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ragd.engines.convert", description=__doc__)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--outtype", default="q8_0", choices=["q8_0", "f16", "f32"])
    args = ap.parse_args(argv)
    try:
        info = convert(args.model_dir, args.out, args.outtype)
    except ConvertError as e:
        print(f"convert: {e}")
        return 1
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
