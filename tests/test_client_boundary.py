"""ragctl stays thin: it imports nothing from ragd but the protocol module."""

import ast
from pathlib import Path

from ragctl.cli import parser

ROOT = Path(__file__).resolve().parents[1]


def test_ragctl_imports_only_the_protocol():
    for path in (ROOT / "ragctl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name == "ragd" or name.startswith("ragd."):
                    assert name in ("ragd", "ragd.protocol"), f"{path.name} imports {name}"
    # and the protocol module itself depends on nothing else of ragd
    tree = ast.parse((ROOT / "ragd" / "protocol.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith("ragd"), node.module


def test_every_command_has_help():
    sub = next(a for a in parser()._actions if a.dest == "command")
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert set(helps) == {"start", "stop", "status", "search", "ask", "get", "mcp", "reindex",
                          "sources",
                          "reload", "service", "eval",
                          "models", "files", "gc", "watch", "related"}
    assert all(helps.values()), helps
