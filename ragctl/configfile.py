"""Editing the user's config file: sources added and removed with their comments and layout
kept (tomlkit, the style-preserving TOML library). A missing file is created from the documented
default (config.default.toml, the same text as the repository's config.toml)."""

from __future__ import annotations

import os
import stat
import tomllib
from importlib import resources
from pathlib import Path

import tomlkit

from ragd import protocol as P


class ConfigFileError(Exception):
    """The config file cannot be read or edited; the message names it."""


def default_path(env=os.environ) -> Path:
    return P.xdg("XDG_CONFIG_HOME", ".config", env) / "ragd" / "config.toml"


def default_text() -> str:
    return resources.files("ragctl").joinpath("config.default.toml").read_text(encoding="utf-8")


def target(cli_config: str | None, running_config: str | None, env=os.environ) -> Path:
    """The file to edit: the one the running daemon reads; else --config / $RAGD_CONFIG; else
    the XDG one (created when missing)."""
    if running_config:
        return Path(running_config)
    found = P.find_config(cli_config, env)
    path = found if found is not None else default_path(env)
    if (why := P.not_a_file(path)):  # (every edit reads it first: an OS error, not this)
        raise P.ConfigUnreadable(why)
    return path


def read(path: Path) -> dict:
    """The parsed file ({} when it does not exist); a syntax error names the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigFileError(f"{path}: cannot read: {e.strerror}") from None


def sources(path: Path) -> list[dict]:
    """The [[sources]] of a config file, as written (name, path, kind)."""
    out = []
    for s in read(path).get("sources", []) or []:
        if isinstance(s, dict):
            out.append({"name": s.get("name"), "path": s.get("path"),
                        "kind": s.get("kind", "folder")})
    return out


def _resolved(a: str) -> Path | None:
    try:
        return Path(a).expanduser().resolve() if a else None
    except (OSError, RuntimeError):
        return None


def _overlap(tables, folder: Path) -> tuple[dict, Path, bool] | None:
    """The first source table whose folder holds `folder` (True: folder is inside it) or is
    inside it (False), with that folder: its files would be indexed twice."""
    for s in tables:
        other = _resolved(str(s.get("path") or ""))
        if other is not None and (folder.is_relative_to(other) or other.is_relative_to(folder)):
            return s, other, folder.is_relative_to(other)
    return None


def nested_in(path: Path, folder: str) -> str | None:
    """The name of a source of the config file whose folder holds `folder` or is inside it:
    `add_source` refuses such a folder, so a source removed from there comes back by hand."""
    mine = _resolved(folder)
    found = _overlap(sources(path), mine) if mine is not None else None
    return str(found[0].get("name")) if found else None


def _same_folder(a: str, b: Path) -> bool:
    return _resolved(a) == b


def _shown(folder: Path) -> str:
    """A folder as written into the file: ~/… under the home folder (portable), else absolute."""
    home = Path.home()
    try:
        return "~/" + folder.relative_to(home).as_posix()
    except ValueError:
        return str(folder)


def add_source(path: Path, folder: Path, name: str | None = None,
               kind: str | None = None) -> tuple[str, bool]:
    """Append a [[sources]] table for folder (created from the default when missing). Returns
    (the source's name, whether it was added: False when the folder is already a source)."""
    folder = folder.expanduser().resolve()
    if not folder.is_dir():
        raise ConfigFileError(f"{folder} is not a folder" if folder.exists() else
                              f"{folder} does not exist")
    text = path.read_text(encoding="utf-8") if path.exists() else default_text()
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as e:
        raise ConfigFileError(f"{path}: not valid TOML: {e}") from None
    existing = doc.get("sources") or []
    if not existing and "sources" in doc:  # `sources = []`: the tables take its place
        del doc["sources"]
    for s in existing:
        if _same_folder(str(s.get("path", "")), folder):
            return str(s.get("name")), False
    if found := _overlap(existing, folder):  # inside another source, or holding one
        s, other, inside = found
        if inside:
            raise ConfigFileError(
                f"{folder} is inside the source {s.get('name')!r} ({other}): its files are "
                f"indexed already, and would be found twice. To index it apart (other rules), "
                f"exclude it from {s.get('name')!r} in {path} and add its table by hand")
        raise ConfigFileError(
            f"{folder} holds the source {s.get('name')!r} ({other}): its files would be "
            f"indexed, and found, twice. Remove that source first: ragctl sources remove "
            f"{s.get('name')}")
    name = name or folder.name or "source"
    if "/" in name or not name.strip():
        raise ConfigFileError(f"a source name must be non-empty and without '/': {name!r}")
    if any(s.get("name") == name for s in existing):
        raise ConfigFileError(f"{path} already has a source named {name!r} (another folder); "
                              f"choose another name with --name")
    kind = kind or ("obsidian" if (folder / ".obsidian").is_dir() else "folder")
    table = tomlkit.table()
    table["name"] = name
    table["path"] = _shown(folder)
    table["kind"] = kind
    if "sources" in doc:
        table.trivia.indent = "\n"  # a blank line before it, as between the others
        doc["sources"].append(table)
    else:
        aot = tomlkit.aot()
        aot.append(table)
        doc.append("sources", aot)
    _write(path, tomlkit.dumps(doc))
    return name, True


def remove_source(path: Path, name: str) -> str:
    """Remove the source named `name` (or, when none is, the one name that differs from it
    only in case) from the config file. Returns the name removed."""
    if not path.exists():
        raise ConfigFileError(f"no config file at {path}, so no source named {name!r}")
    try:
        doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    except tomlkit.exceptions.ParseError as e:
        raise ConfigFileError(f"{path}: not valid TOML: {e}") from None
    existing = doc.get("sources") or []
    names = [str(s.get("name")) for s in existing]
    if name not in names:  # "notes" for "Notes", when only one name differs only in case
        folded = [n for n in names if n.casefold() == name.casefold()]
        name = folded[0] if len(folded) == 1 else name
    keep = [i for i, s in enumerate(existing) if s.get("name") != name]
    if len(keep) == len(existing):
        known = ", ".join(str(s.get("name")) for s in existing) or "none"
        raise ConfigFileError(f"{path} has no source named {name!r} (known: {known})")
    if not keep:
        # Said outright: ragd refuses a reload of a config that names no source at all (a
        # file saved empty or cut short is no reason to remove every source).
        del doc["sources"]
        none = tomlkit.array()
        none.comment("no sources: 'ragctl sources add PATH' adds one")
        doc["sources"] = none
    else:
        for i in reversed(range(len(existing))):
            if i not in keep:
                del existing[i]
    text = tomlkit.dumps(doc)
    # the last table removed leaves the blank line before it at the end, and the next add
    # puts another before its table: two would pile up
    _write(path, text.rstrip("\n") + "\n" if text.endswith("\n\n") else text)
    return name


def set_value(path: Path, table: str, key: str, value) -> None:
    """Set [table] key = value (created from the default when the file is missing), keeping
    the rest of the file as it is."""
    text = path.read_text(encoding="utf-8") if path.exists() else default_text()
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as e:
        raise ConfigFileError(f"{path}: not valid TOML: {e}") from None
    if table not in doc:
        doc[table] = tomlkit.table()
    doc[table][key] = value
    _write(path, tomlkit.dumps(doc))


def restore(path: Path, text: str | None) -> None:
    """Put back what the file held before an edit (None: it did not exist)."""
    if text is None:
        path.unlink(missing_ok=True)
    else:
        _write(path, text)


def _write(path: Path, text: str) -> None:
    """Atomically: a half-written config is never read. The file keeps its mode (a config
    holding a store token is chmod 600, and the replacing file must not undo that); a new one
    is readable by its owner alone, as everything ragd writes."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o600
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
