"""What inotify itself says, beside watchdog: which folders this process watches (from
/proc/self/fdinfo), whether a folder can be watched at all (the per-user watch limit), and the
folders a source has. The watcher (watcher.py) compares them to find watches lost.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path


def inotify_watched() -> set[int] | None:
    """Inode numbers of the folders this process's inotify instances watch, read from
    /proc/self/fdinfo; None where that cannot be known (no /proc, or no inotify instance)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    inodes: set[int] = set()
    found = False
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as f:
                text = f.read()
        except OSError:
            continue
        found = True
        inodes.update(parse_fdinfo(text))
    return inodes if found else None


def parse_fdinfo(text: str) -> set[int]:
    """Inode numbers of the watches in one inotify fd's /proc fdinfo text. The kernel prints
    the watch descriptor and the inode in hex: 'inotify wd:41e ino:1a2b sdev:...'."""
    return {int(m, 16) for m in re.findall(r"^inotify wd:[0-9a-f]+ ino:([0-9a-f]+)", text, re.M)}


def folders(root: Path) -> dict[int, str]:
    """Every folder under root that watchdog watches (all of them, dot folders too; symlinks
    are not followed), by inode number."""
    out: dict[int, str] = {}
    for dirpath, dirnames, _ in os.walk(root):
        try:
            out[os.stat(dirpath).st_ino] = dirpath
        except OSError:
            pass
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return out


def watch_limit() -> str:
    try:
        with open("/proc/sys/fs/inotify/max_user_watches") as f:
            return f.read().strip()
    except OSError:
        return "?"


@functools.cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def try_watch(path: str) -> int | None:
    """Try to watch a folder with a throwaway inotify instance: None if that works (and the
    watch is dropped at once), else the errno (ENOSPC: the per-user watch limit)."""
    libc = _libc()
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        return ctypes.get_errno()
    try:
        wd = libc.inotify_add_watch(fd, os.fsencode(path), 0x100)  # IN_CREATE
        return ctypes.get_errno() if wd < 0 else None
    finally:
        os.close(fd)  # closing the instance drops its watch
