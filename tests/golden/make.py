"""Regenerate the golden chunk files (then read the diff before committing it):
    python tests/golden/make.py"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]

from conftest import VAULTS  # noqa: E402
from ragd.ingest import chunker, markdown  # noqa: E402

NOTES = {
    "start-here": "obsidian-hub/00 - Start here.md",
    "dataview-base": "dwarvesf-brain/_radar/_base.md",
    "recurring-tasks": "obsidian-tasks-docs/Getting Started/Recurring Tasks.md",
    "plugin-tests-callouts": "obsidian-hub/04 - Guides, Workflows, & Courses/Guides/"
                             "How to add automated tests to your plugin.md",
}


def render(rel: str) -> dict:
    path = VAULTS / rel
    doc = markdown.parse(path.read_text(encoding="utf-8"), path.stem)
    return {"note": rel, "meta": doc.meta(),
            "chunks": [{"heading": c.heading, "lines": [c.line_start, c.line_end], "text": c.text,
                        "body": c.body, "keywords": c.keywords}
                       for c in chunker.chunk_doc(doc, 256, 48)]}


if __name__ == "__main__":
    for name, rel in NOTES.items():
        (HERE / f"{name}.json").write_text(json.dumps(render(rel), indent=1, ensure_ascii=False)
                                           + "\n", encoding="utf-8")
