"""Configuration: the documented default file, lookup order, and clear errors."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tomllib
import sys
from pathlib import Path

import pytest

from ragd import config, protocol, settings

ROOT = Path(__file__).resolve().parents[1]


def test_documented_config_is_the_builtin_default(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    documented = config.load(ROOT / "config.toml", env=env)
    builtin = config.from_dict({}, None, env=env)
    assert documented.path is not None and builtin.path is None
    assert dataclasses.replace(documented, path=None) == builtin


def test_the_packaged_default_is_the_documented_config():
    # ragctl writes this copy as a new user's config (the package cannot read the repository)
    assert (ROOT / "ragctl" / "config.default.toml").read_text() == \
        (ROOT / "config.toml").read_text()


def test_documented_config_mentions_every_key():
    text = (ROOT / "config.toml").read_text()
    for table, keys in config.SCHEMA.items():
        assert f"[{table}]" in text
        for key, (_, default) in keys.items():
            # keys whose default is computed are documented commented out
            pattern = rf"^# {key} = " if default is None else rf"^{key} = "
            assert re.search(pattern, text, re.M), f"{table}.{key} is not documented"
    for key in config.SOURCE_SCHEMA:
        assert re.search(rf"^# {key} = ", text, re.M), f"sources.{key} is not documented"


def test_lookup_order(tmp_path):
    a, b, xdg = tmp_path / "a.toml", tmp_path / "b.toml", tmp_path / "xdg"
    (xdg / "ragd").mkdir(parents=True)
    (xdg / "ragd" / "config.toml").write_text("")
    env = {"RAGD_CONFIG": str(b), "XDG_CONFIG_HOME": str(xdg)}
    assert protocol.find_config(a, env) == a
    assert protocol.find_config(None, env) == b
    assert protocol.find_config(None, {"XDG_CONFIG_HOME": str(xdg)}) == xdg / "ragd" / "config.toml"
    assert protocol.find_config(None, {"XDG_CONFIG_HOME": str(tmp_path / "none")}) is None


def test_default_paths(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "d"), "XDG_RUNTIME_DIR": str(tmp_path / "r")}
    cfg = config.from_dict({}, None, env)
    assert cfg.data_dir == tmp_path / "d" / "ragd"
    assert cfg.socket == tmp_path / "r" / "ragd" / "ragd.sock"
    cfg = config.from_dict({}, None, {"XDG_DATA_HOME": str(tmp_path / "d")})
    assert cfg.socket == tmp_path / "d" / "ragd" / "ragd.sock"  # no runtime dir: the data dir
    cfg = config.from_dict({"daemon": {"data_dir": str(tmp_path / "x"),
                                       "socket": str(tmp_path / "s.sock")}}, None, env)
    assert (cfg.data_dir, cfg.socket) == (tmp_path / "x", tmp_path / "s.sock")
    # ragctl computes the same socket from the same file
    f = tmp_path / "c.toml"
    f.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\n')
    assert protocol.socket_path(None, f, env) == tmp_path / "s.sock"


@pytest.mark.parametrize("text, needle", [
    ("[daemon]\nsokcet = 'x'\n", "unknown key 'daemon.sokcet'"),
    ("[deamon]\n", "unknown key 'deamon'"),
    ("[daemon]\nmax_connections = 'many'\n", "daemon.max_connections must be an integer, got string"),
    ("[index]\nchunk_tokens = true\n", "index.chunk_tokens must be an integer, got boolean"),
    ("[daemon]\nlog_level = 'loud'\n", "daemon.log_level must be one of"),
    ("[search]\nk = 0\n", "search.k must be between 1 and 1000, got 0"),
    # (a fresh-user walk: k = 5000 was applied, then every search without -k failed)
    ("[search]\nk = 5000\n", "search.k must be between 1 and 1000, got 5000"),
    ("[search]\nfusion = 'sum'\n", "search.fusion must be one of 'convex', 'rrf'"),
    ("[search]\nvector_share = 1.5\n", "search.vector_share must be between 0 and 1, got 1.5"),
    ("[store]\nbackend = 'qdrant'\n", "store.backend must be one of sqlite, milvus"),
    ("[store]\ncollection = 'my notes'\n", "store.collection must be letters"),
    ("[[sources]]\nname = 'n'\n", "sources[0] needs a 'path'"),
    ("[[sources]]\nname = 'n'\npath = '/tmp'\nkind = 'vault'\n", "sources[0].kind must be one of"),
    ("[[sources]]\nname = 'n'\npath = '/tmp'\nincludes = []\n", "unknown key 'sources[0].includes'"),
    ("[[sources]]\nname = 'n'\npath = '/tmp'\n[[sources]]\nname = 'n'\npath = '/tmp'\n",
     "two sources are named 'n'"),
    ("[[sources]]\nname = 'n'\npath = 'relative/dir'\n", "must be an absolute path"),
    # one folder as two sources showed every note twice (a fresh-user walk)
    ("[[sources]]\nname = 'n'\npath = '/tmp'\n[[sources]]\nname = 'n2'\npath = '/tmp/'\n",
     "sources 'n' and 'n2' are the same folder (/tmp); a folder is one source"),
    ("this is = not toml =\n", "not valid TOML"),
    ("[generator]\ncontext = 300\n", "generator.context must be at least 512, got 300"),
    ("[generator]\ncontext = 1024\nmax_tokens = 1024\n",
     "generator.max_tokens (1024) must be smaller than generator.context (1024)"),
    ("[generator]\ntemperature = 'hot'\n", "generator.temperature must be a number"),
])
def test_config_errors_name_the_key_and_the_file(tmp_path, text, needle):
    f = tmp_path / "config.toml"
    f.write_text(text)
    with pytest.raises(config.ConfigError) as e:
        config.load(f, env={"XDG_DATA_HOME": str(tmp_path)})
    assert needle in str(e.value)
    assert str(f) in str(e.value)


def test_ragd_exits_with_the_error_at_startup(tmp_path):
    f = tmp_path / "config.toml"
    (tmp_path / "notes").mkdir()
    f.write_text(f"[daemon]\ndata_dir = '{tmp_path}/d'\n[[sources]]\nname = 'notes'\n"
                 f"path = '{tmp_path}/notes'\nkind = 'vault'\n")
    r = subprocess.run([sys.executable, "-m", "ragd", "--config", str(f)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"ragd: config error: {f}: sources[0].kind must be one of "
                                f"{', '.join(config.SOURCE_KINDS)}, got 'vault'")
    assert not (tmp_path / "d").exists()  # nothing was created


def test_a_source_folder_that_is_not_there_is_not_a_config_error(tmp_path):
    """An unmounted disk at login must not stop the daemon (the watcher reports the source
    and watches it once the folder exists: tests/test_watch.py); a --source given on the
    command line must exist."""
    f = tmp_path / "config.toml"
    f.write_text(f"[[sources]]\nname = 'n'\npath = '{tmp_path}/later'\n")
    cfg = config.load(f, env={"XDG_DATA_HOME": str(tmp_path)})
    assert cfg.sources[0].root == tmp_path / "later"
    (tmp_path / "file").write_text("")
    f.write_text(f"[[sources]]\nname = 'n'\npath = '{tmp_path}/file'\n")
    with pytest.raises(config.ConfigError, match="is not a folder"):
        config.load(f, env={"XDG_DATA_HOME": str(tmp_path)})
    f.write_text("")
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(f, env={"XDG_DATA_HOME": str(tmp_path)},
                    extra_sources=[str(tmp_path / "later")])


def test_a_source_named_by_a_user_is_found_whatever_its_case_unless_two_match(tmp_path):
    """`ragctl sources remove notes`, `--source notes` for a source named "Notes" (a fresh-user
    walk typed it so): the one name that differs only in case is meant; with two such names
    none is guessed."""
    f = tmp_path / "config.toml"
    f.write_text(f"[[sources]]\nname = 'Notes'\npath = '{tmp_path}'\n"
                 f"[[sources]]\nname = 'Work'\npath = '{tmp_path}/w'\n")
    cfg = config.load(f, env={"XDG_DATA_HOME": str(tmp_path)})
    assert cfg.named("Notes").name == "Notes" and cfg.named("NOTES").name == "Notes"
    assert cfg.named("notes").name == "Notes" and cfg.named("work").name == "Work"
    assert cfg.named("note") is None and cfg.source("notes") is None  # (ids stay exact)
    f.write_text(f.read_text() + f"[[sources]]\nname = 'notes'\npath = '{tmp_path}/n'\n")
    cfg = config.load(f, env={"XDG_DATA_HOME": str(tmp_path)})
    assert cfg.named("notes").name == "notes" and cfg.named("Notes").name == "Notes"
    assert cfg.named("NOTES") is None


def test_a_reload_names_settings_as_the_config_file_does():
    """`applied` and `restart_needed` in a reload's reply name each setting as the user wrote it
    (`search.k`, not the daemon's field `search_k`): every name is a key of the file."""
    from ragd import runtime
    for name in [*runtime.LIVE.values(), *runtime.RESTART.values()]:
        table, key = name.split(".", 1)
        assert key in config.SCHEMA.get(table, {}), name
    assert set(runtime.LIVE).isdisjoint(runtime.RESTART)


def test_the_configuration_reference_is_generated_from_the_settings():
    """docs/configuration.md is `python3 -m ragd.settings --markdown`: edited by hand, or a
    setting declared without regenerating it, and this fails."""
    r = subprocess.run([sys.executable, "-m", "ragd.settings", "--markdown"], cwd=ROOT,
                       capture_output=True, text=True, timeout=30, check=True)
    assert (ROOT / "docs" / "configuration.md").read_text() == r.stdout, \
        "run: python3 -m ragd.settings --markdown > docs/configuration.md"
    for s in settings.SETTINGS:
        assert f"| `{s.key}` |" in r.stdout, s.name


def test_config_toml_shows_exactly_the_declared_settings_with_their_defaults():
    """Every key of the documented file is declared, every declared key is in it (those
    computed when absent as a commented-out line), and each value is the declared default."""
    text = (ROOT / "config.toml").read_text()
    shown = tomllib.loads(text)
    assert shown.pop("sources", None) is None  # (examples only, commented out)
    declared = {(s.section, s.key): s for s in settings.SETTINGS}
    given = {(table, key): value for table, keys in shown.items() for key, value in keys.items()}
    computed = {name for name, s in declared.items() if s.default is None}
    assert set(given) == set(declared) - computed
    for (table, key), value in given.items():
        default = declared[table, key].default
        assert value == default and type(value) is type(default), f"{table}.{key} = {value!r}"
    for table, key in computed:
        assert re.search(rf"^# {key} = ", text, re.M), f"{table}.{key} is not shown"


def test_every_setting_is_declared_once_with_sound_bounds():
    names = [s.name for s in settings.SETTINGS]
    fields = [s.field for s in settings.SETTINGS]
    assert len(set(names)) == len(names) and len(set(fields)) == len(fields)
    for s in settings.SETTINGS:
        assert s.reload in (settings.LIVE, settings.RESTART, settings.MODEL), s.name
        assert s.doc and len(s.doc) < 200, s.name
        if s.default is not None:
            assert s.problem(s.default) is None, s.name
            assert isinstance(s.default, s.type), s.name
        if s.high is not None:
            assert s.low is not None and s.low < s.high, s.name


def test_a_config_is_immutable():
    """A reload builds a new config and swaps it in (ragd/runtime.py): none is changed in
    place while request threads read it."""
    cfg = config.from_dict({}, None, {"XDG_DATA_HOME": "/tmp/x"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.search_k = 3
    assert isinstance(cfg.sources, tuple)


def test_a_config_ragctl_writes_is_its_owners_alone_and_keeps_its_mode(tmp_path):
    """A config ragctl creates (`sources add`, `start --source`) is 0600 in a 0700 folder, as
    everything ragd writes; one the user made 0640 stays 0640 after an edit (the edit replaces
    the file: it reset a chmod 600 of a file holding a store token to 0644)."""
    import stat
    from ragctl import configfile
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    path = tmp_path / "conf" / "config.toml"
    configfile.add_source(path, tmp_path / "a", None, None)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o640)
    configfile.add_source(path, tmp_path / "b", None, None)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no temporary left


def test_a_config_error_names_every_bad_setting_not_only_the_first(tmp_path):
    # (a fresh-user walk: a reload refused for one setting, then for the next once fixed)
    f = tmp_path / "config.toml"
    f.write_text("[daemon]\nlog_level = 'loud'\nmax_connections = 'many'\n[search]\nk = 0\n"
                 "fusion = 'sum'\n[indx]\n[[sources]]\nname = 'n'\n[[sources]]\nname = 'm'\n"
                 "path = '/tmp'\nkind = 'vault'\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(f, env={"XDG_DATA_HOME": str(tmp_path)})
    text = str(e.value)
    assert text.startswith(f"{f}: ")
    for needle in ("unknown key 'indx'", "daemon.log_level must be one of",
                   "daemon.max_connections must be an integer, got string",
                   "search.k must be between 1 and 1000, got 0",
                   "search.fusion must be one of", "sources[0] needs a 'path'",
                   "sources[1].kind must be one of"):
        assert text.count(needle) == 1, (needle, text)
    assert text.count(str(f)) == 1  # the file named once, at the start


def test_sources_removed_and_added_again_leave_one_blank_line_between_tables(tmp_path):
    """`sources remove` of the last table left its blank line at the end of the file, and the
    next `sources add` put another before its own: two blank lines (a fresh-user walk)."""
    from ragctl import configfile
    for name in "abc":
        (tmp_path / name).mkdir()
    path = tmp_path / "config.toml"
    for name in "abc":
        configfile.add_source(path, tmp_path / name, None, None)
    configfile.remove_source(path, "c")
    assert path.read_text().endswith('kind = "folder"\n')
    configfile.add_source(path, tmp_path / "c", None, None)
    assert "\n\n\n" not in path.read_text()
    configfile.remove_source(path, "b")  # (one in the middle)
    text = path.read_text()
    assert "\n\n\n" not in text and text.endswith('kind = "folder"\n'), text
    assert [s["name"] for s in configfile.sources(path)] == ["a", "c"]
