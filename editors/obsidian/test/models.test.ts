// What the related pane, the search modal and the status bar show, for the daemon's real
// replies and for the note-level shape of docs/protocol.md.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { test } from "node:test";
import { NOT_RUNNING, RagdError } from "../src/client";
import { Reply, Result, Status, relatedView, searchView, statusView } from "../src/models";
import { client, env } from "./helpers";

async function call<T>(op: string, args?: Record<string, unknown>): Promise<T> {
	const c = client();
	try {
		return await c.request<T>(op, args);
	} finally {
		c.stop();
	}
}

function fileLines(path: string): string[] {
	return readFileSync(path, "utf8").split("\n");
}

test("search modal: chunk-level results", async () => {
	const reply = await call<Reply>("search", { query: "custom statuses", k: 5, group: "chunk" });
	const view = searchView("custom statuses", reply, null, env.vault);
	assert.equal(view.message, null);
	assert.equal(view.items.length, 5);
	reply.results!.forEach((r, i) => {
		const it = view.items[i]!;
		assert.equal(it.title, basename(r.path, ".md"));
		assert.equal(it.path, r.path);
		assert.equal(it.vaultPath, r.path.slice(env.vault.length + 1));
		assert.equal(it.line, r.match_lines?.[0] ?? r.line_start);
		// The heading path without the title it starts with.
		assert.equal(it.headingPath, r.heading!.split(" > ").slice(1).join(" > "));
		// The lines shown are lines of the file, with their numbers.
		const lines = fileLines(r.path);
		assert.ok(it.lines.length >= 1 && it.lines.length <= 3);
		for (const l of it.lines) {
			assert.ok(l.line >= r.line_start! && l.line <= r.line_end!);
			assert.equal(l.text, lines[l.line - 1]!.trim().replace(/\s+/g, " ").slice(0, 200));
		}
		assert.equal(it.unsaved, false);
		assert.equal(it.more, 0);
	});
});

test("search modal: note-level results (title, more, match_lines, unsaved)", async () => {
	const reply = await call<Reply>("search", { query: "custom statuses", k: 1 });
	const r = reply.results![0]!;
	const lines = fileLines(r.path);
	const matches: number[] = [];
	for (let n = r.line_start!; n <= r.line_end!; n++) {
		if (/status/i.test(lines[n - 1]!)) matches.push(n);
	}
	assert.ok(matches.length >= 1);
	const note: Result = { ...r, title: "Custom statuses, the note", more: 4, match_lines: matches, unsaved: true,
		chunks: [{ line_start: r.line_start!, line_end: r.line_end!, heading: r.heading, score: r.score }] };
	const view = searchView("custom statuses", { results: [note] }, null, env.vault);
	const it = view.items[0]!;
	assert.equal(it.title, "Custom statuses, the note");
	assert.equal(it.line, matches[0]);
	assert.deepEqual(it.lines.map((l) => l.line), matches.slice(0, 3));
	assert.equal(it.more, 4);
	assert.equal(it.unsaved, true);
});

test("search modal: nothing found, with the daemon's reason said once", async () => {
	const query = "xyzzyplugh quuxfrob";
	const none = await call<Reply>("search", { query, k: 5 });
	assert.equal(none.results!.length, 0);
	assert.match(none.reason!, /^nothing relevant: \S/);
	// (it read "Nothing relevant: nothing relevant: ...")
	assert.deepEqual(searchView(query, none, null, env.vault),
		{ items: [], message: "N" + none.reason!.slice(1) });
	const filtered = await call<Reply>("search", { query: "task", path: "Nowhere/*" });
	assert.equal(filtered.results!.length, 0);
	assert.deepEqual(searchView("task", filtered, null, env.vault),
		{ items: [], message: `Nothing found: ${filtered.reason!}` });
	assert.doesNotMatch(`Nothing found: ${filtered.reason!}`, /nothing relevant/i);
	assert.deepEqual(searchView("zzz", { results: [] }, null, env.vault),
		{ items: [], message: "Nothing found." });
});

