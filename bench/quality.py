"""Retrieval quality on every question set at once, through the real daemon: the dev set
(obsidian-tasks-docs), the held-out set (dwarvesf-brain, bench/heldout/) and SciFact.

    python bench/quality.py --keep DIR [--sets dev,heldout,scifact-train] [--extra TOML]
                            [--modes hybrid,bm25,vector] [--json] [--misses]

One daemon per set, each on its own copy of its vault (built once under --keep, its vectors
cached, so a second run only searches). Every question goes over the socket, as `ragctl eval`
asks it (the dev and held-out sets are scored by ragctl's own evaluate.run: hit@k, MRR@10 by
note, out-of-scope questions flagged); SciFact by bench/scifact.py's nDCG@10. `--extra` is TOML
appended to each config (a setting to compare against the defaults). Tune on dev and
scifact-train; the held-out set and scifact-test are reported, never tuned on.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import EMBED_MODEL, SHARED, Daemon, copy_vault, ready, save, write_config

import scifact
from ragctl import evaluate

ROOT = Path(__file__).resolve().parent
SETS = {
    "dev": ("obsidian-tasks-docs", "obsidian",
            [SHARED / "eval" / "obsidian-tasks" / "obsidian-tasks-questions.jsonl",
             SHARED / "eval" / "obsidian-tasks" / "obsidian-tasks-out-of-scope.jsonl"]),
    "heldout": ("dwarvesf-brain", "obsidian",
                [ROOT / "heldout" / "dwarves-questions.jsonl",
                 ROOT / "heldout" / "dwarves-out-of-scope.jsonl"]),
}


def daemon(work: Path, source: dict, extra: str) -> Daemon:
    cfg = write_config(work / "config.toml", work / "data", work / "run" / "ragd.sock", [source],
                       f'[embedding]\nmodel = "{EMBED_MODEL}"\n' + extra)
    cfg.write_text(cfg.read_text().replace('log_level = "debug"', 'log_level = "info"'))
    return Daemon(cfg, work / "run" / "ragd.sock", work / "ragd.log")


def vault_set(name: str, work: Path, extra: str, modes: list[str]) -> dict:
    vault, kind, files = SETS[name]
    root = work / "vault"
    if not root.exists():
        copy_vault(vault, root)
    questions = [q for f in files for q in evaluate.load(f)]
    out = {}
    with daemon(work, {"name": name, "path": str(root), "kind": kind}, extra) as d:
        ready(d, vectors=True)
        with d.client(timeout=300) as c:
            roots = {s["name"]: s["path"] for s in c.call("sources")}
            for mode in modes:
                out[mode] = evaluate.run(c, questions, mode, None, roots)
    return out


def scifact_set(split: str, work: Path, extra: str, modes: list[str]) -> dict:
    corpus = work / "corpus"
    if not corpus.exists():
        scifact.write_corpus(corpus)
    queries, qrels = scifact.load(split)
    with daemon(work, {"name": "scifact", "path": str(corpus)}, extra) as d:
        ready(d, vectors=True)
        return {mode: scifact.evaluate(d, queries, qrels, mode) for mode in modes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, help="build or reuse the indexes in this folder")
    ap.add_argument("--sets", default="dev,heldout,scifact-train")
    ap.add_argument("--modes", default="hybrid,bm25,vector")
    ap.add_argument("--extra", default="", help="TOML appended to every config")
    ap.add_argument("--label", default="")
    ap.add_argument("--misses", action="store_true", help="list the dev/held-out misses")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="ragd-quality-"))
    modes = args.modes.split(",")
    extra = args.extra.replace("\\n", "\n")
    results: dict = {}
    for name in args.sets.split(","):
        if name.startswith("scifact"):
            split = name.split("-", 1)[1] if "-" in name else "train"
            results[name] = scifact_set(split, base / "scifact", extra, modes)
        else:
            results[name] = vault_set(name, base / name, extra, modes)
    lines = []
    for name, by_mode in results.items():
        for mode, r in by_mode.items():
            if name.startswith("scifact"):
                lines.append(f"{name:<14} {mode:<7} nDCG@10 {r['ndcg@10']:.4f}  "
                             f"MRR@10 {r['mrr@10']:.4f}  R@100 {r['recall@100']:.4f}")
                continue
            o = r["overall"]
            oos = r.get("out_of_scope", {})
            lines.append(f"{name:<14} {mode:<7} hit@1 {o['hit@1']:.2f} hit@3 {o['hit@3']:.2f} "
                         f"hit@5 {o['hit@5']:.2f} MRR@10 {o['mrr@10']:.4f}  "
                         f"oos flagged {oos.get('flagged', 0)}/{oos.get('n', 0)} "
                         f"(nothing {oos.get('nothing_relevant', 0)}), "
                         f"in-scope flagged {r['in_scope_flagged']}/{r['questions']}")
            if args.misses:
                for row in r["rows"]:
                    if row.get("mrr@10", 1.0) < 1.0 or ("mrr@10" not in row
                                                        and not row["low_confidence"]):
                        lines.append(f"    {row['id']} mrr {row.get('mrr@10', '-')} "
                                     f"conf {row['confidence']} {row['question'][:70]!r} "
                                     f"top {row['top'][:3]}")
    if args.json:
        for by_mode in results.values():
            for r in by_mode.values():
                r.pop("rows", None)
        print(json.dumps(results, indent=2))
    else:
        print("\n".join(lines))
    save("quality" + (f"-{args.label}" if args.label else ""),
         {n: {m: {k: v for k, v in r.items() if k != "rows"} for m, r in bm.items()}
          for n, bm in results.items()})


if __name__ == "__main__":
    main()
