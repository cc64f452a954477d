"""How far `related`'s bar can be trusted: its results scored against the vault's own links.

    python bench/related_links.py --keep DIR [--vault dwarvesf-brain] [--notes 300]

A note's links are what its author holds related: of the notes `related` returns for a note, a
result is counted as linked when either note links the other (a wikilink or a Markdown link to
it), and as near when the two link a third note in common. Printed per band of similarity:
how many results fall in it and which share are linked / near, against the share of random
pairs of notes that are (the base rate). Then, for the bar `related` applies (search's
threshold less MEANING_MARGIN) and higher ones: what the top 10 of a note would hold at
partial coverage, when only a share of the notes have vectors (a random share, as while a
first index is embedded): results per note above each bar and their linked share.

The index is built once under --keep (bench/quality.py's held-out set uses the same layout:
`--keep /work/qdev` reuses DIR/heldout, and DIR/dev for obsidian-tasks-docs).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
from collections import defaultdict
from pathlib import Path

from common import EMBED_MODEL, Daemon, copy_vault, ready, write_config

WIKI = re.compile(r"\[\[([^\]|#\n]+)")
MDLINK = re.compile(r"\]\(([^)\s]+?\.md)(?:#[^)]*)?\)")
KEPT = {"dwarvesf-brain": "heldout", "obsidian-tasks-docs": "dev"}  # bench/quality.py's sets
BANDS = [0.0, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 1.01]


def links(root: Path) -> tuple[list[str], dict[str, set[str]]]:
    """The vault's notes (paths relative to root) and, for each, the notes it links to."""
    notes = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.md")
                   if not any(part.startswith(".") for part in p.relative_to(root).parts))
    by_stem: dict[str, str] = {}
    for n in notes:
        by_stem.setdefault(Path(n).stem.lower(), n)
    out: dict[str, set[str]] = {}
    for n in notes:
        text = (root / n).read_text(errors="replace")
        targets = {t.strip().split("/")[-1].lower().removesuffix(".md") for t in WIKI.findall(text)}
        targets |= {Path(t).stem.lower() for t in MDLINK.findall(text)}
        out[n] = {by_stem[t] for t in targets if t in by_stem} - {n}
    return notes, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True)
    ap.add_argument("--vault", default="dwarvesf-brain")
    ap.add_argument("--notes", type=int, default=300, help="notes asked (a random sample)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    name = KEPT.get(args.vault, args.vault)
    work = args.keep / name
    root = work / "vault"
    if not root.exists():
        copy_vault(args.vault, root)
    notes, out = links(root)
    linked = defaultdict(set)
    for a, bs in out.items():
        for b in bs:
            linked[a].add(b)
            linked[b].add(a)

    def is_linked(a, b):
        return b in linked[a]

    def is_near(a, b):
        return bool(out[a] & out[b])

    rng = random.Random(args.seed)
    asked = [n for n in notes if linked[n]]
    asked = rng.sample(asked, min(args.notes, len(asked)))
    pairs = [(rng.choice(notes), rng.choice(notes)) for _ in range(20000)]
    pairs = [(a, b) for a, b in pairs if a != b]
    base_l = sum(is_linked(a, b) for a, b in pairs) / len(pairs)
    base_n = sum(is_near(a, b) for a, b in pairs) / len(pairs)

    cfg = write_config(work / "config.toml", work / "data", work / "run" / "ragd.sock",
                       [{"name": name, "path": str(root), "kind": "obsidian"}],
                       f'[embedding]\nmodel = "{EMBED_MODEL}"\n')
    cfg.write_text(cfg.read_text().replace('log_level = "debug"', 'log_level = "info"'))
    lists: dict[str, list[tuple[str, float]]] = {}
    with Daemon(cfg, work / "run" / "ragd.sock", work / "ragd.log") as d:
        ready(d, vectors=True)
        with d.client(timeout=120) as c:
            for n in asked:
                res = c.call("related", path=str(root / n), k=100)
                lists[n] = [(Path(r["path"]).relative_to(root).as_posix(), r["score"])
                            for r in res["results"]]
    print(f"{args.vault}: {len(notes)} notes, {len(asked)} asked (each with a link); "
          f"random pairs: linked {base_l:.3f}, near {base_n:.3f}")
    print(f"{'band':>11} {'results':>8} {'linked':>7} {'near':>6} {'either':>7}")
    for lo, hi in zip(BANDS, BANDS[1:]):
        got = [(a, b) for a, lst in lists.items() for b, s in lst if lo <= s < hi]
        if not got:
            continue
        lk = sum(is_linked(a, b) for a, b in got) / len(got)
        nr = sum(is_near(a, b) for a, b in got) / len(got)
        ei = sum(is_linked(a, b) or is_near(a, b) for a, b in got) / len(got)
        print(f"{lo:.2f}-{min(hi, 1):.2f} {len(got):>8} {lk:>7.3f} {nr:>6.3f} {ei:>7.3f}")
    print("top 10 above a bar when only a share of the notes have vectors "
          "(results per note, median / their linked-or-near share):")
    bars = [0.2, 0.25, 0.3, 0.35, 0.4]
    print(f"{'coverage':>8} " + " ".join(f"{'bar ' + str(b):>14}" for b in bars))
    for cover in (0.05, 0.2, 0.5, 1.0):
        have = {n for n in notes if rng.random() < cover}
        cells = []
        for bar in bars:
            per, good, total = [], 0, 0
            for a, lst in lists.items():
                top = [(b, s) for b, s in lst if b in have and s >= bar][:10]
                per.append(len(top))
                good += sum(is_linked(a, b) or is_near(a, b) for b, _ in top)
                total += len(top)
            cells.append(f"{statistics.median(per):>4.0f} / {good / total if total else 0:.3f}")
        print(f"{cover:>8.2f} " + " ".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
