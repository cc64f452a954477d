"""What the chunker makes of a vault: chunks per note and tokens per chunk.

    python bench/chunks.py [VAULT ...]     (default: dwarvesf-brain python-peps)

Tokens are counted by the real engine's tokenizer (the shared MiniLM GGUF) on what is embedded:
the contextual header and the body. Prints median and p95 per vault, the chunker's own estimate
beside the real count, and how many chunks would exceed the model's 512-token context.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from common import EMBED_MODEL, VAULTS, pct
from ragd import config
from ragd.config import DEFAULT_INCLUDE, Source
from ragd.engines.models import ResolvedModel
from ragd.engines.supervisor import Engine, EngineSettings
from ragd.ingest import chunker, loader, sources


def main() -> None:
    names = sys.argv[1:] or ["dwarvesf-brain", "python-peps"]
    cfg = config.from_dict({}, None)
    tmp = Path(tempfile.mkdtemp(prefix="ragd-chunks-"))
    m = ResolvedModel("m", EMBED_MODEL, "embedding", "mean", 512, "", "", 0.0, None)
    engine = Engine("embedding", m, EngineSettings(), tmp / "run", tmp / "logs")
    engine.start()
    assert engine.wait_ready(60)
    try:
        print(f"budget {cfg.chunk_tokens} estimated tokens, overlap {cfg.chunk_overlap}")
        for name in names:
            root = VAULTS / name
            kind = "obsidian" if (root / ".obsidian").is_dir() else "folder"
            src = Source(name, root, kind, tuple(DEFAULT_INCLUDE[kind]), ())
            per_note, real, est = [], [], []
            for seen in sources.scan(src).files.values():
                doc = loader.load(src, seen.relpath, cfg.max_file_bytes).doc
                chunks = chunker.chunk_doc(doc, cfg.chunk_tokens, cfg.chunk_overlap)
                per_note.append(len(chunks))
                for c in chunks:
                    text = chunker.embed_text(c.heading, c.body)
                    real.append(len(engine.client.tokenize(text)))
                    est.append(chunker.est_tokens(text))
            over = sum(t > 508 for t in real)
            print(f"{name}: {len(per_note)} files, {sum(per_note)} chunks")
            print(f"  chunks per file   median {statistics.median(per_note):.0f}  "
                  f"p95 {pct(per_note, 95):.0f}  max {max(per_note)}")
            print(f"  tokens per chunk  median {statistics.median(real):.0f}  p95 {pct(real, 95):.0f}  "
                  f"max {max(real)}   (estimate: median {statistics.median(est):.0f}, "
                  f"p95 {pct(est, 95):.0f})")
            print(f"  over the 512-token context: {over} ({over / len(real):.2%})")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
