"""`ragctl eval QUESTIONS.jsonl`: how well ragd finds the notes that answer your questions.

The file holds one JSON object per line: ``question``, ``relevant`` (paths relative to a source
root, or whole as ``search -l`` prints them, of every note that answers it), and optionally
``id`` and ``kind`` (any label: the figures are given per kind too). A line with no
``relevant`` (or an empty list) is an out-of-scope question: the vault does not answer it,
and the figure is how many were answered "nothing relevant" or flagged low-confidence.

Each question is searched as a person would (over the socket, the daemon's defaults); a note
counts once, at the rank of its best result. Metrics, by note: hit@1, hit@3, hit@5 (a relevant
note in the top n), MRR@10 and nDCG@10.

Run while the vectors are still being computed, the vector and hybrid figures are those of a
partial index (hybrid ranks by keywords below 95% coverage): the lowest vector coverage the
replies gave is kept (``vector_coverage``), and the figures are marked not final
(``vectors_partial``, a note under the table).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


class EvalError(Exception):
    """The questions file cannot be used; the message names the line."""


def load(path: Path) -> list[dict]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise EvalError(f"{path}: cannot read: {e.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
        except ValueError as e:
            raise EvalError(f"{path}:{n}: not JSON: {e}") from None
        if not isinstance(q, dict) or not isinstance(q.get("question"), str):
            raise EvalError(f"{path}:{n}: needs a 'question' string")
        rel = q.get("relevant") or []
        if not isinstance(rel, list) or not all(isinstance(r, str) for r in rel):
            raise EvalError(f"{path}:{n}: 'relevant' must be a list of paths")
        out.append({"id": q.get("id", str(n)), "question": q["question"], "relevant": rel,
                    "kind": q.get("kind") or ("out-of-scope" if not rel else "all")})
    if not out:
        raise EvalError(f"{path}: no questions")
    return out


def metrics(ranked: list[str], relevant: set[str]) -> dict:
    first = next((i for i, p in enumerate(ranked[:10]) if p in relevant), None)
    dcg = sum(1 / math.log2(i + 2) for i, p in enumerate(ranked[:10]) if p in relevant)
    idcg = sum(1 / math.log2(i + 2) for i in range(min(len(relevant), 10)))
    return {"hit@1": float(first is not None and first < 1),
            "hit@3": float(first is not None and first < 3),
            "hit@5": float(first is not None and first < 5),
            "mrr@10": 1 / (first + 1) if first is not None else 0.0,
            "ndcg@10": dcg / idcg if idcg else 0.0}


METRICS = ("hit@1", "hit@3", "hit@5", "mrr@10", "ndcg@10")


def run(client, questions: list[dict], mode: str | None, sources: list[str] | None,
        roots: dict[str, str], k: int = 10) -> dict:
    """Search every question; returns overall and per-kind figures, and each question's."""
    rows = []
    lat = []
    used: dict[str, int] = {}  # the modes the replies say they used
    coverage: float | None = None  # the lowest vector coverage of a reply (None: no vectors)
    degraded: str | None = None  # why a reply was not of the mode asked (the first one's)
    for q in questions:
        args = {"query": q["question"], "k": max(k, 10)}
        if mode:
            args["mode"] = mode
        if sources:
            args["sources"] = sources
        t = time.perf_counter()
        res = client.call("search", **args)
        lat.append((time.perf_counter() - t) * 1e3)
        used[res["mode"]] = used.get(res["mode"], 0) + 1
        if res.get("degraded"):
            degraded = degraded or res.get("reason") or "degraded"
        if res.get("vector_coverage") is not None:
            coverage = min(res["vector_coverage"], 1.0 if coverage is None else coverage)
        ranked: list[str] = []
        for r in res["results"]:
            rel = _relative(r["path"], roots)
            if rel not in ranked:
                ranked.append(rel)
        row = {"id": q["id"], "kind": q["kind"], "question": q["question"], "top": ranked[:5],
               "nothing_relevant": not res["results"],
               "low_confidence": bool(res.get("low_confidence") or res.get("below_threshold")
                                      or not res["results"]),
               "confidence": res.get("confidence")}
        if q["relevant"]:
            row.update(metrics(ranked, set(q["relevant"])))
        rows.append(row)
    scored = [r for r in rows if "mrr@10" in r]
    out: dict = {"mode": mode or max(used, key=used.get), "questions": len(scored),
                 "overall": _mean(scored), "by_kind": {}}
    for kind in sorted({r["kind"] for r in scored}):
        sub = [r for r in scored if r["kind"] == kind]
        out["by_kind"][kind] = {"n": len(sub), **_mean(sub)}
    oos = [r for r in rows if "mrr@10" not in r]
    out["in_scope_flagged"] = sum(r["low_confidence"] for r in scored)
    out["vector_coverage"] = coverage
    out["vectors_partial"] = coverage is not None and coverage < 1.0
    out["answered_as"] = used  # mode -> searches: another than asked when degraded
    if degraded:
        out["degraded"] = degraded
    if oos:
        out["out_of_scope"] = {"n": len(oos),
                               "nothing_relevant": sum(r["nothing_relevant"] for r in oos),
                               "flagged": sum(r["low_confidence"] for r in oos)}
    lat.sort()
    out["p50_ms"] = round(lat[len(lat) // 2], 1)
    out["rows"] = rows
    return out


def relative(questions: list[dict], roots: dict[str, str]) -> None:
    """Each relevant path given whole (as `search -l` prints it) made relative to the source
    root that holds it, as the results are compared: whole, it never matched, and the
    figures were 0 with nothing said. One outside every root is left whole (`missing`)."""
    for q in questions:
        q["relevant"] = [_relative(p, roots) for p in q["relevant"]]


def _relative(path: str, roots: dict[str, str]) -> str:
    whole = os.path.expanduser(path)
    if not os.path.isabs(whole):
        return path
    for root in roots.values():
        inside = root.rstrip("/") + "/"
        if whole.startswith(inside):
            return whole[len(inside):]
    return path


def missing(questions: list[dict], roots: dict[str, str]) -> list[str]:
    """The relevant paths no source root holds on disk (renamed, moved, deleted, a typo, or
    a whole path outside every source): their questions can only miss."""
    out = []
    for q in questions:
        for rel in q["relevant"]:
            if (os.path.isabs(os.path.expanduser(rel)) or not any(
                    (Path(root) / rel).is_file() for root in roots.values())) \
                    and rel not in out:
                out.append(rel)
    return out


def _mean(rows: list[dict]) -> dict:
    if not rows:
        return {m: 0.0 for m in METRICS}
    return {m: round(sum(r[m] for r in rows) / len(rows), 4) for m in METRICS}


def table(results: list[dict]) -> str:
    """The human table: one row per mode, overall and per kind."""
    lines = [f"{'mode':<8} {'kind':<14} {'n':>3}  " + "  ".join(f"{m:>7}" for m in METRICS)]
    for res in results:
        groups = [("all", {"n": res["questions"], **res["overall"]})] + \
            [(k, g) for k, g in res["by_kind"].items() if k != "all"]  # (no kind given: "all")
        for kind, g in groups:
            lines.append(f"{res['mode']:<8} {kind:<14} {g['n']:>3}  "
                         + "  ".join(f"{g[m]:7.3f}" for m in METRICS))
        extra = f"{res['mode']:<8} in scope flagged low-confidence: {res['in_scope_flagged']}"
        if "out_of_scope" in res:
            o = res["out_of_scope"]
            extra += (f"; out of scope: {o['flagged']} of {o['n']} flagged "
                      f"({o['nothing_relevant']} answered nothing relevant)")
        lines.append(extra + f"; search p50 {res['p50_ms']} ms")
    for res in results:
        other = {m: n for m, n in res.get("answered_as", {}).items() if m != res["mode"]}
        if other:
            lines.append(f"note: {res['mode']}: " + ", ".join(
                f"{n} of {sum(res['answered_as'].values())} searches were answered as {m}"
                for m, n in other.items()) + (f" ({res['degraded']})" if res.get("degraded")
                                              else "") + f": these are not {res['mode']}'s figures")
        if res.get("vectors_partial"):
            pct = 100 * res["vector_coverage"]
            shown = f"{pct:.0f}%" if pct < 99.5 else f"{pct:.1f}%"  # (99.7 is not "100%")
            lines.append(f"note: {res['mode']}: vectors covered only {shown} of the chunks "
                         f"(still being embedded): these figures are not final; run it again "
                         f"once 'ragctl status' shows every chunk embedded")
    return "\n".join(lines)
