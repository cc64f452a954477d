"""The chunker on a note that is one long line (an export, a minified dump), against the same
words as ordinary lines: seconds per MB for each, and their ratio. The indexer chunks on its
one lane, so a slow note holds up every file changed after it.

    python bench/long_line.py [--mb 1,2,5]

Each size is chunked three times; the median is printed. Linear: the seconds per MB stay flat
as the size grows, and the ratio stays near 1.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ragd.ingest import chunker, markdown  # noqa: E402

WORDS = ("task filter query date recurring note plugin vault heading link tag status done "
         "due scheduled priority emoji layout group sort").split()


def text_of(mb: float, one_line: bool) -> str:
    rnd = random.Random(1)
    words, size = [], 0
    while size < mb * 1e6:
        w = rnd.choice(WORDS) + str(rnd.randint(0, 999))
        words.append(w)
        size += len(w) + 1
    if one_line:
        return "# Dump\n\n" + " ".join(words) + "\n"
    lines = [" ".join(words[i:i + 12]) + "." for i in range(0, len(words), 12)]
    return "# Dump\n\n" + "\n".join(lines) + "\n"


def seconds(text: str) -> float:
    doc = markdown.parse(text, "Dump")
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        chunker.chunk_doc(doc)
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", default="1,2,5")
    args = ap.parse_args()
    print(f"{'MB':>4}  {'one line s/MB':>14}  {'lines s/MB':>11}  ratio")
    for mb in (float(x) for x in args.mb.split(",")):
        one, many = seconds(text_of(mb, True)) / mb, seconds(text_of(mb, False)) / mb
        print(f"{mb:>4g}  {one:>14.3f}  {many:>11.3f}  {one / many:.2f}")


if __name__ == "__main__":
    main()
