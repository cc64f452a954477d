// The related pane for a note whose vectors are still to come: it says the daemon's reason
// instead of a bare "No related notes". Run by tests/test_editor_new_ops.py with the bulk
// embedding engine stopped and a note (env.expect.note) indexed after it stopped.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Reply, relatedView } from "../src/models";
import { client, env } from "./helpers";

test("the related pane says why a note has no related notes yet", async () => {
	const note = env.expect.note as string;
	const c = client();
	try {
		const reply = await c.request<Reply>("related", { path: note, k: 5 });
		assert.deepEqual(reply.results, []);
		assert.ok(reply.reason, "the daemon gives a reason");
		const view = relatedView(reply, null, env.vault, "Lighthouse");
		assert.deepEqual(view, { items: [], message: `No related notes: ${reply.reason}` });
	} finally {
		c.stop();
	}
});
