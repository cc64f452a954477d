"""ragctl service: the unit it writes is valid for systemd, runs this installation's ragd in
the foreground, and the reference copies in service/ are what it writes."""

import configparser
import os
import plistlib
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ragctl, write_config
from ragd import protocol as P
from ragctl import service

ROOT = Path(__file__).resolve().parents[1]


def test_reference_files_are_what_ragctl_writes():
    assert (ROOT / "service" / "ragd.service").read_text() == \
        service.systemd_unit("/usr/bin/python3")
    assert (ROOT / "service" / "org.ragd.daemon.plist").read_bytes() == \
        service.launchd_plist("/usr/bin/python3", Path("/Users/me"))
    with open(ROOT / "service" / "org.ragd.daemon.plist", "rb") as f:
        plist = plistlib.load(f)
    assert plist["ProgramArguments"] == ["/usr/bin/python3", "-P", "-m", "ragd"]
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["RunAtLoad"] is True


def test_service_install_writes_a_unit_systemd_accepts_and_that_runs_ragd(make_daemon,
                                                                          tmp_path):
    d = make_daemon()  # only for its config: the unit's command is run below
    xdg = tmp_path / "xdg"
    env = {**os.environ, "XDG_CONFIG_HOME": str(xdg)}
    r = ragctl("--config", d.config, "service", "install", "--no-start", env=env)
    assert r.returncode == 0, r.stderr
    unit = xdg / "systemd" / "user" / "ragd.service"
    assert str(unit) in r.stdout
    parsed = _unit(unit)
    cmd = shlex.split(parsed["Service"]["ExecStart"])
    assert cmd[:4] == [sys.executable, "-P", "-m", "ragd"]  # this installation's interpreter
    assert cmd[4:] == ["--config", str(d.config)]
    assert parsed["Service"]["Restart"] == "on-failure"
    assert "--background" not in cmd  # the foreground: the service manager supervises it
    _verify(unit, env, tmp_path)
    # and the command it runs is a working ragd
    assert _runs_ragd(cmd, d.socket)["config"] == str(d.config)
    ragctl("service", "uninstall", env=_no_user_bus(env, tmp_path))
    assert not unit.exists()


def test_service_install_names_the_config_ragctl_uses(tmp_path):
    """Without --config the unit named no config, so the service read whatever the service
    manager's environment led it to (not $RAGD_CONFIG, not this shell's XDG_CONFIG_HOME). It
    names the config ragctl uses: here the XDG one, in a home folder whose name has a space
    (quoted for systemd), then the one $RAGD_CONFIG names."""
    home = tmp_path / "my home"
    xdg = home / ".config"
    (xdg / "ragd").mkdir(parents=True)
    sock = tmp_path / "run" / "s.sock"
    cfg = write_config(xdg / "ragd" / "config.toml", tmp_path / "data", sock, [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGD_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(xdg))
    r = ragctl("service", "install", "--no-start", env=env)
    assert r.returncode == 0, r.stderr
    unit = xdg / "systemd" / "user" / "ragd.service"
    cmd = shlex.split(_unit(unit)["Service"]["ExecStart"])
    assert cmd == [sys.executable, "-P", "-m", "ragd", "--config", str(cfg)], cmd
    assert f"(ragd reads {cfg})" in r.stdout, r.stdout
    # what starts it, said (a fresh-user walk found no next step)
    assert "systemctl --user daemon-reload && systemctl --user enable --now ragd.service" \
        in r.stdout, r.stdout
    _verify(unit, env, tmp_path)
    assert _runs_ragd(cmd, sock)["config"] == str(cfg)
    other = write_config(tmp_path / "other.toml", tmp_path / "data", sock, [])
    r = ragctl("service", "install", "--no-start", env={**env, "RAGD_CONFIG": str(other)})
    assert r.returncode == 0, r.stderr
    cmd = shlex.split(_unit(unit)["Service"]["ExecStart"])
    assert cmd == [sys.executable, "-P", "-m", "ragd", "--config", str(other)], cmd
    ragctl("service", "uninstall", env=_no_user_bus(env, tmp_path))
    assert not unit.exists()


def test_service_uninstall_says_what_failed(tmp_path):
    """uninstall said "stopped, disabled and removed" whatever systemctl answered. Here
    systemctl --user finds no user manager (none is reachable: the tests never touch the
    real one): the unit is removed, and the failure is said, exit 1."""
    xdg = tmp_path / "xdg"
    env = _no_user_bus({**os.environ, "XDG_CONFIG_HOME": str(xdg)}, tmp_path)
    r = ragctl("service", "install", "--no-start", env=env)
    assert r.returncode == 0, r.stderr
    unit = xdg / "systemd" / "user" / "ragd.service"
    r = ragctl("service", "uninstall", env=env)
    assert not unit.exists()
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "stopped" not in r.stdout and "disabled" not in r.stdout, r.stdout
    assert r.stdout.splitlines() == [f"removed {unit}"], r.stdout
    err = r.stderr.strip()
    assert err.count("\n") == 0, err  # one line, as every ragctl error
    assert err.startswith("ragctl: service uninstall: systemctl --user disable --now "
                          "ragd.service failed: ") and "bus" in err, err
    r = ragctl("service", "uninstall", env=env)
    assert r.returncode == 0 and r.stdout.strip() == f"no unit at {unit}", r.stdout


def test_service_install_leaves_ragd_running_when_systemd_cannot_take_it(make_daemon,
                                                                          tmp_path):
    """install stopped the running ragd first, then found no user session: no ragd ran at
    all. The ragd stays until the service manager has taken the unit."""
    d = make_daemon()
    xdg = tmp_path / "xdg"
    env = _no_user_bus({**os.environ, "XDG_CONFIG_HOME": str(xdg)}, tmp_path)
    with d:
        r = ragctl("--config", d.config, "service", "install", env=env)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "systemctl --user daemon-reload failed" in r.stderr, r.stderr
        assert "stopping" not in r.stdout, r.stdout
        assert d.proc.poll() is None and d.call("status")["pid"] == d.proc.pid
        ragctl("service", "uninstall", env=env)


def _no_user_bus(env: dict, tmp_path: Path) -> dict:
    """An environment in which systemctl --user reaches no service manager (so a test never
    stops or disables the real user's ragd.service)."""
    runtime = tmp_path / "no-bus"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return {**{k: v for k, v in env.items() if k != "DBUS_SESSION_BUS_ADDRESS"},
            "XDG_RUNTIME_DIR": str(runtime)}


def _unit(path: Path) -> configparser.ConfigParser:
    parsed = configparser.ConfigParser(strict=False, interpolation=None)
    parsed.optionxform = str
    parsed.read(path)
    return parsed


def _verify(unit: Path, env: dict, tmp_path: Path) -> None:
    """systemd's own check of the unit."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is needed to check the unit (Debian: apt install systemd)")
    runtime = tmp_path / "xdg-run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    check = subprocess.run(["systemd-analyze", "verify", "--user", str(unit)],
                           capture_output=True, text=True,
                           env={**env, "XDG_RUNTIME_DIR": str(runtime)})
    assert check.returncode == 0, check.stderr


def _runs_ragd(cmd: list[str], socket: Path) -> dict:
    """Run the unit's command until it answers at socket; its status then (it is stopped)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with P.Client(socket, timeout=5) as c:
                    st = c.call("status")
                    assert st["pid"] == proc.pid
                    return st
            except (P.NotRunning, OSError):
                assert time.monotonic() < deadline, "the unit's command did not start ragd"
                time.sleep(0.05)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