test("search modal: degraded, errors", () => {
	const degraded = searchView("x", { degraded: true, results: [{ path: "/elsewhere/a.md", line_start: 3, text: "x" }] },
		null, env.vault);
	assert.equal(degraded.message, "Keyword search only: the embedding engine is not ready.");
	assert.equal(degraded.items[0]!.vaultPath, null);
	assert.equal(searchView("x", null, new RagdError(NOT_RUNNING, "ragd is not running (no daemon at /x)"), null).message,
		"ragd is not running. Start it with `ragctl start`.");
	assert.equal(searchView("", null, null, null).message, null);
});

test("related pane: related results, and what it says instead", () => {
	const r: Result = { path: `${env.vault}/How To/Style custom statuses.md`, line_start: 10, line_end: 14,
		heading: "Style custom statuses > Styling", score: 0.8, text: "a\nb\nthe linked line\nd\ne",
		title: "Style custom statuses", link: { from: { line_start: 3, line_end: 4 }, to: { line_start: 12, line_end: 12 } } };
	const view = relatedView({ results: [r] }, null, env.vault, "Set up custom statuses");
	assert.equal(view.message, null);
	const it = view.items[0]!;
	assert.equal(it.line, 12);
	assert.deepEqual(it.lines, [{ line: 12, text: "the linked line" }]);
	assert.equal(it.headingPath, "Styling");
	assert.equal(it.vaultPath, "How To/Style custom statuses.md");
	assert.equal(relatedView({ results: [] }, null, env.vault, "n").message, "No related notes.");
	assert.equal(relatedView({ results: [], reason: "no vectors for this note yet" }, null, env.vault, "n").message,
		"No related notes: no vectors for this note yet");
	assert.equal(relatedView(null, null, env.vault, null).message, "Open a note to see its related notes.");
	assert.equal(relatedView(null, new RagdError("not_found", "no source"), null, "n").message,
		"This note is not in any of ragd's sources.");
	assert.equal(relatedView(null, new RagdError("unknown_op", "unknown op 'related'"), null, "n").message,
		"This version of ragd cannot do related notes yet: update ragd.");
});

test("related pane: the daemon's answer to an op it lacks is shown as such", async () => {
	// Whatever this daemon knows: with `related`, a list; without, the unknown_op message.
	const c = client();
	try {
		let reply: Reply | null = null;
		let error: unknown = null;
		try {
			reply = await c.request<Reply>("related", { path: `${env.vault}/How To/Set up custom statuses.md`, k: 5 });
		} catch (e) {
			error = e;
		}
		const view = relatedView(reply, error, env.vault, "Set up custom statuses");
		if (error) {  // a BM25-only daemon: no vectors to relate notes by
			assert.equal((error as RagdError).code, "unavailable");
			assert.ok(view.message!.startsWith("ragd cannot do related notes right now: "), view.message!);
		} else {
			assert.ok(view.items.every((it) => it.vaultPath !== "How To/Set up custom statuses.md"));
		}
	} finally {
		c.stop();
	}
});

test("status bar: the daemon's real status, and each state", async () => {
	const st = await call<Status>("status");
	const files = st.sources!.reduce((n, s) => n + (s.files ?? 0), 0);
	const chunks = st.sources!.reduce((n, s) => n + (s.chunks ?? 0), 0);
	assert.deepEqual(statusView(st, null),
		{ text: "ragd ✓", title: `${files} files, ${chunks} chunks`, state: "ok" });
	assert.equal(statusView({ ...st, pending: 12, idle: false, indexer: "indexing" }, null).text, "ragd: indexing 12");
	const embedding = { state: "ready", vectors: 300, pending_texts: 100, embedder: "embedding" };
	assert.deepEqual(statusView({ ...st, engines: { embedding } }, null).text, "ragd: embedding 75%");
	const failed = statusView({ ...st, engines: { embedding: { state: "failed", reason: "exit 1\nmore" } } }, null);
	assert.equal(failed.text, "ragd: degraded");
	assert.equal(failed.state, "degraded");
	assert.match(failed.title, /embedding engine failed: exit 1; keyword search only/);
	const down = statusView(null, new RagdError(NOT_RUNNING, "ragd is not running (no daemon at /s)"));
	assert.deepEqual(down, { text: "ragd: not running", title: "ragd is not running (no daemon at /s)", state: "down" });
});
