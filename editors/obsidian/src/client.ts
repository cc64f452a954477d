// A client of ragd over its Unix socket, speaking JSON lines (docs/protocol.md): one
// long-lived connection that reconnects by itself, requests matched to replies by id, and
// streams on connections of their own. Node's `net` only: no Obsidian API here, so the tests
// run it against the real daemon.

import { createConnection, Socket } from "net";

/** ragd's error codes (docs/protocol.md), and these from the client side. */
export const NOT_RUNNING = "not_running"; // no socket, or nothing accepts on it
export const TIMEOUT = "timeout"; // no reply in time
export const DISCONNECTED = "disconnected"; // the connection closed before the reply
export const IO = "io"; // any other socket error (permission denied, ...)

/** ragd's frame limit: no line may be longer. */
export const MAX_LINE = 8 * 1024 * 1024;

export class RagdError extends Error {
	constructor(readonly code: string, message: string) {
		super(message);
		this.name = "RagdError";
	}
}

/** A one-line message for a person. */
export function errorMessage(e: unknown): string {
	if (e instanceof RagdError) {
		if ([NOT_RUNNING, TIMEOUT, DISCONNECTED, IO].includes(e.code)) return e.message;
		return `${e.message} (${e.code})`;
	}
	return e instanceof Error ? e.message : String(e);
}

/** Splits a byte stream into lines. Lines are decoded only once whole, so a character split
 * across two reads is never broken. */
export class LineDecoder {
	private parts: Buffer[] = [];
	private size = 0;

	push(data: Buffer): string[] {
		const lines: string[] = [];
		let start = 0;
		for (let nl = data.indexOf(10); nl !== -1; nl = data.indexOf(10, start)) {
			this.parts.push(data.subarray(start, nl));
			lines.push(Buffer.concat(this.parts).toString("utf8"));
			this.parts = [];
			this.size = 0;
			start = nl + 1;
		}
		if (start < data.length) {
			this.parts.push(data.subarray(start));
			this.size += data.length - start;
			if (this.size > MAX_LINE) {
				this.parts = [];
				this.size = 0;
				throw new RagdError("frame_too_large", `a reply line over ${MAX_LINE} bytes`);
			}
		}
		return lines.filter((l) => l.trim() !== "");
	}
}

export function encodeRequest(id: number, op: string, args?: Record<string, unknown>): string {
	const msg: Record<string, unknown> = { id, op };
	if (args && Object.keys(args).length) msg.args = args;
	return JSON.stringify(msg) + "\n";
}

export interface RequestOptions {
	timeoutMs?: number;
	/** For streams: each reply before the final one. */
	onPartial?: (result: unknown) => void;
}

interface Pending {
	op: string;
	resolve: (v: unknown) => void;
	reject: (e: RagdError) => void;
	timer?: ReturnType<typeof setTimeout>;
	onPartial?: (result: unknown) => void;
}

function connectError(path: string, err: NodeJS.ErrnoException): RagdError {
	if (err.code === "ENOENT" || err.code === "ECONNREFUSED" || err.code === "ENOTSOCK") {
		return new RagdError(NOT_RUNNING, `ragd is not running (no daemon at ${path})`);
	}
	return new RagdError(IO, `cannot connect to ragd at ${path}: ${err.message}`);
}

/** One connection. Replies come in request order, but are matched by id all the same. */
export class Connection {
	private socket: Socket | null = null;
	private decoder = new LineDecoder();
	private pending = new Map<number, Pending>();
	private nextId = 0;
	private closedWith: RagdError | null = null;
	private closeListeners: ((e: RagdError) => void)[] = [];

	constructor(readonly path: string, private defaultTimeoutMs = 10000) {}

