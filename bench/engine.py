"""Embedding throughput: the bundled engine, the native llama-server, and ragd indexing the same
text.

    python bench/engine.py [--chunks 300] [--runs 3] [--model PATH]
                           [--native PATH | --no-native] [--ragd-engine bundled|native]

Texts: ~345-token chunks cut from the SciFact abstracts (whole sentences, no truncation).

- bundled: the bundled engine alone (the same process ragd supervises), fed exactly the texts
  ragd embeds, one request per batch of about --batch-tokens tokens, from one client thread;
- native: the same with the native llama-server, started by ragd's supervisor with the command
  line ragd gives it (by default the one tests/native_server.py builds and caches; built first
  if missing, about 10 minutes on 2 cores);
- ragd: a real daemon indexing a folder with one chunk per file, timed from its start to the
  moment every chunk has a vector (engine start, file scan, BM25, tokenizing, embedding, SQLite,
  the vector matrix: all of it), with --ragd-engine.

Each run does the three one after the other (the two raw engines in alternating order), one
engine alive at a time; the runs are interleaved so that the machine's drift hits all three
alike. Prints tokens/s (median of the
runs) and the ratios native / bundled and ragd / raw engine (median of the per-run ratios).
Target: ragd >= 0.9 x raw.
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


def raw_run(engine: Engine, inputs: list[str], counts: list[int], batch_tokens: int) -> float:
    """Tokens/s of one pass over the inputs, in batches of about batch_tokens tokens."""
    t0 = time.perf_counter()
    batch, size = [], 0
    for x, n in zip(inputs, counts):
        if batch and size + n > batch_tokens:
            engine.client.embed(batch)
            batch, size = [], 0
        batch.append(x)
        size += n
    engine.client.embed(batch)
    return sum(counts) / (time.perf_counter() - t0)


def fmt(xs: list[float], digits: int = 0) -> str:
    return ", ".join(f"{x:.{digits}f}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", type=Path, default=EMBED_MODEL)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--native", type=Path, default=None,
                    help="a llama-server binary (default: the tests' cached build)")
    ap.add_argument("--no-native", action="store_true", help="skip the native engine")
    ap.add_argument("--ragd-engine", choices=["bundled", "native"], default="bundled")
    args = ap.parse_args()

    native = None
    run_native = not args.no_native or args.ragd_engine == "native"
    if run_native:
        if args.native is None:
            import native_server
            print("native llama-server: the tests' build (building it first if missing)",
                  flush=True)
            args.native = native_server.ensure()
        native = args.native.resolve()

    tmp = Path(tempfile.mkdtemp(prefix="ragd-bench-engine-"))
    try:
        model = ResolvedModel(args.model.stem, args.model, "embedding", "mean", 512, "", "",
                              0.0, None)

        def start(binary: Path | None) -> Engine:
            engine = Engine("embedding", model, EngineSettings(llama_server=str(binary or "")),
                            tmp / "raw-run", tmp / "logs")
            engine.start()
            assert engine.wait_ready(120), engine.tail_log()
            return engine

        engine = start(None)
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
        engine.stop()
        print(f"{len(inputs)} chunks, {total} tokens (mean {total / len(inputs):.0f})", flush=True)

        def raw(binary: Path | None) -> float:
            engine = start(binary)
            try:
                return raw_run(engine, inputs, counts, args.batch_tokens)
            finally:
                engine.stop()

        def ragd_run(run: int) -> float:
            engines = (f'[engines]\nllama_server = "{native}"\n'
                       if args.ragd_engine == "native" else "")
            cfg = write_config(tmp / f"cfg{run}.toml", tmp / f"data{run}", tmp / f"r{run}" / "s.sock",
                               [{"name": "docs", "path": str(folder)}],
                               f'[embedding]\nmodel = "{args.model}"\nbatch_tokens = '
                               f'{args.batch_tokens}\n[index]\nchunk_tokens = 10000\n{engines}')
            cfg.write_text(cfg.read_text().replace('log_level = "debug"', 'log_level = "info"'))
            d = Daemon(cfg, tmp / f"r{run}" / "s.sock", tmp / f"d{run}.log")
            t0 = time.perf_counter()
            with d:
                st = wait_embedded(d, timeout=3600)
                elapsed = time.perf_counter() - t0
            e = st["engines"]["embedding"]
            assert e["embedded_texts"] == len(inputs) and e["truncated"] == 0, e
            return e["embedded_tokens"] / elapsed

        # Interleaved runs: the machine's speed drifts between minutes, so each run's numbers
        # are compared with each other, never with another run's.
        bundled, nat, ours = [], [], []
        for run in range(args.runs):
            # Alternate which raw engine goes first, so neither always gets the cooler machine.
            if run_native and run % 2:
                nat.append(raw(native))
            bundled.append(raw(None))
            if run_native and not run % 2:
                nat.append(raw(native))
            ours.append(ragd_run(run))
            print(f"run {run + 1}: bundled {bundled[-1]:.0f}, "
                  + (f"native {nat[-1]:.0f}, " if nat else "") + f"ragd {ours[-1]:.0f} tokens/s",
                  flush=True)
        raw_ref = nat if args.ragd_engine == "native" else bundled
        ragd_ratios = [o / r for o, r in zip(ours, raw_ref)]
        b, o = statistics.median(bundled), statistics.median(ours)
        print(f"bundled engine {b:8.0f} tokens/s   (runs: {fmt(bundled)})")
        result = {"chunks": len(inputs), "tokens": total, "runs": args.runs,
                  "bundled_tok_s": b, "bundled_runs": bundled}
        if nat:
            n = statistics.median(nat)
            native_ratios = [x / y for x, y in zip(nat, bundled)]
            print(f"native engine  {n:8.0f} tokens/s   (runs: {fmt(nat)})   {native}")
            print(f"ratio native / bundled: median of runs {statistics.median(native_ratios):.3f} "
                  f"(runs: {fmt(native_ratios, 3)})")
            result.update(native_tok_s=n, native_runs=nat, native=str(native),
                          native_over_bundled=statistics.median(native_ratios),
                          native_over_bundled_runs=native_ratios)
        print(f"ragd index     {o:8.0f} tokens/s   (runs: {fmt(ours)}; {args.ragd_engine} engine)")
        print(f"ratio ragd / raw {args.ragd_engine}: median of runs "
              f"{statistics.median(ragd_ratios):.3f} (runs: {fmt(ragd_ratios, 3)})")
        result.update(ragd_engine=args.ragd_engine, ragd_tok_s=o, ragd_runs=ours,
                      ragd_over_raw=statistics.median(ragd_ratios), ragd_over_raw_runs=ragd_ratios)
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / "engine.json").write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
