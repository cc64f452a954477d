"""Embedding throughput: the raw engine versus ragd indexing the same text.

    python bench/engine.py [--chunks 300] [--runs 3] [--model PATH]

Texts: ~345-token chunks cut from the SciFact abstracts (whole sentences, no truncation).

- raw: the bundled engine alone (the same process ragd supervises), fed exactly the texts ragd
  embeds, one request per batch of about --batch-tokens tokens, from one client thread;
- ragd: a real daemon indexing a folder with one chunk per file, timed from its start to the
  moment every chunk has a vector (engine start, file scan, BM25, tokenizing, embedding, SQLite,
  the vector matrix: all of it).

Prints tokens/s for both (median of --runs) and their ratio. Target: ragd >= 0.9 x raw.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import EMBED_MODEL, SHARED, Daemon, wait_embedded, write_config  # noqa: E402
from ragd.engines.models import ResolvedModel  # noqa: E402
from ragd.engines.supervisor import Engine, EngineSettings  # noqa: E402
from ragd.ingest.chunker import chunk_doc, embed_text  # noqa: E402
from ragd.ingest.markdown import parse  # noqa: E402


def make_texts(engine: Engine, n: int, target: int = 345) -> list[str]:
    """n paragraphs of about `target` tokens, whole sentences of SciFact abstracts."""
    out, cur = [], []
    for line in open(SHARED / "eval" / "scifact" / "corpus.jsonl", encoding="utf-8"):
        for sentence in json.loads(line)["text"].replace("\n", " ").split(". "):
            cur.append(sentence.strip().rstrip(".") + ".")
            text = " ".join(cur)
            if len(text) > target * 3.5:  # cheap pre-check before asking the tokenizer
                if len(engine.client.tokenize(text)) >= target:
                    out.append(text)
                    cur = []
                    if len(out) == n:
                        return out
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", type=Path, default=EMBED_MODEL)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ragd-bench-engine-"))
    try:
        model = ResolvedModel(args.model.stem, args.model, "embedding", "mean", 512, "", "",
                              0.0, None)
        engine = Engine("embedding", model, EngineSettings(), tmp / "raw-run", tmp / "logs")
        engine.start()
        assert engine.wait_ready(60), engine.tail_log()
        texts = make_texts(engine, args.chunks)
        # The files ragd will index: one chunk each; ragd embeds heading + text.
        folder = tmp / "docs"
        folder.mkdir()
        inputs = []
        for i, t in enumerate(texts):
            (folder / f"c{i:04d}.md").write_text(t + "\n")
            (chunk,) = chunk_doc(parse(t, f"c{i:04d}", obsidian=False), budget=10_000)
            inputs.append(embed_text(chunk.heading, chunk.body))
        counts = [len(engine.client.tokenize(x)) for x in inputs]
        total = sum(counts)
        print(f"{len(inputs)} chunks, {total} tokens (mean {total / len(inputs):.0f})", flush=True)

        def raw_run() -> float:
            t0 = time.perf_counter()
            batch, size = [], 0
            for x, n in zip(inputs, counts):
                if batch and size + n > args.batch_tokens:
                    engine.client.embed(batch)
                    batch, size = [], 0
                batch.append(x)
                size += n
            engine.client.embed(batch)
            return total / (time.perf_counter() - t0)

        def ragd_run(run: int) -> float:
            cfg = write_config(tmp / f"cfg{run}.toml", tmp / f"data{run}", tmp / f"r{run}" / "s.sock",
                               [{"name": "docs", "path": str(folder)}],
                               f'[embedding]\nmodel = "{args.model}"\nbatch_tokens = '
                               f'{args.batch_tokens}\n[index]\nchunk_tokens = 10000\n')
            cfg.write_text(cfg.read_text().replace('log_level = "debug"', 'log_level = "info"'))
            d = Daemon(cfg, tmp / f"r{run}" / "s.sock", tmp / f"d{run}.log")
            t0 = time.perf_counter()
            with d:
                st = wait_embedded(d, timeout=3600, every=0.25)
                elapsed = time.perf_counter() - t0
            e = st["engines"]["embedding"]
            assert e["embedded_texts"] == len(inputs) and e["truncated"] == 0, e
            return e["embedded_tokens"] / elapsed

        # Interleaved (raw, ragd) pairs: the machine's speed drifts between minutes, so each
        # ragd run is compared with the raw run just before it. The raw engine is stopped
        # during ragd's run (ragd starts its own) and started again after.
        raw, ours = [], []
        for run in range(args.runs):
            if run:
                engine = Engine("embedding", model, EngineSettings(), tmp / "raw-run",
                                tmp / "logs")
                engine.start()
                assert engine.wait_ready(60)
            raw.append(raw_run())
            engine.stop()
            ours.append(ragd_run(run))
        ratios = [o / r for o, r in zip(ours, raw)]
        r, o = statistics.median(raw), statistics.median(ours)
        print(f"raw engine   {r:8.0f} tokens/s   (runs: {', '.join(f'{x:.0f}' for x in raw)})")
        print(f"ragd index   {o:8.0f} tokens/s   (runs: {', '.join(f'{x:.0f}' for x in ours)})")
        print(f"ratio ragd / raw: median of pairs {statistics.median(ratios):.3f} "
              f"(pairs: {', '.join(f'{x:.3f}' for x in ratios)})")
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / "engine.json").write_text(json.dumps({"raw_tok_s": r, "ragd_tok_s": o,
                                                     "ratio": statistics.median(ratios),
                                                     "pairs": ratios, "chunks": len(inputs),
                                                     "tokens": total}, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