	open(): Promise<void> {
		return new Promise((resolve, reject) => {
			const sock = createConnection({ path: this.path });
			this.socket = sock;
			let opened = false;
			sock.once("connect", () => {
				opened = true;
				resolve();
			});
			sock.on("data", (data: Buffer) => {
				let lines: string[];
				try {
					lines = this.decoder.push(data);
				} catch (e) {
					this.fail(e as RagdError);
					return;
				}
				for (const line of lines) this.dispatch(line);
			});
			sock.on("error", (err: NodeJS.ErrnoException) => {
				const e = opened ? new RagdError(DISCONNECTED,
					`lost the connection to ragd (${err.message})`) : connectError(this.path, err);
				if (!opened) reject(e);
				this.fail(e);
			});
			sock.on("close", () => {
				this.fail(new RagdError(DISCONNECTED,
					"ragd closed the connection; is it still running?"));
			});
		});
	}

	get closed(): boolean {
		return this.closedWith !== null;
	}

	onClose(fn: (e: RagdError) => void): void {
		this.closeListeners.push(fn);
	}

	private dispatch(line: string): void {
		let msg: { id?: unknown; result?: unknown; error?: { code?: string; message?: string };
			final?: boolean };
		try {
			msg = JSON.parse(line) as typeof msg;
		} catch {
			return; // not ours to fix; the request it answered times out
		}
		const p = typeof msg.id === "number" ? this.pending.get(msg.id) : undefined;
		if (!p) return; // a reply to a request that timed out, or id null
		if (msg.final === false && !msg.error) {
			p.onPartial?.(msg.result);
			return;
		}
		this.pending.delete(msg.id as number);
		if (p.timer) clearTimeout(p.timer);
		if (msg.error) {
			p.reject(new RagdError(msg.error.code ?? "internal", msg.error.message ?? ""));
		} else {
			p.resolve(msg.result);
		}
	}

	private fail(e: RagdError): void {
		if (this.closedWith) return;
		this.closedWith = e;
		this.socket?.destroy();
		const pending = [...this.pending.values()];
		this.pending.clear();
		for (const p of pending) {
			if (p.timer) clearTimeout(p.timer);
			p.reject(e);
		}
		for (const fn of this.closeListeners) fn(e);
	}

	request(op: string, args?: Record<string, unknown>, opts: RequestOptions = {}): Promise<unknown> {
		if (this.closedWith || !this.socket) {
			return Promise.reject(this.closedWith ?? new RagdError(DISCONNECTED, "not connected"));
		}
		const id = ++this.nextId;
		return new Promise((resolve, reject) => {
			const p: Pending = { op, resolve, reject, onPartial: opts.onPartial };
			const timeout = opts.timeoutMs ?? this.defaultTimeoutMs;
			if (timeout > 0) {
				p.timer = setTimeout(() => {
					if (this.pending.get(id) === p) {
						this.pending.delete(id);
						reject(new RagdError(TIMEOUT, `${op}: no answer from ragd within ${timeout} ms`));
					}
				}, timeout);
			}
			this.pending.set(id, p);
			this.socket!.write(encodeRequest(id, op, args));
		});
	}

	close(): void {
		this.fail(new RagdError(DISCONNECTED, "connection closed by the plugin"));
	}
}

export type State = "idle" | "connecting" | "up" | "down";

export interface ClientOptions {
	/** Called at each (re)connect, so a changed setting takes effect. */
	socketPath: () => string;
	timeoutMs?: number;
	retryMinMs?: number;
	retryMaxMs?: number;
}

/** The plugin's connection to ragd: kept open (buffers pushed on it live as long as it does),
 * reconnected with a growing delay when ragd goes away. State changes are announced; a notice
 * is due once per outage, not at every retry. */
export class RagdClient {
	state: State = "idle";
	lastError: RagdError | null = null;
	private conn: Connection | null = null;
	private connecting: Promise<Connection> | null = null;
	private keep = false;
	private retryTimer: ReturnType<typeof setTimeout> | null = null;
	private delay = 0;
	private noticed = false;
	private stateListeners: ((s: State, e: RagdError | null) => void)[] = [];
	private noticeListeners: ((msg: string) => void)[] = [];
	private streams = new Set<Connection>();

