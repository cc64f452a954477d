"""`ask` through ragd next to the raw generator engine: time to first token and tokens/s.

    python bench/ask.py [--runs 5] [--max-tokens 64] [--model NAME_OR_PATH]

A real daemon on two folders of the Obsidian Tasks docs (tests/conftest.py small_vault; BM25
retrieval, so no embedding runs meanwhile) with the generator (default smollm2-135m-instruct,
from the tests' cache: tests/chat_model.py), and beside it a second generator engine started by
ragd's own supervisor with the same command line: the raw engine. Each run asks a different
question:

- ragd: the `ask` op over the socket, as `ragctl ask` sends it; first token = the
  `{"writing": true}` reply (the engine's first token, as the client learns of it), shown = the
  first `delta` (text is held back until the answer cites a note), tokens/s = tokens after the
  first / the time from the first token to the final reply;
- raw: the very prompt ragd built (rebuilt from the reply's sources with ragd.search.ask
  .messages), streamed straight from the raw engine's /v1/chat/completions; first token = the
  first content delta, tokens/s likewise.

Each engine sees the same prompts in the same order (so the same prompt-cache hits: the shared
instructions, not the notes); the order of the two alternates between runs. Prints medians and
the ratios ragd / raw (median of the per-run ratios). The machine may be shared: the figures
are only as quiet as it is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import chat_model  # noqa: E402
from common import cpu_seconds, quiet_config, save  # noqa: E402
from conftest import BM25_ONLY, Daemon, small_vault, write_config  # noqa: E402
from ragd.engines import models  # noqa: E402
from ragd.engines.supervisor import Engine, EngineSettings  # noqa: E402
from ragd.search import ask  # noqa: E402

QUESTIONS = [
    "How do I make a task repeat every week?",
    "How do I style the task buttons with CSS?",
    "How can tasks be shown on a Kanban board?",
    "How do I add a due date to a task?",
    "Which plugins work together with Tasks?",
    "How do I find tasks that are done?",
    "How do I create a task with QuickAdd?",
    "How do I link a task to its note?",
]
assert len(QUESTIONS) >= 5


def via_ragd(d: Daemon, question: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    first = shown = None
    with d.client(timeout=600) as c:
        req = c.send("ask", question=question, max_tokens=max_tokens)
        for reply in c.replies(req):
            r = reply["result"]
            if reply.get("final", True):
                end, res = time.perf_counter(), r
            elif r.get("writing") and first is None:
                first = time.perf_counter()
            elif "delta" in r and shown is None:
                shown = time.perf_counter()
    if first is None:
        raise SystemExit(f"no model call for {question!r}: {res.get('reason')}")
    n = res["timings"]["tokens"]
    return {"ttft_ms": (first - t0) * 1e3, "shown_ms": (shown - t0) * 1e3 if shown else None,
            "tokens": n, "tok_s": (n - 1) / (end - first) if n > 1 else None,
            "engine_tok_s": res["timings"]["tokens_per_s"],
            "prompt_tokens": res["timings"]["prompt_tokens"], "grounded": res["grounded"],
            "notes": res["sources"], "retrieval_ms": res["timings"]["retrieval_ms"]}


def raw(engine: Engine, question: str, notes: list[dict], max_tokens: int,
        temperature: float) -> dict:
    body = {"messages": ask.messages(question, [ask.Note(**n) for n in notes]),
            "max_tokens": max_tokens, "temperature": temperature, "cache_prompt": True}
    t0 = time.perf_counter()
    first, n, timings = None, 0, {}
    for event in engine.client.chat_stream(body, timeout=600):
        timings = event.get("timings") or timings
        choice = (event.get("choices") or [{}])[0]
        if (choice.get("delta") or {}).get("content"):
            n += 1
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    toks = timings.get("predicted_n", n)
    return {"ttft_ms": (first - t0) * 1e3, "tokens": toks,
            "tok_s": (toks - 1) / (end - first) if toks > 1 else None,
            "engine_tok_s": timings.get("predicted_per_second"),
            "prompt_tokens": timings.get("prompt_n")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default=chat_model.NAME)
    args = ap.parse_args()
    runs = min(args.runs, len(QUESTIONS))
    tmp = Path(tempfile.mkdtemp(prefix="ragd-bench-ask-"))
    if args.model == chat_model.NAME:
        chat_model.install(tmp / "data")
    root = small_vault(tmp / "vault")
    cfg = quiet_config(write_config(tmp / "config.toml", tmp / "data", tmp / "run" / "ragd.sock",
                                    [{"name": "docs", "path": str(root), "kind": "obsidian"}],
                                    BM25_ONLY + f'[generator]\nmodel = "{args.model}"\n'))
    d = Daemon(cfg, tmp / "run" / "ragd.sock", tmp / "ragd.stderr")
    d.start()
    engine = None
    try:
        d.wait_idle()
        while (g := d.call("status")["engines"]["generator"])["state"] != "ready":
            if g["state"] == "failed":
                raise SystemExit(g["reason"])
            time.sleep(0.2)
        model = models.resolve(args.model, "generator", tmp / "data")
        import dataclasses
        model = dataclasses.replace(model, context=g["context"])
        engine = Engine("generator", model, EngineSettings(), tmp / "raw", tmp / "raw")
        engine.start()
        if not engine.wait_ready(120):
            raise SystemExit(engine.tail_log())
        print(f"generator {g['model']} (context {g['context']}), engine {g['engine']}; "
              f"{runs} runs, max_tokens {args.max_tokens}")
        rows = []
        cpu0 = cpu_seconds(d.proc.pid)
        for i, q in enumerate(QUESTIONS[:runs]):
            # The prompt ragd will build, built here too (the search op, then the same fitting
            # with the raw engine's tokenizer, which leaves its cache alone), so that either
            # engine can go first; checked against what ragd sent.
            found = d.call("search", query=q, k=6, group="note")["results"]
            notes = [n.public() for n in ask.fit_notes(engine.client, found, q, g["context"],
                                                       args.max_tokens)]
            if i % 2 == 0:
                r = via_ragd(d, q, args.max_tokens)
                w = raw(engine, q, notes, args.max_tokens, 0.0)
            else:
                w = raw(engine, q, notes, args.max_tokens, 0.0)
                r = via_ragd(d, q, args.max_tokens)
            assert r["notes"] == notes, "ragd built another prompt than the raw engine got"
            rows.append((r, w))
            print(f"  run {i + 1}: {len(r['notes'])} notes, prompt {r['prompt_tokens']} / "
                  f"{w['prompt_tokens']} tokens; first token ragd {r['ttft_ms']:.0f} ms, raw "
                  f"{w['ttft_ms']:.0f} ms; shown "
                  f"{'%.0f ms' % r['shown_ms'] if r['shown_ms'] else 'never (uncited)'}; "
                  f"{r['tokens']} / {w['tokens']} tokens at {r['tok_s'] or 0:.1f} / "
                  f"{w['tok_s'] or 0:.1f} tokens/s")
        cpu = cpu_seconds(d.proc.pid) - cpu0
        med = statistics.median

        def col(side, key):
            return [x[side][key] for x in rows if x[side][key] is not None]

        ratio_ttft = med([r["ttft_ms"] / w["ttft_ms"] for r, w in rows])
        ratio_tps = med([r["tok_s"] / w["tok_s"] for r, w in rows if r["tok_s"] and w["tok_s"]])
        result = {
            "model": g["model"], "context": g["context"], "runs": runs,
            "max_tokens": args.max_tokens,
            "ragd": {"ttft_ms": med(col(0, "ttft_ms")), "tok_s": med(col(0, "tok_s")),
                     "engine_tok_s": med(col(0, "engine_tok_s")),
                     "shown_ms": med(col(0, "shown_ms")) if col(0, "shown_ms") else None,
                     "retrieval_ms": med(col(0, "retrieval_ms")),
                     "grounded": sum(r["grounded"] for r, _ in rows)},
            "raw": {"ttft_ms": med(col(1, "ttft_ms")), "tok_s": med(col(1, "tok_s")),
                    "engine_tok_s": med(col(1, "engine_tok_s"))},
            "ratio_ttft": ratio_ttft, "ratio_tok_s": ratio_tps,
            "daemon_cpu_s": cpu,
        }
        print(f"time to first token (median): ragd {result['ragd']['ttft_ms']:.0f} ms, raw "
              f"engine {result['raw']['ttft_ms']:.0f} ms; ragd / raw {ratio_ttft:.2f} "
              f"(retrieval {result['ragd']['retrieval_ms']:.0f} ms of it)")
        print(f"tokens/s (median): ragd {result['ragd']['tok_s']:.1f}, raw engine "
              f"{result['raw']['tok_s']:.1f}; ragd / raw {ratio_tps:.2f}")
        shown = result["ragd"]["shown_ms"]
        print(f"first text shown by ragctl (median of cited answers): "
              f"{'%.0f ms' % shown if shown else 'none cited'}; answers grounded: "
              f"{result['ragd']['grounded']} of {runs}; daemon CPU {cpu:.2f} s")
        print(f"saved {save('ask', result)}")
    finally:
        if engine is not None:
            engine.stop()
        d.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
