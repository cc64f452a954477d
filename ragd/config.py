"""Reading and checking ragd's configuration.

Every setting is declared once, in ragd/settings.py: :class:`Config`'s fields, the check of a
file's keys, types, choices and bounds, and :data:`SCHEMA` come from there. The documented
default configuration is ``config.toml`` at the repository root (tests/test_config.py checks
that it loads, shows exactly the declared keys, and that docs/configuration.md is current).

A Config is immutable: a reload builds a new one and the runtime swaps it in (ragd/runtime.py).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragd import protocol
from ragd.settings import SETTINGS, SOURCE_KEYS, Setting


class ConfigError(Exception):
    """The configuration cannot be used. The message names the file and the key."""


class ReloadError(Exception):
    """A reload cannot be applied (the file cannot be read, or it would remove every source);
    the daemon goes on with the config it has."""


SOURCE_KINDS = ("obsidian", "folder")

# table -> key -> (type, default), derived from the settings. A default of None means
# "computed" (the registry's prefixes).
SCHEMA: dict[str, dict[str, tuple[type, Any]]] = {}
for _s in SETTINGS:
    SCHEMA.setdefault(_s.section, {})[_s.key] = (_s.type, _s.default)
SOURCE_SCHEMA: dict[str, tuple[type, Any]] = {k.key: (k.type, k.default) for k in SOURCE_KEYS}
DEFAULT_INCLUDE = {
    "obsidian": ["**/*.md"],
    "folder": ["**/*.md", "**/*.markdown", "**/*.txt", "**/*.rst", "**/*.pdf"],
}


@dataclass(frozen=True)
class Source:
    name: str
    root: Path
    kind: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]


class _ConfigMethods:
    """What a Config says beyond its fields (its paths, its sources)."""

    def pooling_for(self, role: str) -> str | None:
        return {"embedding": self.embedding_pooling,
                "reranker": self.reranker_pooling}.get(role) or None

    @property
    def db_path(self) -> Path:
        return self.data_dir / "index.sqlite3"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "ragd.log"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "ragd.lock"

    def source(self, name: str) -> Source | None:
        return next((s for s in self.sources if s.name == name), None)

    def named(self, name: str) -> Source | None:
        """The source a user means by `name`: the one of that name, else the one whose name
        differs only in case ("notes" for "Notes"; not when two do)."""
        exact = self.source(name)
        if exact is not None:
            return exact
        folded = [s for s in self.sources if s.name.casefold() == name.casefold()]
        return folded[0] if len(folded) == 1 else None

    @property
    def overlaps(self) -> list[str]:
        """A source whose folder is inside another's: a file both include is indexed, and
        found, twice. Not an error (notes in one, PDFs in the other is fine), but said
        (`ragctl sources add` refuses it)."""
        roots = [(s, Path(os.path.realpath(s.root))) for s in self.sources]
        return [f"source {a.name!r} ({a.root}) is inside source {b.name!r}: a file both include "
                f"is indexed, and found, twice (exclude it from {b.name!r}, or remove one)"
                for a, ra in roots for b, rb in roots
                if a is not b and ra.is_relative_to(rb) and (ra != rb or a.name > b.name)]


def _field_type(s: Setting):
    if s.field in ("data_dir", "socket"):  # "" in the file: resolved to a path
        return Path
    return s.type if s.default is not None else s.type | None


# The settings' fields (see ragd/settings.py for each one's key, default and doc), the file it
# was read from, and its sources. Only from_dict builds one; a reload, dataclasses.replace.
Config = dataclasses.make_dataclass(
    "Config",
    [("path", Path | None), *[(s.field, _field_type(s)) for s in SETTINGS],
     ("sources", tuple[Source, ...], dataclasses.field(default=())),
     # Does the file say which sources there are (`[[sources]]` tables, or `sources = []`)? A
     # file that says nothing of them (empty, cut short) is no reason to remove them all.
     ("sources_listed", bool, dataclasses.field(default=False))],
    bases=(_ConfigMethods,), frozen=True, kw_only=True,
    namespace={"__doc__": "A checked configuration, immutable (ragd/settings.py declares "
                          "its fields)."})
Config.__module__ = __name__  # (make_dataclass takes a module= only from Python 3.12)


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "a list", dict: "a table"}


def _type_name(value: Any) -> str:
    return {str: "string", int: "integer", float: "float", bool: "boolean", list: "list",
            dict: "table"}.get(type(value), type(value).__name__)


def _type_problem(key: str, value: Any, expected) -> str | None:
    """Why a value is not of its setting's type, or None."""
    # bool is a subclass of int; a config saying `chunk_tokens = true` is a mistake. An integer
    # is a fine float.
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return None
    ok = isinstance(value, expected) and not (expected in (int, float) and isinstance(value, bool))
    return None if ok else (f"{key} must be {_TYPE_NAMES.get(expected, expected)}, "
                            f"got {_type_name(value)} {value!r}")


