// The socket client against the real daemon: framing, requests and replies, errors, streams,
// time-outs, and what it says when ragd is not running.

import assert from "node:assert/strict";
import { appendFileSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { LineDecoder, MAX_LINE, NOT_RUNNING, RagdClient, RagdError, TIMEOUT, encodeRequest } from "../src/client";
import { client, env, sleep, until } from "./helpers";

interface SearchReply { query: string; mode: string; results: { path: string; line_start: number; heading: string }[] }

test("framing: lines split anywhere, characters cut between reads stay whole", () => {
	const d = new LineDecoder();
	const bytes = Buffer.from('{"a":"café ☕"}\n\n{"b":1}\n{"c"', "utf8");
	const out: string[] = [];
	for (let i = 0; i < bytes.length; i++) out.push(...d.push(bytes.subarray(i, i + 1)));
	assert.deepEqual(out, ['{"a":"café ☕"}', '{"b":1}']);
	assert.deepEqual(d.push(Buffer.from(":2}\n")), ['{"c":2}']);
	assert.equal(encodeRequest(3, "search", { query: "x" }), '{"id":3,"op":"search","args":{"query":"x"}}\n');
	assert.equal(encodeRequest(4, "ping"), '{"id":4,"op":"ping"}\n');
	const big = new LineDecoder();
	assert.throws(() => big.push(Buffer.alloc(MAX_LINE + 1, 0x61)), /over/);
});

test("search: the daemon's results, as ragctl gets them", async () => {
	const c = client();
	try {
		const want = env.expect.search as SearchReply;
		const got = await c.request<SearchReply>("search", { query: want.query, k: 5, mode: "bm25" });
		assert.equal(got.query, want.query);
		assert.equal(got.mode, "bm25");
		assert.deepEqual(got.results.map((r) => [r.path, r.line_start, r.heading]),
			want.results.map((r) => [r.path, r.line_start, r.heading]));
		assert.equal(c.state, "up");
	} finally {
		c.stop();
	}
});

test("pipelined requests on one connection are matched to their replies", async () => {
	const c = client();
	try {
		const ks = [1, 7, 3, 12, 2, 9, 5, 4, 11, 6];
		const replies = await Promise.all(ks.map((k) =>
			c.request<SearchReply>("search", { query: "task", k, mode: "bm25" })));
		assert.deepEqual(replies.map((r) => r.results.length), ks);
		const [ping, st] = await Promise.all([c.request<{ protocol: number }>("ping"),
			c.request<{ sources: unknown[] }>("status")]);
		assert.equal(ping.protocol, 1);
		assert.ok(Array.isArray(st.sources));
	} finally {
		c.stop();
	}
});

test("error replies carry the daemon's code, and the connection goes on", async () => {
	const c = client();
	try {
		await c.request("ping");
		await assert.rejects(c.request("search", {}), (e: RagdError) =>
			e.code === "bad_args" && /missing argument 'query'/.test(e.message));
		await assert.rejects(c.request("no_such_op"), (e: RagdError) => e.code === "unknown_op");
		await assert.rejects(c.request("get", { path: "relative.md" }), (e: RagdError) => e.code === "bad_args");
		assert.equal(c.state, "up");
		const again = await c.request<{ protocol: number }>("ping");
		assert.equal(again.protocol, 1);
	} finally {
		c.stop();
	}
});

test("a non-ASCII query and a long reply come back whole", async () => {
	const c = client();
	try {
		const q = "café ☕ «tasks» 日本語";
		const r = await c.request<SearchReply>("search", { query: q, k: 3 });
		assert.equal(r.query, q);
		// A reply of ~220 KB of multi-byte text comes in many reads, cut anywhere.
		const note = join(env.vault, "ragd long note.md");
		const lines = Array.from({ length: 3000 }, (_, i) => `Ligne ${i + 1}: café ☕ 日本語 «${"é".repeat(20)}»`);
		writeFileSync(note, lines.join("\n") + "\n");
		const got = await c.request<{ text: string; lines_total: number; truncated: boolean }>("get", { path: note });
		assert.equal(got.lines_total, 3000);
		assert.equal(got.truncated, false);
		assert.equal(got.text, lines.join("\n"));
		assert.ok(Buffer.byteLength(got.text) > 200 * 1024);
		const many = await c.request<SearchReply>("search", { query: "task", k: 1000, mode: "bm25" });
		assert.equal(many.results.length, env.expect.many_count);
	} finally {
		c.stop();
	}
});

test("the events stream: subscribed, then an indexed note", async () => {
	const c = client();
	const seen: { event: string; path?: string }[] = [];
	const stream = c.stream("events", undefined, (r) => seen.push(r as { event: string }));
	try {
		await until("subscribed", () => seen.some((e) => e.event === "subscribed"));
		const note = join(env.vault, "ragd events test.md");
		writeFileSync(note, "# Events\n\nA note about a quokka.\n");
		await until("the indexed event", () => seen.some((e) => e.event === "indexed" && e.path === note));
		appendFileSync(note, "More about the quokka.\n");
		await until("a second indexed event",
			() => seen.filter((e) => e.event === "indexed" && e.path === note).length >= 2);
	} finally {
		stream.close();
		await assert.rejects(stream.done);
		c.stop();
	}
});

test("not running: a clear error, one notice however many retries", async () => {
	const sock = join(mkdtempSync(join(tmpdir(), "ragd-")), "none.sock");
	const c = client(sock, 20);
	const notices: string[] = [];
	const states: string[] = [];
	c.onNotice((m) => notices.push(m));
	c.onState((s) => states.push(s));
	try {
		await assert.rejects(c.request("ping"), (e: RagdError) =>
			e.code === NOT_RUNNING && e.message === `ragd is not running (no daemon at ${sock})`);
		c.start();
		await sleep(400); // retries every 20..500 ms meanwhile
		assert.deepEqual(notices, [`ragd is not running (no daemon at ${sock}); retrying in the background`]);
		assert.equal(c.state, "down");
		assert.ok(states.filter((s) => s === "connecting").length >= 3, states.join(","));
	} finally {
		c.stop();
	}
});

test("a daemon that never answers: the request times out, nothing hangs", async () => {
	const sock = join(mkdtempSync(join(tmpdir(), "ragd-")), "mute.sock");
	const held: Socket[] = [];
	const server = createServer((s) => held.push(s));
	await new Promise<void>((r) => server.listen(sock, r));
	const c = new RagdClient({ socketPath: () => sock, timeoutMs: 200 });
	try {
		const t0 = Date.now();
		await assert.rejects(c.request("search", { query: "x" }), (e: RagdError) =>
			e.code === TIMEOUT && e.message === "search: no answer from ragd within 200 ms");
		assert.ok(Date.now() - t0 < 2000);
	} finally {
		c.stop();
		for (const s of held) s.destroy();
		await new Promise((r) => server.close(r));
	}
});
