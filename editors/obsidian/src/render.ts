// Drawing an item (models.ts) into the DOM: the same in the pane and in the modal.
import type { Item } from "./models";

export function renderItem(el: HTMLElement, it: Item): void {
	el.addClass("ragd-item");
	const head = el.createDiv({ cls: "ragd-item-head" });
	head.createSpan({ cls: "ragd-item-title", text: it.title });
	if (it.more > 0) head.createSpan({ cls: "ragd-item-more", text: `+${it.more}` });
	if (it.unsaved) head.createSpan({ cls: "ragd-item-flag", text: "unsaved" });
	if (it.stale) head.createSpan({ cls: "ragd-item-flag", text: "changed since indexed" });
	if (it.headingPath) el.createDiv({ cls: "ragd-item-heading", text: it.headingPath });
	if (it.vaultPath === null) el.createDiv({ cls: "ragd-item-path", text: it.path });
	for (const l of it.lines) {
		const row = el.createDiv({ cls: "ragd-item-line" });
		row.createSpan({ cls: "ragd-item-lineno", text: String(l.line) });
		row.createSpan({ text: l.text });
	}
}
