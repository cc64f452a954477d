"""How long `ragctl stop` takes, from the stop op to the daemon's exit, in three states.

    python bench/stop.py [--runs 3] [--vault dwarvesf-brain] [--removed obsidian-tasks-docs]

- idle: everything indexed and embedded (the small test vault), engines up.
- first embedding: the same vault's first start, stopped once the first vectors are in (a
  batch is in flight to the engine).
- text-index refill: BM25 only, two sources (--vault and --removed); --removed is dropped
  from the config and ragd reloaded; once the tantivy index is filling anew (the deleted
  documents of the removed source pass REFILL_SHARE), stop. Then the next start is timed
  until the text index has every chunk again (the fill is re-derived from SQLite).

Prints the median and the worst of --runs runs of each (target: within 5 s from any state).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from common import EMBED_MODEL, Daemon, copy_vault, median, quiet_config, save, write_config
from common import ready as wait_ready
from conftest import small_vault


def timed_stop(d: Daemon) -> float:
    t0 = time.monotonic()
    with d.client() as c:
        c.call("stop")
    d.proc.wait(120)
    took = time.monotonic() - t0
    d._err.close()
    return took


def daemon(tmp: Path, sources: list[dict], extra: str) -> Daemon:
    cfg = quiet_config(write_config(tmp / "config.toml", tmp / "data", tmp / "run" / "s.sock",
                                    sources, extra))
    return Daemon(cfg, tmp / "run" / "s.sock", tmp / "ragd.stderr")


def until(d: Daemon, pred, timeout: float = 600.0, every: float = 0.05) -> dict:
    deadline = time.monotonic() + timeout
    while not pred(st := d.call("status")):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting: {st.get('bm25_index')}")
        time.sleep(every)
    return st


def idle(tmp: Path) -> float:
    vault = small_vault(tmp / "vault")
    d = daemon(tmp, [{"name": "notes", "path": str(vault), "kind": "folder"}],
               f'[embedding]\nmodel = "{EMBED_MODEL}"\n')
    d.start()
    wait_ready(d, vectors=True)
    return timed_stop(d)


def first_embedding(tmp: Path) -> float:
    vault = copy_vault("obsidian-tasks-docs", tmp / "vault")
    d = daemon(tmp, [{"name": "notes", "path": str(vault), "kind": "folder"}],
               f'[embedding]\nmodel = "{EMBED_MODEL}"\n')
    d.start()
    until(d, lambda st: st["engines"]["embedding"].get("vectors", 0) >= 1)
    return timed_stop(d)


def refill(tmp: Path, vault: str, removed: str) -> tuple[float, float]:
    """(stop seconds, next start until the text index is whole again)"""
    a = copy_vault(vault, tmp / "a")
    b = copy_vault(removed, tmp / "b")
    srcs = [{"name": "a", "path": str(a), "kind": "folder"},
            {"name": "b", "path": str(b), "kind": "folder"}]
    d = daemon(tmp, srcs, '[embedding]\nmodel = ""\n')
    d.start()
    wait_ready(d, vectors=False)
    write_config(d.config, tmp / "data", d.socket, srcs[:1], '[embedding]\nmodel = ""\n')
    quiet_config(d.config)
    with d.client(timeout=120) as c:
        c.call("reload")
    until(d, lambda st: st["bm25_index"].get("state") == "filling", every=0.01)
    took = timed_stop(d)
    t0 = time.monotonic()
    d.start()
    wait_ready(d, vectors=False)
    again = time.monotonic() - t0
    d.stop(60)
    return took, again


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--vault", default="dwarvesf-brain")
    ap.add_argument("--removed", default="obsidian-tasks-docs")
    args = ap.parse_args()
    out: dict = {"runs": args.runs, "vault": args.vault, "removed": args.removed}
    for name, fn in (("idle", idle), ("first_embedding", first_embedding)):
        xs = []
        for _ in range(args.runs):
            tmp = Path(tempfile.mkdtemp(prefix="ragd-stop-"))
            try:
                xs.append(fn(tmp))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        out[name] = {"median_s": round(median(xs), 2), "max_s": round(max(xs), 2)}
        print(f"{name:<16} stop: median {median(xs):.2f} s, max {max(xs):.2f} s", flush=True)
    stops, agains = [], []
    for _ in range(args.runs):
        tmp = Path(tempfile.mkdtemp(prefix="ragd-stop-"))
        try:
            took, again = refill(tmp, args.vault, args.removed)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        stops.append(took)
        agains.append(again)
    out["refill"] = {"median_s": round(median(stops), 2), "max_s": round(max(stops), 2),
                     "next_start_whole_s": round(median(agains), 2)}
    print(f"{'text refill':<16} stop: median {median(stops):.2f} s, max {max(stops):.2f} s; "
          f"next start has the whole text index in {median(agains):.1f} s (median)")
    print(f"saved {save('stop', out)}")


if __name__ == "__main__":
    main()
