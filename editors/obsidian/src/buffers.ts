// The editor's text, pushed to ragd (buffer_set) while it differs from the saved note, so that
// search and related notes see what is on screen; dropped (buffer_drop) once saved or closed.
// ragd keeps a buffer only while the connection that pushed it is open: after a reconnect,
// every buffer still held is pushed again.

import { DISCONNECTED, IO, NOT_RUNNING, RagdClient, RagdError, TIMEOUT } from "./client";

/** Larger texts are not pushed: far above any note, and a JSON line must stay under ragd's
 * 8 MiB frame limit whatever the escaping. */
export const MAX_BYTES = 2 * 1024 * 1024;

export interface BufferState {
	path: string;
	version: number;
	/** The version ragd has, 0 for none. */
	pushedVersion: number;
	chunks?: number;
	/** Why this note is not pushed (not in a source, too large); cleared when saved. */
	skip?: string;
	error?: RagdError;
	text: string;
}

export interface BufferSyncOptions {
	debounceMs?: number;
	/** After each push (successful or not), e.g. to refresh the related pane. */
	onPushed?: (path: string, state: BufferState) => void;
	/** Once per connection when ragd has no buffer_set op. */
	onUnsupported?: (message: string) => void;
}

export class BufferSync {
	private buffers = new Map<string, BufferState>();
	private timers = new Map<string, ReturnType<typeof setTimeout>>();
	private unsupported = false;
	private wasDown = false;

	constructor(private client: RagdClient, private opts: BufferSyncOptions = {}) {
		client.onState((s) => {
			if (s === "down") {
				this.wasDown = true;
				for (const b of this.buffers.values()) b.pushedVersion = 0;
			} else if (s === "up" && this.wasDown) {
				this.wasDown = false;
				this.unsupported = false;
				for (const b of this.buffers.values()) if (!b.skip) void this.send(b);
			}
		});
	}

	state(path: string): BufferState | undefined {
		return this.buffers.get(path);
	}

	/** The editor's text changed: push it once it has been quiet for debounceMs. */
	changed(path: string, text: string): void {
		const b = this.buffers.get(path) ?? { path, version: 0, pushedVersion: 0, text };
		b.text = text;
		b.version += 1;
		this.buffers.set(path, b);
		if (b.skip) return;
		const old = this.timers.get(path);
		if (old) clearTimeout(old);
		this.timers.set(path, setTimeout(() => {
			this.timers.delete(path);
			void this.send(b);
		}, this.opts.debounceMs ?? 300));
	}

	/** Push now what a pending debounce would push later. */
	async flush(path: string): Promise<BufferState | undefined> {
		const t = this.timers.get(path);
		if (t) {
			clearTimeout(t);
			this.timers.delete(path);
		}
		const b = this.buffers.get(path);
		if (b && !b.skip && b.pushedVersion !== b.version) await this.send(b);
		return b;
	}

	private async send(b: BufferState): Promise<void> {
		if (this.unsupported || b.skip) return;
		if (Buffer.byteLength(b.text) > MAX_BYTES) {
			b.skip = `larger than ${MAX_BYTES} bytes`;
			return;
		}
		const version = b.version;
		try {
			const res = await this.client.request<{ chunks?: number }>("buffer_set",
				{ path: b.path, text: b.text, version });
			if (this.buffers.get(b.path) !== b) {
				// closed meanwhile: take it back
				await this.client.request("buffer_drop", { path: b.path }).catch(() => undefined);
				return;
			}
			b.pushedVersion = Math.max(b.pushedVersion, version);
			b.chunks = res?.chunks;
			b.error = undefined;
		} catch (e) {
			const err = e as RagdError;
			b.error = err;
			if (err.code === "unknown_op") {
				this.unsupported = true;
				this.opts.onUnsupported?.("This version of ragd cannot take unsaved text (no " +
					"buffer_set op); searches see saved notes only. Update ragd.");
			} else if (err.code === "not_found" || err.code === "bad_args" || err.code === "forbidden") {
				b.skip = err.message;
			} else if (![NOT_RUNNING, DISCONNECTED, TIMEOUT, IO].includes(err.code)) {
				// unavailable (too many buffers), shutting_down, internal: the next change retries
			}
		}
		this.opts.onPushed?.(b.path, b);
	}

	/** Saved: ragd reads the note from disk again; the next change pushes it anew. A change
	 * made after the save and still waiting for its push is kept (its push follows). */
	async saved(path: string): Promise<void> {
		const b = this.buffers.get(path);
		if (!b || this.timers.has(path)) return;
		await this.drop(path);
	}

	/** No editor shows the note any more. */
	async drop(path: string): Promise<void> {
		const t = this.timers.get(path);
		if (t) clearTimeout(t);
		this.timers.delete(path);
		const b = this.buffers.get(path);
		this.buffers.delete(path);
		if (!b || !b.pushedVersion || this.client.state !== "up") return;
		try {
			await this.client.request("buffer_drop", { path });
		} catch {
			// ragd gone: it forgot the buffer with the connection
		}
	}

	paths(): string[] {
		return [...this.buffers.keys()];
	}

	dispose(): void {
		for (const t of this.timers.values()) clearTimeout(t);
		this.timers.clear();
		this.buffers.clear();
	}
}
