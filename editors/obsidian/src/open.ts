import { App, MarkdownView, Notice, TFile } from "obsidian";
import type { Item } from "./models";

/** Open a result's note with the cursor on its line (a file outside the vault: with the
 * system's default app). */
export async function openItem(app: App, it: Item, newLeaf = false): Promise<void> {
	const file = it.vaultPath === null ? null : app.vault.getAbstractFileByPath(it.vaultPath);
	if (!(file instanceof TFile)) {
		// eslint-disable-next-line @typescript-eslint/no-require-imports -- electron is there only at run time, in Obsidian: never bundled, never imported by the tests
		const { shell } = require("electron") as { shell: { openPath: (p: string) => Promise<string> } };
		const err = await shell.openPath(it.path);
		if (err) new Notice(`ragd: cannot open ${it.path}: ${err}`);
		return;
	}
	const line = Math.max(0, it.line - 1);
	const leaf = app.workspace.getLeaf(newLeaf);
	await leaf.openFile(file, { active: true, eState: { line } });
	const view = leaf.view;
	if (view instanceof MarkdownView) {
		const editor = view.editor;
		const at = { line: Math.min(line, editor.lastLine()), ch: 0 };
		editor.setCursor(at);
		editor.scrollIntoView({ from: at, to: at }, true);
	}
}