	constructor(private opts: ClientOptions) {}

	get path(): string {
		return this.opts.socketPath();
	}

	onState(fn: (s: State, e: RagdError | null) => void): void {
		this.stateListeners.push(fn);
	}

	/** fn(message) once when ragd turns out not to be reachable, then not again until it was
	 * reached. */
	onNotice(fn: (msg: string) => void): void {
		this.noticeListeners.push(fn);
	}

	private setState(s: State, e: RagdError | null = null): void {
		this.lastError = e;
		if (s === "up") {
			this.noticed = false;
			this.delay = 0;
		}
		if (s === "down" && !this.noticed && e) {
			this.noticed = true;
			for (const fn of this.noticeListeners) fn(`${errorMessage(e)}; retrying in the background`);
		}
		if (s === this.state) return;
		this.state = s;
		for (const fn of this.stateListeners) fn(s, e);
	}

	/** Connect now and stay connected, reconnecting as needed, until stop(). */
	start(): void {
		this.keep = true;
		this.connection().catch(() => undefined);
	}

	stop(): void {
		this.keep = false;
		if (this.retryTimer) clearTimeout(this.retryTimer);
		this.retryTimer = null;
		// let go of it before closing it: its close handler took the plugin's own close for
		// ragd gone ("retrying in the background", at every settings edit and on disable)
		const conn = this.conn;
		this.conn = null;
		conn?.close();
		for (const s of this.streams) s.close();
		this.streams.clear();
		this.setState("idle");
	}

	/** Drop the connection and make a new one (e.g. the socket setting changed). */
	restart(): void {
		const keep = this.keep;
		this.stop();
		if (keep) this.start();
	}

	private scheduleRetry(): void {
		if (!this.keep || this.retryTimer) return;
		const min = this.opts.retryMinMs ?? 1000;
		this.delay = Math.min(Math.max(this.delay * 2, min), this.opts.retryMaxMs ?? 30000);
		this.retryTimer = setTimeout(() => {
			this.retryTimer = null;
			this.connection().catch(() => undefined);
		}, this.delay);
	}

	/** The open connection, connecting first if need be. */
	connection(): Promise<Connection> {
		if (this.conn && !this.conn.closed) return Promise.resolve(this.conn);
		if (this.connecting) return this.connecting;
		const conn = new Connection(this.path, this.opts.timeoutMs);
		this.setState("connecting", this.lastError);
		this.connecting = conn.open().then(() => {
			this.connecting = null;
			this.conn = conn;
			conn.onClose((e) => {
				if (this.conn !== conn) return;
				this.conn = null;
				this.setState("down", e);
				this.scheduleRetry();
			});
			this.setState("up");
			return conn;
		}, (e: RagdError) => {
			this.connecting = null;
			this.setState("down", e);
			this.scheduleRetry();
			throw e;
		});
		return this.connecting;
	}

	async request<T = unknown>(op: string, args?: Record<string, unknown>,
		opts?: RequestOptions): Promise<T> {
		const conn = await this.connection();
		return (await conn.request(op, args, opts)) as T;
	}

	/** A streaming op (events) on a connection of its own: onReply for each reply until the
	 * stream ends or close() is called. `done` settles when it ends (rejects on an error). */
	stream(op: string, args: Record<string, unknown> | undefined,
		onReply: (result: unknown) => void): { close: () => void; done: Promise<unknown> } {
		const conn = new Connection(this.path, 0);
		this.streams.add(conn);
		const done = conn.open()
			.then(() => conn.request(op, args, { timeoutMs: 0, onPartial: onReply }))
			.finally(() => {
				this.streams.delete(conn);
				conn.close();
			});
		return { close: () => conn.close(), done };
	}
}
