"""Typed, unsaved text searchable: the latency from `buffer_set` to a hybrid search that finds
the new text by its vector as well as by its words.

    python bench/buffers.py [--edits 50] [--vault obsidian-tasks-docs]

A daemon on a copy of the vault, every chunk embedded. Each edit takes a random note, appends a
paragraph with a new sentence (a fresh code word and a sentence made of random vault words, so
its chunk text is new and must be embedded), and, on one connection like an editor's:

  1. `buffer_set` (the editor pushes its text);
  2. `related` on the note: the daemon answers once the buffer's new texts are embedded (a
     bounded wait inside the daemon, no polling from here);
  3. a hybrid `search` for the sentence, checked: the note is in the results, `unsaved`, and
     its best chunk has a `vector` score (the dense side saw the typed text).

Reported: p50/p95 of (1) alone (BM25-searchable: the buffer's chunks are searchable by words as
soon as buffer_set returns), of 1-3 (searchable by hybrid, vectors included: the issue's target
is p95 <= 300 ms), and the raw engine embedding the same new chunk texts over its own HTTP
socket (what the embedding alone costs), with the ratio.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from common import (EMBED_MODEL, Daemon, copy_vault, pct, quiet_config, ready, save,
                    write_config)
from ragd.engines.client import EngineClient


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--edits", type=int, default=50)
    ap.add_argument("--vault", default="obsidian-tasks-docs")
    args = ap.parse_args()
    rng = random.Random(11)
    tmp = Path(tempfile.mkdtemp(prefix="ragd-buf-"))
    try:
        vault = copy_vault(args.vault, tmp / "vault")
        notes = sorted(p for p in vault.rglob("*.md")
                       if not any(s.startswith(".") for s in p.relative_to(vault).parts))
        words = sorted({w for p in notes[:40] for w in p.read_text(errors="replace").split()
                        if w.isalpha() and 4 <= len(w) <= 10})
        extra = f'[embedding]\nmodel = "{EMBED_MODEL}"\n[engines]\nhealth_interval = 600\n'
        cfg = write_config(tmp / "config.toml", tmp / "data", tmp / "run" / "s.sock",
                           [{"name": "v", "path": str(vault), "kind": "obsidian"}], extra)
        d = Daemon(quiet_config(cfg), tmp / "run" / "s.sock", tmp / "err.log")
        with d:
            st = ready(d, vectors=True)
            chunks = st["sources"][0]["chunks"]
            print(f"{args.vault}: {chunks} chunks, all embedded", flush=True)
            set_ms, hybrid_ms, sentences = [], [], []
            with d.client(timeout=60) as c:
                for i in range(args.edits):
                    note = rng.choice(notes)
                    code = f"zq{i}x{rng.randrange(10**6)}"
                    sentence = " ".join(rng.choice(words) for _ in range(12))
                    text = note.read_text(errors="replace") + f"\n\n{code} {sentence}.\n"
                    t0 = time.perf_counter()
                    r = c.call("buffer_set", path=str(note), text=text, version=i)
                    t1 = time.perf_counter()
                    c.call("related", path=str(note), k=3)
                    res = c.call("search", query=f"{code} {sentence}", k=10, mode="hybrid")
                    t2 = time.perf_counter()
                    hit = next((x for x in res["results"] if x["path"] == str(note)), None)
                    if hit is None or not hit.get("unsaved") or "vector" not in hit["scores"]:
                        raise SystemExit(f"edit {i}: the buffer's new text was not found by "
                                         f"hybrid search with a vector score: {hit}")
                    set_ms.append((t1 - t0) * 1e3)
                    hybrid_ms.append((t2 - t0) * 1e3)
                    sentences.append(f"{code} {sentence}.")
                    assert r.get("to_embed", 0) >= 1, r
                    c.call("buffer_drop", path=str(note))
                    time.sleep(rng.uniform(0.05, 0.2))
            # The raw engine on the same texts (a chunk's text is its heading line and the
            # paragraph; the sentence alone is a slight under-estimate of what ragd embeds).
            sock = tmp / "run" / "embedding.sock"  # the daemon's engine, idle by now
            client = EngineClient(str(sock)) if sock.exists() else None
            raw_ms = []
            if client is not None:
                for s in sentences:
                    t = time.perf_counter()
                    client.embed([s])
                    raw_ms.append((time.perf_counter() - t) * 1e3)
        out = {"edits": args.edits, "chunks": chunks,
               "buffer_set_p50_ms": round(pct(set_ms, 50), 1),
               "buffer_set_p95_ms": round(pct(set_ms, 95), 1),
               "hybrid_visible_p50_ms": round(pct(hybrid_ms, 50), 1),
               "hybrid_visible_p95_ms": round(pct(hybrid_ms, 95), 1)}
        if raw_ms:
            out["raw_embed_p50_ms"] = round(pct(raw_ms, 50), 1)
            out["ratio_p50"] = round(out["hybrid_visible_p50_ms"] / out["raw_embed_p50_ms"], 2)
        print(f"buffer_set (BM25-searchable at return): p50 {out['buffer_set_p50_ms']} ms, "
              f"p95 {out['buffer_set_p95_ms']} ms")
        print(f"buffer_set -> hybrid finds it by its vector: p50 {out['hybrid_visible_p50_ms']} "
              f"ms, p95 {out['hybrid_visible_p95_ms']} ms (target p95 <= 300 ms)")
        if raw_ms:
            print(f"raw engine, one new text: p50 {out['raw_embed_p50_ms']} ms; ratio "
                  f"{out['ratio_p50']}x")
        print(f"saved {save('buffers', out)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
