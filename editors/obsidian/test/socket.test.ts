// The socket is found as ragd/protocol.py finds it: tests/test_editor_obsidian.py passes the
// cases and Python's answers.

import assert from "node:assert/strict";
import { test } from "node:test";
import { socketPath } from "../src/socket";
import { env } from "./helpers";

test("socket lookup agrees with ragd/protocol.py", () => {
	const cases = env.expect.socket_cases as { name: string; setting: string; env: Record<string, string>; want: string }[];
	assert.ok(cases.length >= 5);
	for (const c of cases) {
		assert.equal(socketPath(c.setting, c.env), c.want, c.name);
	}
});
