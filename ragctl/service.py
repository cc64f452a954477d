"""`ragctl service install|uninstall`: run ragd as a per-user service, with no paths to edit.

The unit (Linux: a systemd user unit) or agent (macOS: a launchd agent) runs this
installation's own interpreter, ``<python> -P -m ragd``, wherever pip put it — a venv, --user,
pipx — in the foreground, so the service manager supervises it. (-P: the working folder, the
home folder of a systemd user unit, is not put on sys.path, where a folder named ragd in it
would shadow the package.) The files in service/ are
what these functions write for /usr/bin/python3, for reference.
"""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

UNIT_NAME = "ragd.service"
AGENT_LABEL = "org.ragd.daemon"


def _exec_word(word: str) -> str:
    """One word of ExecStart as systemd reads it: % and $ doubled (its specifiers and
    variables), quoted when it holds a space, a quote or a backslash (a home folder with a
    space in its name would otherwise split the config's path in two)."""
    word = word.replace("%", "%%").replace("$", "$$")
    if any(c.isspace() or c in "\"'\\;" for c in word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


def systemd_unit(python: str, config: str | None = None) -> str:
    cmd = " ".join(_exec_word(w) for w in [python, "-P", "-m", "ragd",
                                             *(["--config", config] if config else [])])
    return f"""\
# systemd user unit for ragd, written by `ragctl service install`.
# It runs this installation's interpreter: {python}
[Unit]
Description=ragd, a local retrieval daemon for notes and documents

[Service]
Type=simple
ExecStart={cmd}
# SIGHUP reloads the config (sources added or removed take effect at once).
ExecReload=/bin/kill -HUP $MAINPID
# ragd stops cleanly on SIGTERM (socket removed, the batch in hand committed).
KillSignal=SIGTERM
TimeoutStopSec=30
Restart=on-failure
RestartSec=2

[Install]
WantedBy=default.target
"""


def launchd_plist(python: str, home: Path, config: str | None = None) -> bytes:
    log = str(home / "Library" / "Logs" / "ragd.log")
    return plistlib.dumps({
        "Label": AGENT_LABEL,
        "ProgramArguments": [python, "-P", "-m", "ragd",
                             *(["--config", config] if config else [])],
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restart after a crash, not after ragctl stop
        "StandardErrorPath": log,
        "StandardOutPath": log,
    })


def unit_path(env=os.environ) -> Path:
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else \
        Path.home() / ".config"
    return base / "systemd" / "user" / UNIT_NAME


def agent_path() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{AGENT_LABEL}.plist"


def _run(cmd: list[str]) -> tuple[bool, str]:
    """(succeeded, what it said, on one line)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    said = [ln.strip() for ln in (out.stderr or out.stdout).splitlines() if ln.strip()]
    return out.returncode == 0, " / ".join(said)


def install(config: str | None, start: bool = True, handover=None) -> list[str]:
    """Write the unit (agent) and enable it; returns what was done, line by line. Raises
    RuntimeError with what the user should run when the service manager refuses. `config`:
    the file ragctl uses, named in the unit (the service manager's environment is not the
    shell's: without it the service could read another config than ragctl, or none).
    `handover`: called once the service manager has taken the unit, just before it starts
    ragd (to stop the ragd 'ragctl start' started): a manager that cannot be reached leaves
    that one running (it stopped it first, and then no ragd ran)."""
    python = sys.executable
    done = []
    if sys.platform == "darwin":
        path = agent_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(launchd_plist(python, Path.home(), config))
        done.append(f"wrote {path}{_reads(config)}")
        if start:
            if shutil.which("launchctl") is None:
                raise RuntimeError(f"launchctl not found; {path} is written")
            if handover is not None:
                handover()
            ok, msg = _run(["launchctl", "load", "-w", str(path)])
            if not ok:
                raise RuntimeError(f"launchctl load failed ({msg}); run: launchctl load -w "
                                   f"{path}")
            done.append("loaded it with launchctl: ragd runs now and at each login")
        else:  # (--no-start: what starts it, said)
            done.append(f"not loaded (--no-start); to run ragd now and at each login: "
                        f"launchctl load -w {path}")
        return done
    path = unit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(systemd_unit(python, config))
    done.append(f"wrote {path}{_reads(config)}")
    if start:
        if shutil.which("systemctl") is None:
            raise RuntimeError(f"systemctl not found; {path} is written for a systemd user "
                               f"session")
        for cmd in (["systemctl", "--user", "daemon-reload"],
                    ["systemctl", "--user", "enable", UNIT_NAME],
                    ["systemctl", "--user", "start", UNIT_NAME]):
            if cmd[-2] == "start" and handover is not None:
                handover()
            ok, msg = _run(cmd)
            if not ok:
                raise RuntimeError(f"{' '.join(cmd)} failed: {msg}\nthe unit is written; once "
                                   f"a user session runs, do: systemctl --user daemon-reload "
                                   f"&& systemctl --user enable --now {UNIT_NAME}")
        done.append("enabled and started it: ragd runs now and at each login "
                    "(systemctl --user status ragd)")
    else:
        done.append(f"not started (--no-start); to run ragd now and at each login: "
                    f"systemctl --user daemon-reload && systemctl --user enable --now "
                    f"{UNIT_NAME}")
    return done


def _reads(config: str | None) -> str:
    return f" (ragd reads {config})" if config else " (no config file yet: the built-in defaults)"


def _stopping(cmd: list[str], said: str, done: list[str], failed: list[str]) -> bool:
    """Run the service manager's stop command: `said` in done, or in failed what it said and
    what may be left."""
    ok, msg = _run(cmd)
    if ok:
        done.append(said)
    else:
        failed.append(f"{' '.join(cmd)} failed: {msg}; a ragd it started may still be running "
                      f"('ragctl stop' stops it)")
    return ok


def uninstall() -> tuple[list[str], list[str]]:
    """Stop, disable and remove the unit (agent): (what was done, what failed), line by line.
    The file is removed either way (what was asked); a service manager that refused or could
    not be reached is said, with what may be left (a ragd still running), never reported as
    done."""
    done: list[str] = []
    failed: list[str] = []
    if sys.platform == "darwin":
        path = agent_path()
        if not path.exists():
            return [f"no agent at {path}"], []
        _stopping(["launchctl", "unload", "-w", str(path)], "unloaded it", done, failed)
        path.unlink()
        done.append(f"removed {path}")
        return done, failed
    path = unit_path()
    if not path.exists():
        return [f"no unit at {path}"], []
    systemctl = shutil.which("systemctl") is not None
    disabled = False
    if systemctl:
        disabled = _stopping(["systemctl", "--user", "disable", "--now", UNIT_NAME],
                             "stopped and disabled it", done, failed)
    path.unlink()
    done.append(f"removed {path}" + ("" if systemctl else " (no systemctl: nothing to stop "
                                                          "or disable)"))
    if disabled:  # (else the manager was not reached, or refused: said above)
        ok, msg = _run(["systemctl", "--user", "daemon-reload"])
        if not ok:
            failed.append(f"systemctl --user daemon-reload failed: {msg}")
    return done, failed
