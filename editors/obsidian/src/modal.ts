import { App, SuggestModal } from "obsidian";
import { Item, searchView } from "./models";
import { renderItem } from "./render";
import type RagdPlugin from "./main";

/** Search as you type: each query goes to ragd (the modal waits for the answer, Obsidian
 * keeps typing responsive); Enter opens the note at the line. */
export class SearchModal extends SuggestModal<Item> {
	private latest = 0;

	constructor(app: App, private plugin: RagdPlugin) {
		super(app);
		this.setPlaceholder("Search your notes with ragd");
		this.emptyStateText = "Type to search.";
		this.limit = 100;
		this.setInstructions([
			{ command: "↵", purpose: "open at the line" },
			{ command: "ctrl ↵", purpose: "open in a new tab" },
		]);
	}

	async getSuggestions(query: string): Promise<Item[]> {
		const ticket = ++this.latest;
		// A pause in the typing before asking: no search per keystroke.
		await new Promise((r) => window.setTimeout(r, 120));
		if (ticket !== this.latest) return [];
		const { reply, error } = await this.plugin.search(query);
		const view = searchView(query, reply, error, this.plugin.vaultRoot());
		this.emptyStateText = view.message ?? "Type to search.";
		return view.items;
	}

	renderSuggestion(it: Item, el: HTMLElement): void {
		renderItem(el, it);
	}

	onChooseSuggestion(it: Item, evt: MouseEvent | KeyboardEvent): void {
		void this.plugin.open(it, evt.ctrlKey || evt.metaKey);
	}
}
