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

from conftest import ragctl
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
    assert plist["ProgramArguments"] == ["/usr/bin/python3", "-m", "ragd"]
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
    parsed = configparser.ConfigParser(strict=False, interpolation=None)
    parsed.optionxform = str
    parsed.read(unit)
    cmd = shlex.split(parsed["Service"]["ExecStart"])
    assert cmd[:3] == [sys.executable, "-m", "ragd"]  # this installation's interpreter
    assert cmd[3:] == ["--config", str(d.config)]
    assert parsed["Service"]["Restart"] == "on-failure"
    assert "--background" not in cmd  # the foreground: the service manager supervises it
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is needed to check the unit (Debian: apt install systemd)")
    runtime = tmp_path / "xdg-run"
    runtime.mkdir(mode=0o700)
    check = subprocess.run(["systemd-analyze", "verify", "--user", str(unit)],
                           capture_output=True, text=True,
                           env={**env, "XDG_RUNTIME_DIR": str(runtime)})
    assert check.returncode == 0, check.stderr
    # and the command it runs is a working ragd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with P.Client(d.socket, timeout=5) as c:
                    assert c.call("ping")["pid"] == proc.pid
                break
            except (P.NotRunning, OSError):
                assert time.monotonic() < deadline, "the unit's command did not start ragd"
                time.sleep(0.05)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    r = ragctl("service", "uninstall", env=env)
    assert r.returncode == 0 and not unit.exists()