def _check(where: str, key: str, value: Any, expected) -> None:
    if (why := _type_problem(key, value, expected)):
        raise ConfigError(f"{where}: {why}")


def load(cli_path: str | os.PathLike | None = None, env=os.environ,
         extra_sources: list[str] | None = None) -> Config:
    """Find, read and check the configuration (see :func:`protocol.find_config`)."""
    path = protocol.find_config(cli_path, env)
    raw: dict = {}
    if path is not None:
        if (why := protocol.not_a_file(path)):
            raise ConfigError(why)
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except UnicodeDecodeError as e:  # (tomllib reads UTF-8 only)
            raise ConfigError(f"{path}: not valid TOML: {protocol.not_utf8(e)}") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    return from_dict(raw, path, env, extra_sources or [])


def from_dict(raw: dict, path: Path | None, env=os.environ, extra_sources=()) -> Config:
    """The checked Config of a parsed file. Every problem is named, not only the first: a
    user fixing a config (or a reload refused) learns all there is to fix at once."""
    where = str(path) if path else "built-in defaults"
    problems: list[str] = []

    def check(fn, *args):  # a check that raises ConfigError: its problem noted, None returned
        try:
            return fn(*args)
        except ConfigError as e:
            problems.append(str(e).removeprefix(f"{where}: "))
            return None

    for key in raw:
        if key not in SCHEMA and key != "sources":
            problems.append(f"unknown key '{key}' (known: "
                            f"{', '.join(sorted([*SCHEMA, 'sources']))})")
    tables: dict[str, dict] = {}
    for table, keys in SCHEMA.items():
        given = raw.get(table, {})
        if (why := _type_problem(table, given, dict)):
            problems.append(why)
            given = {}
        tables[table] = given
        for key in given:
            if key not in keys:
                problems.append(f"unknown key '{table}.{key}' (known: "
                                f"{', '.join(f'{table}.{k}' for k in keys)})")
    # field -> value; types first, for every key, then each setting's choices and bounds (a
    # value of the wrong type is checked no further: the default stands in for it meanwhile)
    values: dict[str, Any] = {}
    wrong: set[str] = set()
    for s in SETTINGS:
        value = tables[s.section].get(s.key, s.default)
        if value is not None:  # None: absent and computed later (e.g. registry prefixes)
            if (why := _type_problem(s.name, value, s.type)):
                problems.append(why)
                wrong.add(s.field)
                value = s.default
            elif s.type is float:
                value = float(value)
        values[s.field] = value
    for s in SETTINGS:
        if s.field not in wrong and values[s.field] is not None and (
                why := s.problem(values[s.field])):
            problems.append(why)
            wrong.add(s.field)
    v = values
    data_dir, sock = protocol.resolve_paths({"data_dir": v["data_dir"], "socket": v["socket"]},
                                            env)
    if len(os.fsencode(sock)) > 100:
        problems.append(f"daemon.socket: path {sock} is too long for a Unix socket "
                        f"(at most 100 bytes); set a shorter one")

    raw_sources = raw.get("sources", [])
    if (why := _type_problem("sources", raw_sources, list)):
        problems.append(why)
        raw_sources = []
    sources = [s for s in (check(_source, where, i, s) for i, s in enumerate(raw_sources))
               if s is not None]
    for i, p in enumerate(extra_sources):
        if (s := check(_source_from_cli, where, p, i)) is not None:
            sources.append(s)
    seen: set[str] = set()
    folders: dict[str, Source] = {}
    for s in sources:
        if s.name in seen:
            problems.append(f"two sources are named {s.name!r}; names must be unique")
        seen.add(s.name)
        # one folder, one source: two would index every file twice, and every search would
        # show each note twice (a folder's files of two kinds: one source, its include)
        other = folders.setdefault(os.path.realpath(s.root), s)
        if other is not s:
            problems.append(f"sources {other.name!r} and {s.name!r} are the same folder "
                            f"({s.root}); a folder is one source (its include and exclude "
                            f"choose its files)")

    if v["llama_server"] and "llama_server" not in wrong:
        check(_existing_file, where, "engines.llama_server", v["llama_server"])
    collection = v["store_collection"]
    if not collection.replace("_", "").isalnum() or not collection[:1].isalpha():
        problems.append(f"store.collection must be letters, digits and _, starting with a "
                        f"letter; got {collection!r}")
    if not {"generator_max_tokens", "generator_context"} & wrong and \
            v["generator_max_tokens"] >= v["generator_context"]:
        problems.append(f"generator.max_tokens ({v['generator_max_tokens']}) must be smaller "
                        f"than generator.context ({v['generator_context']}): the prompt needs "
                        f"room too")
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    v.update(data_dir=data_dir, socket=sock,
             chunk_tokens=v["chunk_tokens"] or _auto_budget(v["embedding_model"]))
    return Config(path=path, **v, sources=tuple(sources), sources_listed="sources" in raw)


