// What the tests get from tests/test_editor_obsidian.py, which starts the real daemon: its
// socket, config, vault and the Python that runs it (to start it again after a stop).

import { ChildProcess, spawn } from "node:child_process";
import { RagdClient } from "../src/client";

function need(name: string): string {
	const v = process.env[name];
	if (!v) throw new Error(`${name} is not set: run these tests through python3 -m pytest ` +
		"(tests/test_editor_obsidian.py starts ragd for them)");
	return v;
}

export const env = {
	get socket(): string { return need("RAGD_TEST_SOCKET"); },
	get config(): string { return need("RAGD_TEST_CONFIG"); },
	get python(): string { return need("RAGD_TEST_PYTHON"); },
	get vault(): string { return need("RAGD_TEST_VAULT"); },
	get expect(): Record<string, unknown> { return JSON.parse(need("RAGD_TEST_EXPECT")) as Record<string, unknown>; },
};

export function client(socketPath = env.socket, retryMinMs = 50): RagdClient {
	return new RagdClient({ socketPath: () => socketPath, timeoutMs: 10000, retryMinMs, retryMaxMs: 500 });
}

export function sleep(ms: number): Promise<void> {
	return new Promise((r) => setTimeout(r, ms));
}

export async function until<T>(what: string, fn: () => T | Promise<T>, ms = 20000): Promise<T> {
	const deadline = Date.now() + ms;
	for (;;) {
		const v = await fn();
		if (v) return v;
		if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
		await sleep(20);
	}
}

/** Start ragd again on the test's config (after a test stopped it); stop() when done. */
export async function startDaemon(): Promise<{ proc: ChildProcess; stop: () => Promise<void> }> {
	const proc = spawn(env.python, ["-m", "ragd", "--config", env.config], { stdio: "ignore" });
	const exited = new Promise<void>((r) => proc.once("exit", () => r()));
	const c = client();
	await until("ragd to answer", async () => {
		try {
			await c.request("ping", undefined, { timeoutMs: 2000 });
			return true;
		} catch {
			return false;
		}
	});
	c.stop();
	return {
		proc,
		stop: async () => {
			if (proc.exitCode === null) proc.kill("SIGTERM");
			await exited;
		},
	};
}
