// ragd stops and starts again under a connected client: the client says so once, and is back
// by itself.

import assert from "node:assert/strict";
import { test } from "node:test";
import { client, startDaemon, until } from "./helpers";

// (first: the next test stops ragd)
test("the plugin's own close (a restart, a stop) is no outage: no notice, no retry", async () => {
	const c = client();
	const notices: string[] = [];
	const states: string[] = [];
	c.onNotice((m) => notices.push(m));
	c.onState((s) => states.push(s));
	c.start();
	try {
		await until("the connection", () => c.state === "up");
		c.restart(); // as a changed socket setting does
		await until("the new connection", () => c.state === "up");
		await c.request("ping");
		c.stop(); // as disabling the plugin does
		assert.equal(c.state, "idle");
		assert.deepEqual(notices, []);
		assert.ok(!states.includes("down"), states.join(" "));
	} finally {
		c.stop();
	}
});

test("reconnects by itself after ragd restarts, with one notice", async () => {
	const c = client();
	const notices: string[] = [];
	c.onNotice((m) => notices.push(m));
	c.start();
	let restarted: Awaited<ReturnType<typeof startDaemon>> | null = null;
	try {
		await until("the connection", () => c.state === "up");
		const before = await c.request<{ pid: number }>("ping");
		await c.request("stop");
		await until("the client to see ragd go", () => c.state === "down");
		await until("a few retries", () => c.state === "down" && notices.length === 1);
		restarted = await startDaemon();
		await until("the client to reconnect", () => c.state === "up", 30000);
		const after = await c.request<{ pid: number }>("ping");
		assert.notEqual(after.pid, before.pid);
		assert.equal(notices.length, 1);
		assert.match(notices[0]!, /^ragd (closed the connection|is not running)/);
	} finally {
		c.stop();
		await restarted?.stop();
	}
});