def _auto_budget(model: str) -> int:
    """Chunk budget fitted to the embedding model: half its context (room for the header and
    the estimate's error), between 128 and 512 tokens; 256 without a registry model."""
    from ragd.engines.models import REGISTRY  # late: config must not pull in the engines
    spec = REGISTRY.get(model)
    return max(128, min(512, spec.context // 2)) if spec else 256


def _source(where: str, i: int, s: Any) -> Source:
    label = f"sources[{i}]"
    _check(where, label, s, dict)
    for key in s:
        if key not in SOURCE_SCHEMA:
            raise ConfigError(f"{where}: unknown key '{label}.{key}' (known: "
                              f"{', '.join(SOURCE_SCHEMA)})")
    for key in ("name", "path"):
        if key not in s:
            raise ConfigError(f"{where}: {label} needs a '{key}'")
    for key, (typ, _) in SOURCE_SCHEMA.items():
        if key in s:
            _check(where, f"{label}.{key}", s[key], typ)
    name = s["name"].strip()
    if not name or "/" in name:
        raise ConfigError(f"{where}: {label}.name must be a non-empty name without '/', "
                          f"got {s['name']!r}")
    kind = s.get("kind", "folder")
    if kind not in SOURCE_KINDS:
        raise ConfigError(f"{where}: {label}.kind must be one of {', '.join(SOURCE_KINDS)}, "
                          f"got {kind!r}")
    include = s.get("include") or DEFAULT_INCLUDE[kind]
    exclude = s.get("exclude", [])
    for key, globs in (("include", include), ("exclude", exclude)):
        for g in globs:
            if not isinstance(g, str) or not g:
                raise ConfigError(f"{where}: {label}.{key} must be a list of glob strings, "
                                  f"got {g!r}")
    # a folder that is not there (yet) is not an error: an unmounted disk at login must not
    # stop the daemon; the watcher reports the source and watches it once the folder exists
    root = _existing_dir(where, f"{label}.path", s["path"], missing_ok=True)
    return Source(name=name, root=root, kind=kind, include=tuple(include), exclude=tuple(exclude))


def _source_from_cli(where: str, path: str, i: int) -> Source:
    root = _existing_dir("--source", "path", str(Path(path).expanduser().absolute()))
    kind = "obsidian" if (root / ".obsidian").is_dir() else "folder"
    return Source(name=root.name or f"source{i}", root=root, kind=kind,
                  include=tuple(DEFAULT_INCLUDE[kind]), exclude=())


def _existing_file(where: str, key: str, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"{where}: {key}: {path} does not exist")
    if not os.access(path, os.X_OK):
        raise ConfigError(f"{where}: {key}: {path} is not executable")
    return path


def _existing_dir(where: str, key: str, value: str, missing_ok: bool = False) -> Path:
    root = Path(value).expanduser()
    if not root.is_absolute():
        raise ConfigError(f"{where}: {key}: {value!r} must be an absolute path (or start with ~)")
    if not root.exists():
        if missing_ok:
            return root.resolve()
        raise ConfigError(f"{where}: {key}: folder {root} does not exist")
    if not root.is_dir():
        raise ConfigError(f"{where}: {key}: {root} is not a folder")
    return root.resolve()
