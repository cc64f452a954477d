"""The service files parse and run ragd in the foreground with restart on failure."""

import configparser
import plistlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(ROOT / "service" / "ragd.service")
    svc = unit["Service"]
    assert svc["Type"] == "simple"
    assert svc["ExecStart"].split()[0].endswith("/ragd")
    assert "--background" not in svc["ExecStart"]  # foreground: systemd supervises it
    assert svc["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "default.target"


def test_launchd_plist():
    with open(ROOT / "service" / "org.ragd.daemon.plist", "rb") as f:
        plist = plistlib.load(f)
    assert plist["Label"] == "org.ragd.daemon"
    assert plist["ProgramArguments"][0].endswith("/ragd") and len(plist["ProgramArguments"]) == 1
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["RunAtLoad"] is True
