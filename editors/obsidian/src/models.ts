// What the related pane, the search modal and the status bar show for given replies of ragd.
// Pure functions: no Obsidian API, no socket; the tests feed them the daemon's real replies.
// Both result shapes are handled (docs/protocol.md): chunk-level results, and note-level ones
// with title, more, chunks, match_lines and unsaved.

import { DISCONNECTED, IO, NOT_RUNNING, RagdError, TIMEOUT, errorMessage } from "./client";

export interface Result {
	path: string;
	source?: string;
	line_start?: number;
	line_end?: number;
	heading?: string;
	score?: number;
	text?: string;
	stale?: boolean;
	title?: string;
	more?: number;
	match_lines?: number[];
	unsaved?: boolean;
	chunks?: { line_start: number; line_end: number; heading?: string; score?: number }[];
	link?: { from?: { line_start: number; line_end: number }; to?: { line_start: number; line_end: number } };
}

export interface Reply {
	results?: Result[];
	reason?: string;
	degraded?: boolean;
	mode?: string;
	elapsed_ms?: number;
	below_threshold?: boolean;
}

export interface Line {
	line: number;
	text: string;
}

export interface Item {
	title: string;
	/** The heading path below the title ("H1 > H2"), "" at the top of the note. */
	headingPath: string;
	/** The lines to show: those holding the query's terms when ragd says which, else the first
	 * lines of the passage. */
	lines: Line[];
	path: string;
	/** The path inside the vault, when the result is in it (else null: another source). */
	vaultPath: string | null;
	/** The line to open at (1-based). */
	line: number;
	more: number;
	unsaved: boolean;
	stale: boolean;
}

export interface ListView {
	items: Item[];
	/** Said above the list (degraded search) or instead of it (nothing, an error). */
	message: string | null;
}

const SHOWN_LINES = 3;

function basename(path: string): string {
	const parts = path.replace(/\/+$/, "").split("/");
	return parts[parts.length - 1] ?? path;
}

export function titleOf(r: Result): string {
	if (r.title) return r.title;
	return basename(r.path).replace(/\.md$/i, "");
}

export function lineOf(r: Result): number {
	if (r.match_lines && typeof r.match_lines[0] === "number") return r.match_lines[0];
	if (r.link?.to && typeof r.link.to.line_start === "number") return r.link.to.line_start;
	return r.line_start ?? 1;
}

function headingBelowTitle(heading: string | undefined, title: string): string {
	if (!heading) return "";
	const parts = heading.split(" > ");
	// The heading path starts with the note's title (docs/protocol.md); the title is shown
	// apart, so it is not repeated.
	if (parts[0] === title) parts.shift();
	return parts.join(" > ");
}

function clip(s: string, n = 200): string {
	const t = s.trim().replace(/\s+/g, " ");
	return t.length > n ? t.slice(0, n - 1) + "…" : t;
}

