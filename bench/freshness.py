"""Freshness on a real vault: edit -> searchable latency, and a restart with nothing changed.

    python bench/freshness.py [--vault obsidian-hub] [--edits 50] [--model PATH|""]

- 50 edits to random notes of a copy of the vault while the daemon runs: each appends a line
  with a new word; the latency is from the write to the return of a search that waits in the
  daemon until pending changes are in (search --wait) and finds the note. Prints p50 and p95 (target p95 <= 1 s; the watcher's quiet window,
  250 ms, is part of it).
- restart with nothing changed: time from starting ragd to an idle index, and how many files
  were read again and texts embedded (target <= 3 s, 0 and 0).

Default --model "": BM25 only (embedding all of obsidian-hub takes over an hour on two cores).
With a model, edits are searched in hybrid mode and the restart counts embeddings too.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from common import Daemon, copy_vault, pct, quiet_config, write_config
from common import ready as wait_ready


def ready(d: Daemon, embeddings: bool, t0: float) -> tuple[float, dict]:
    st = wait_ready(d, vectors=embeddings)
    return time.perf_counter() - t0, st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vault", default="obsidian-hub")
    ap.add_argument("--edits", type=int, default=50)
    ap.add_argument("--model", default="")
    args = ap.parse_args()
    embeddings = bool(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="ragd-fresh-"))
    rng = random.Random(7)
    try:
        vault = copy_vault(args.vault, tmp / "vault")
        notes = sorted(p for p in vault.rglob("*.md")
                       if not any(s.startswith(".") for s in p.relative_to(vault).parts))
        cfg = write_config(tmp / "config.toml", tmp / "data", tmp / "run" / "ragd.sock",
                           [{"name": "v", "path": str(vault), "kind": "obsidian"}],
                           f'[embedding]\nmodel = "{args.model}"\n')
        quiet_config(cfg)
        d = Daemon(cfg, tmp / "run" / "ragd.sock", tmp / "ragd.log")
        t0 = time.perf_counter()
        with d:
            first, st = ready(d, embeddings, t0)
            print(f"{args.vault}: {st['sources'][0]['files']} files indexed in {first:.1f}s "
                  f"({'with' if embeddings else 'without'} embeddings)", flush=True)
            mode = "hybrid" if embeddings else "bm25"
            lat = []
            with d.client() as c:
                for i in range(args.edits):
                    note = rng.choice(notes)
                    word = f"fresh{i}q{rng.randrange(10**6)}"
                    with open(note, "a", encoding="utf-8") as f:
                        f.write(f"\nAn edit mentions {word}.\n")
                    t = time.perf_counter()
                    # found = the edited note is among the results (in hybrid mode the
                    # vector side answers any query, so "some result" would prove nothing).
                    # The search waits inside the daemon until the edit is in (search
                    # --wait): one request, no polling of the daemon being measured.
                    while not any(r["path"] == str(note) and word in r["text"] for r in
                                  c.call("search", query=word, k=5, mode=mode,
                                         wait=30)["results"]):
                        if time.perf_counter() - t > 30:
                            raise SystemExit(f"edit {i} not searchable after 30 s")
                    lat.append(time.perf_counter() - t)
                    time.sleep(rng.uniform(0.05, 0.3))
            print(f"edit -> searchable ({args.edits} edits): p50 {pct(lat, 50) * 1e3:.0f} ms, "
                  f"p95 {pct(lat, 95) * 1e3:.0f} ms, max {max(lat) * 1e3:.0f} ms", flush=True)
            ready(d, embeddings, time.perf_counter())
        t0 = time.perf_counter()
        with d:
            took, st = ready(d, embeddings, t0)
            read = st["totals"]["files_indexed"] + st["totals"]["files_unchanged"]
            emb = st["engines"].get("embedding", {}).get("embedded_texts", 0)
        print(f"restart, nothing changed: ready (idle) in {took:.2f}s, {read} files read again, "
              f"{emb} texts embedded")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
