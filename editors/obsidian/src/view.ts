import { ItemView, WorkspaceLeaf } from "obsidian";
import type { ListView } from "./models";
import { renderItem } from "./render";
import type RagdPlugin from "./main";

export const RELATED_VIEW = "ragd-related";

/** The related notes pane: draws what the plugin computed (models.relatedView). */
export class RelatedView extends ItemView {
	constructor(leaf: WorkspaceLeaf, private plugin: RagdPlugin) {
		super(leaf);
	}

	getViewType(): string {
		return RELATED_VIEW;
	}

	getDisplayText(): string {
		return "Related notes";
	}

	getIcon(): string {
		return "network";
	}

	async onOpen(): Promise<void> {
		this.contentEl.addClass("ragd-related");
		this.plugin.refreshRelated(true);
	}

	show(noteName: string | null, model: ListView): void {
		const el = this.contentEl;
		el.empty();
		if (noteName) el.createDiv({ cls: "ragd-related-note", text: noteName });
		if (model.message) el.createDiv({ cls: "ragd-message", text: model.message });
		const list = el.createDiv({ cls: "ragd-list" });
		for (const it of model.items) {
			const row = list.createDiv({ cls: "ragd-row" });
			renderItem(row, it);
			row.addEventListener("click", (evt) => {
				void this.plugin.open(it, evt.ctrlKey || evt.metaKey);
			});
		}
	}
}
