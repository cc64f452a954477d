"""What one [search] setting costs in hybrid search latency: hybrid p50 with the defaults and
with the setting, interleaved, on an index built before, against the raw engine embedding the
same queries.

    python bench/search_ab.py --keep DIR [--setting 'feedback_chunks = 0'] [--queries 200]
                              [--rounds 5] [--json]

DIR holds a config.toml and its indexed data (bench/scifact.py --keep DIR, SciFact: 9,254
chunks; bench/scale.py --keep DIR). The daemon starts on it; each round measures every query
once with the defaults, then with --setting (a config reload: search settings are live), the
order alternating between rounds so that neither always runs on a warmer machine. Queries are
the dev set's questions and SciFact's claims, alternating (bench/scale.py's). The figures are
medians over rounds of each round's p50. Examples: 'feedback_chunks = 0' (what dense feedback
costs), 'fusion = "rrf"' (convex fusion against RRF). The quality side is `ragctl eval`.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
import tomllib
from pathlib import Path

from common import EMBED_MODEL, Daemon, pct, quiet_config, ready, save
from scale import queries, raw_embed_p50

TAG = "# bench/search_ab.py"


def unset(cfg: Path) -> str:
    """Take this bench's [search] table out of the config; returns the text left."""
    text = re.sub(r"\n*" + re.escape(TAG) + r"\n\[search\]\n[^\n]*\n", "\n", cfg.read_text())
    cfg.write_text(text)
    return text


def put(cfg: Path, setting: str | None) -> None:
    """The config with no [search] table (the defaults), or with one holding `setting`."""
    text = unset(cfg)
    if "\n[search]\n" in text:
        raise SystemExit(f"{cfg}: has a [search] table; this bench adds its own")
    if setting is not None:
        cfg.write_text(text + f"\n{TAG}\n[search]\n{setting}\n")


def p50(d: Daemon, qs: list[str]) -> float:
    lat = []
    with d.client(timeout=120) as c:
        for q in qs:
            t = time.perf_counter()
            c.call("search", query=q, mode="hybrid", rerank=False)
            lat.append((time.perf_counter() - t) * 1e3)
    return pct(lat, 50)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True, help="an indexed bench folder")
    ap.add_argument("--setting", default="feedback_chunks = 0",
                    help="one line of [search], compared with the defaults")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", type=Path, default=EMBED_MODEL)
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = ap.parse_args()
    try:
        (key, value), = tomllib.loads(args.setting).items()
    except (tomllib.TOMLDecodeError, ValueError):
        raise SystemExit(f"--setting must be one 'key = value' line, got {args.setting!r}")

    cfg = quiet_config(args.keep / "config.toml")
    put(cfg, None)
    qs = queries(args.queries)
    runs: dict[str, list[float]] = {"default": [], "setting": []}
    d = Daemon(cfg, args.keep / "run" / "ragd.sock", args.keep / "ragd.log")
    try:
        with d:
            st = ready(d, vectors=True)
            chunks = sum(s["chunks"] for s in st["sources"])
            p50(d, qs[:10])  # warm
            now = "default"
            for r in range(args.rounds):
                for name in (("default", "setting") if r % 2 == 0 else ("setting", "default")):
                    if name != now:
                        put(cfg, args.setting if name == "setting" else None)
                        applied = d.call("reload")["applied"]
                        if applied not in ([key], [f"search_{key}"]):  # (search_k: k)
                            raise SystemExit(f"the reload applied {applied}, not {key}: "
                                             f"is {args.setting!r} a default?")
                        now = name
                    runs[name].append(p50(d, qs))
    finally:
        unset(cfg)
    embed = min(raw_embed_p50(args.model, qs, args.keep).values())  # the fastest raw call
    base, other = statistics.median(runs["default"]), statistics.median(runs["setting"])
    result = {"chunks": chunks, "queries": len(qs), "rounds": args.rounds,
              "setting": args.setting, "hybrid_p50_default_ms": round(base, 2),
              "hybrid_p50_setting_ms": round(other, 2),
              "setting_minus_default_ms": round(other - base, 2),
              "embed_p50_ms": round(embed, 2), "default_over_embed": round(base / embed, 2),
              "setting_over_embed": round(other / embed, 2),
              "runs_ms": {k: [round(x, 2) for x in v] for k, v in runs.items()}}
    print(f"{chunks} chunks, {len(qs)} queries x {args.rounds} rounds (medians of per-round p50)")
    print(f"  raw engine, a query    p50 {result['embed_p50_ms']} ms")
    print(f"  hybrid, the defaults   p50 {result['hybrid_p50_default_ms']} ms "
          f"({result['default_over_embed']}x the raw engine)")
    print(f"  hybrid, {args.setting:<14} p50 {result['hybrid_p50_setting_ms']} ms "
          f"({result['setting_over_embed']}x the raw engine)")
    print(f"  the setting minus the defaults: {result['setting_minus_default_ms']} ms")
    save(f"search-ab-{chunks}-{re.sub(r'[^a-z0-9]+', '-', args.setting.lower()).strip('-')}",
         result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