function shownLines(r: Result): Line[] {
	const text = r.text ?? "";
	const start = r.line_start ?? 1;
	const lines = text.split("\n");
	const at = (n: number): Line | null => {
		const t = lines[n - start];
		return t !== undefined && t.trim() ? { line: n, text: clip(t) } : null;
	};
	let wanted: number[] = [];
	if (r.match_lines?.length) wanted = r.match_lines;
	else if (r.link?.to) {
		for (let n = r.link.to.line_start; n <= r.link.to.line_end; n++) wanted.push(n);
	}
	const out: Line[] = [];
	for (const n of wanted) {
		const l = at(n);
		if (l) out.push(l);
		if (out.length === SHOWN_LINES) return out;
	}
	if (out.length) return out;
	for (let i = 0; i < lines.length && out.length < SHOWN_LINES; i++) {
		const l = at(start + i);
		if (l && !/^#+\s/.test(l.text)) out.push(l);
	}
	return out;
}

export function vaultPathOf(path: string, vaultRoot: string | null): string | null {
	if (!vaultRoot) return null;
	const root = vaultRoot.replace(/\/+$/, "") + "/";
	return path.startsWith(root) ? path.slice(root.length) : null;
}

export function item(r: Result, vaultRoot: string | null): Item {
	const title = titleOf(r);
	return {
		title,
		headingPath: headingBelowTitle(r.heading, title),
		lines: shownLines(r),
		path: r.path,
		vaultPath: vaultPathOf(r.path, vaultRoot),
		line: lineOf(r),
		more: typeof r.more === "number" ? r.more : 0,
		unsaved: r.unsaved === true,
		stale: r.stale === true,
	};
}

function items(reply: Reply, vaultRoot: string | null): Item[] {
	return (reply.results ?? []).filter((r) => r && typeof r.path === "string")
		.map((r) => item(r, vaultRoot));
}

/** What to say for an error, in a pane or a modal. */
export function errorText(e: unknown, op: string): string {
	if (e instanceof RagdError) {
		switch (e.code) {
			case NOT_RUNNING: return "ragd is not running. Start it with `ragctl start`.";
			case TIMEOUT: return "ragd did not answer in time; it may be busy.";
			case DISCONNECTED:
			case IO: return errorMessage(e);
			case "unknown_op": return `This version of ragd cannot do ${op} yet: update ragd.`;
			case "unavailable": return `ragd cannot do ${op} right now: ${errorMessage(e)}`;
		}
	}
	return `ragd: ${errorMessage(e)}`;
}

/** What to say for no results: `lead`, then the daemon's reason when it gives one. Its
 * "nothing relevant: ..." says what a lead would, so it stands alone, as a sentence. */
function nothing(lead: string, reason: unknown): string {
	const why = typeof reason === "string" ? reason.trim() : "";
	if (!why) return `${lead}.`;
	if (/^nothing relevant\b/i.test(why)) return why[0]!.toUpperCase() + why.slice(1);
	return `${lead}: ${why}`;
}

export function searchView(query: string, reply: Reply | null, error: unknown,
	vaultRoot: string | null): ListView {
	if (error) return { items: [], message: errorText(error, "this search") };
	if (!query.trim()) return { items: [], message: null };
	const list = reply ? items(reply, vaultRoot) : [];
	if (!list.length) {
		return { items: [], message: nothing("Nothing found", reply?.reason) };
	}
	const message = reply?.degraded ? "Keyword search only: the embedding engine is not ready." : null;
	return { items: list, message };
}

export function relatedView(reply: Reply | null, error: unknown, vaultRoot: string | null,
	noteName: string | null): ListView {
	if (noteName === null) return { items: [], message: "Open a note to see its related notes." };
	if (error) {
		if (error instanceof RagdError && error.code === "not_found") {
			return { items: [], message: "This note is not in any of ragd's sources." };
		}
		return { items: [], message: errorText(error, "related notes") };
	}
	const list = reply ? items(reply, vaultRoot) : [];
	return { items: list, message: list.length ? null : nothing("No related notes", reply?.reason) };
}

// ---------------------------------------------------------------------------------------------
// The status bar

export interface Status {
	pending?: number;
	idle?: boolean;
	indexer?: string;
	sources?: { files?: number; chunks?: number; scanning?: boolean }[];
	engines?: { embedding?: { state?: string; reason?: string | null; vectors?: number;
		pending_texts?: number | null; embedder?: string } };
}

export interface StatusView {
	text: string;
	/** More detail, for the item's tooltip. */
	title: string;
	state: "ok" | "busy" | "degraded" | "down";
}

export function statusView(st: Status | null, error: unknown): StatusView {
	if (error || !st) {
		const e = error instanceof RagdError ? error : null;
		if (!e || e.code === NOT_RUNNING || e.code === DISCONNECTED) {
			return { text: "ragd: not running", title: e ? errorMessage(e) : "ragd is not running",
				state: "down" };
		}
		return { text: "ragd: unreachable", title: errorMessage(e), state: "down" };
	}
	const files = (st.sources ?? []).reduce((n, s) => n + (s.files ?? 0), 0);
	const chunks = (st.sources ?? []).reduce((n, s) => n + (s.chunks ?? 0), 0);
	const detail = [`${files} files, ${chunks} chunks`];
	const parts: string[] = [];
	let state: StatusView["state"] = "ok";
	const pending = st.pending ?? 0;
	if (pending > 0 || st.indexer === "indexing" || (st.sources ?? []).some((s) => s.scanning)) {
		parts.push(`indexing ${pending}`);
		state = "busy";
	}
	const e = st.engines?.embedding;
	if (e) {
		if (e.state !== "ready") {
			parts.push("degraded");
			detail.push(`embedding engine ${e.state}${e.reason ? `: ${e.reason.split("\n")[0]}` : ""}; ` +
				"keyword search only");
			state = "degraded";
		} else if (typeof e.pending_texts === "number" && e.pending_texts > 0) {
			const done = e.vectors ?? 0;
			parts.push(`embedding ${Math.floor((100 * done) / (done + e.pending_texts))}%`);
			if (state === "ok") state = "busy";
		}
	}
	if (st.indexer?.startsWith("paused")) {
		parts.push("paused");
		detail.push(st.indexer);
		state = "degraded";
	}
	return { text: parts.length ? `ragd: ${parts.join(", ")}` : "ragd ✓", title: detail.join("; "), state };
}
