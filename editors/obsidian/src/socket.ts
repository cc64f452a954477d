// Where ragd's socket is, found the way ragctl finds it (docs/protocol.md, "Finding the
// socket"): the plugin's setting, $RAGD_SOCKET, the [daemon] table of ragd's config file, else
// $XDG_RUNTIME_DIR/ragd/ragd.sock, else <data_dir>/ragd.sock.
// NOTE: keep in step with ragd/protocol.py socket_path() and editors/nvim/lua/ragd/socket.lua.

import { readFileSync } from "fs";
import { homedir } from "os";

export type Env = Record<string, string | undefined>;

function get(env: Env, name: string): string | undefined {
	const v = env[name];
	return v ? v : undefined;
}

function home(env: Env): string {
	return get(env, "HOME") ?? homedir();
}

function expand(p: string, env: Env): string {
	if (p === "~" || p.startsWith("~/")) return home(env) + p.slice(1);
	return p;
}

function xdg(env: Env, name: string, fallback: string): string {
	const v = get(env, name);
	return v && v.startsWith("/") ? v : `${home(env)}/${fallback}`;
}

export function configFile(env: Env): string {
	const cfg = get(env, "RAGD_CONFIG");
	if (cfg) return expand(cfg, env);
	return `${xdg(env, "XDG_CONFIG_HOME", ".config")}/ragd/config.toml`;
}

function tomlString(v: string): string | undefined {
	const basic = /^"((?:[^"\\]|\\.)*)"\s*(#.*)?$/.exec(v);
	if (basic) {
		const escapes: Record<string, string> = { n: "\n", t: "\t", '"': '"', "\\": "\\" };
		return (basic[1] ?? "").replace(/\\(.)/g, (_, c: string) => escapes[c] ?? c);
	}
	const literal = /^'([^']*)'\s*(#.*)?$/.exec(v);
	return literal ? literal[1] : undefined;
}

/** The two keys of the config's [daemon] table that decide the socket; the rest of the file is
 * ragd's business. */
export function readDaemonTable(text: string): { socket?: string; data_dir?: string } {
	const out: { socket?: string; data_dir?: string } = {};
	let inDaemon = false;
	for (const line of text.split(/\r?\n/)) {
		const header = /^\s*\[([^\]]*)\]/.exec(line);
		if (header) {
			inDaemon = (header[1] ?? "").trim() === "daemon";
			continue;
		}
		if (!inDaemon) continue;
		const kv = /^\s*([\w-]+)\s*=\s*(.*?)\s*$/.exec(line);
		if (kv && (kv[1] === "socket" || kv[1] === "data_dir")) {
			const value = tomlString(kv[2] ?? "");
			if (value !== undefined) out[kv[1]] = value;
		}
	}
	return out;
}

export function socketPath(setting: string | undefined, env: Env = process.env,
	read: (path: string) => string = (p) => readFileSync(p, "utf8")): string {
	if (setting && setting.trim()) return expand(setting.trim(), env);
	const fromEnv = get(env, "RAGD_SOCKET");
	if (fromEnv) return expand(fromEnv, env);
	let daemon: { socket?: string; data_dir?: string } = {};
	try {
		daemon = readDaemonTable(read(configFile(env)));
	} catch {
		// no config file: the defaults
	}
	if (daemon.socket) return expand(daemon.socket, env);
	const runtime = get(env, "XDG_RUNTIME_DIR");
	if (runtime && runtime.startsWith("/")) return `${runtime}/ragd/ragd.sock`;
	const dataDir = daemon.data_dir ? expand(daemon.data_dir, env)
		: `${xdg(env, "XDG_DATA_HOME", ".local/share")}/ragd`;
	return `${dataDir}/ragd.sock`;
}
