import { FileSystemAdapter, MarkdownView, Notice, Plugin, TFile, WorkspaceLeaf } from "obsidian";
import { BufferSync } from "./buffers";
import { RagdClient, RagdError } from "./client";
import { Item, Reply, Status, relatedView, statusView } from "./models";
import { SearchModal } from "./modal";
import { openItem } from "./open";
import { DEFAULT_SETTINGS, RagdSettingTab, RagdSettings } from "./settings";
import { socketPath } from "./socket";
import { RELATED_VIEW, RelatedView } from "./view";

const BUSY_POLL_MS = 2000;
const IDLE_POLL_MS = 30000;

export default class RagdPlugin extends Plugin {
	settings: RagdSettings = DEFAULT_SETTINGS;
	client!: RagdClient;
	buffers!: BufferSync;
	private statusEl!: HTMLElement;
	private statusTimer: number | null = null;
	private events: { close: () => void } | null = null;
	private relatedTicket = 0;
	private relatedTimer: number | null = null;
	private restartTimer: number | null = null;
	private socketInUse = ""; // the socket setting the connection was made with

	async onload(): Promise<void> {
		await this.loadSettings();
		this.socketInUse = this.settings.socketPath;
		this.client = new RagdClient({ socketPath: () => socketPath(this.settings.socketPath) });
		this.client.onNotice((msg) => new Notice(`ragd: ${msg}`, 8000));
		this.client.onState((s) => {
			if (s === "up") this.subscribe();
			if (s === "up" || s === "down") {
				this.refreshStatus();
				this.refreshRelated(true);
			}
		});
		this.buffers = new BufferSync(this.client, {
			debounceMs: 400,
			onPushed: (path) => {
				if (path === this.activePath()) this.refreshRelated(true);
			},
			onUnsupported: (msg) => console.debug(`ragd: ${msg}`),
		});

		this.registerView(RELATED_VIEW, (leaf: WorkspaceLeaf) => new RelatedView(leaf, this));
		this.addRibbonIcon("search", "Search notes with ragd", () => new SearchModal(this.app, this).open());
		this.addCommand({ id: "search", name: "Search notes",
			callback: () => new SearchModal(this.app, this).open() });
		this.addCommand({ id: "open-related", name: "Open related notes", callback: () => this.showRelated() });

		this.statusEl = this.addStatusBarItem();
		this.statusEl.addClass("ragd-status");
		this.statusEl.setText("ragd");

		this.registerEvent(this.app.workspace.on("active-leaf-change", () => this.refreshRelated(true)));
		this.registerEvent(this.app.workspace.on("file-open", () => this.refreshRelated(true)));
		this.registerEvent(this.app.workspace.on("layout-change", () => this.dropClosed()));
		this.registerEvent(this.app.workspace.on("editor-change", (editor, info) => {
			const file = info.file;
			if (file instanceof TFile && file.extension === "md") {
				const path = this.absolute(file);
				if (path) this.buffers.changed(path, editor.getValue());
			}
		}));
		this.registerEvent(this.app.vault.on("modify", (file) => {
			const path = file instanceof TFile ? this.absolute(file) : null;
			if (!path) return;
			void this.buffers.saved(path);
			if (path === this.activePath()) this.refreshRelated(false);
		}));

		this.addSettingTab(new RagdSettingTab(this.app, this));
		this.app.workspace.onLayoutReady(() => this.client.start());
	}

	onunload(): void {
		if (this.statusTimer !== null) window.clearTimeout(this.statusTimer);
		if (this.relatedTimer !== null) window.clearTimeout(this.relatedTimer);
		if (this.restartTimer !== null) window.clearTimeout(this.restartTimer);
		this.events?.close();
		this.buffers.dispose();
		this.client.stop(); // ragd drops this connection's buffers with it
	}

	async loadSettings(): Promise<void> {
		this.settings = Object.assign({}, DEFAULT_SETTINGS, await this.loadData() as Partial<RagdSettings>);
	}

	async saveSettings(): Promise<void> {
		await this.saveData(this.settings);
		// Only a new socket path needs a new connection, once typing has paused: restarting at
		// every keystroke tried each partial path (and every step of the results slider
		// reconnected, pushing the buffers again).
		if (this.settings.socketPath === this.socketInUse) return;
		if (this.restartTimer !== null) window.clearTimeout(this.restartTimer);
		this.restartTimer = window.setTimeout(() => {
			this.restartTimer = null;
			this.socketInUse = this.settings.socketPath;
			this.client.restart();
		}, 1000);
	}

	defaultSocket(): string {
		return socketPath("");
	}

	vaultRoot(): string | null {
		const adapter = this.app.vault.adapter;
		return adapter instanceof FileSystemAdapter ? adapter.getBasePath() : null;
	}

	private absolute(file: TFile): string | null {
		const root = this.vaultRoot();
		return root ? `${root}/${file.path}` : null;
	}

	private activeFile(): TFile | null {
		return this.app.workspace.getActiveViewOfType(MarkdownView)?.file ?? null;
	}

	private activePath(): string | null {
		const f = this.activeFile();
		return f ? this.absolute(f) : null;
	}

	async search(query: string): Promise<{ reply: Reply | null; error: unknown }> {
		if (!query.trim()) return { reply: null, error: null };
		try {
			const reply = await this.client.request<Reply>("search",
				{ query, k: this.settings.resultsPerView });
			return { reply, error: null };
		} catch (error) {
			return { reply: null, error };
		}
	}

	open(it: Item, newLeaf: boolean): Promise<void> {
		return openItem(this.app, it, newLeaf);
	}

	private async showRelated(): Promise<void> {
		let leaf = this.app.workspace.getLeavesOfType(RELATED_VIEW)[0] ?? null;
		if (!leaf) {
			leaf = this.app.workspace.getRightLeaf(false);
			if (!leaf) return;
			await leaf.setViewState({ type: RELATED_VIEW, active: true });
		}
		await this.app.workspace.revealLeaf(leaf);
	}

	/** Ask for the active note's related notes (soon, or at once) if the pane is open. */
	refreshRelated(now: boolean): void {
		if (this.relatedTimer !== null) window.clearTimeout(this.relatedTimer);
		this.relatedTimer = window.setTimeout(() => {
			this.relatedTimer = null;
			void this.updateRelated();
		}, now ? 0 : 300);
	}

	private async updateRelated(): Promise<void> {
		const views = this.app.workspace.getLeavesOfType(RELATED_VIEW)
			.map((l) => l.view).filter((v): v is RelatedView => v instanceof RelatedView);
		if (!views.length) return;
		const ticket = ++this.relatedTicket;
		const file = this.activeFile();
		const path = file ? this.absolute(file) : null;
		let reply: Reply | null = null;
		let error: unknown = null;
		if (path && this.client.state === "down") {
			// No request: the client is retrying on its own, and a request here would make the
			// next "down" refresh this pane again, in a loop.
			error = this.client.lastError;
		} else if (path) {
			try {
				await this.buffers.flush(path);
				reply = await this.client.request<Reply>("related", { path, k: this.settings.resultsPerView });
			} catch (e) {
				error = e;
			}
		}
		if (ticket !== this.relatedTicket) return; // a newer answer is on its way
		const model = relatedView(reply, error, this.vaultRoot(), file ? file.basename : null);
		for (const v of views) v.show(file ? file.basename : null, model);
	}

	/** Buffers of notes no editor shows any more are dropped. */
	private dropClosed(): void {
		const open = new Set<string>();
		this.app.workspace.iterateAllLeaves((leaf) => {
			if (leaf.view instanceof MarkdownView && leaf.view.file) {
				const p = this.absolute(leaf.view.file);
				if (p) open.add(p);
			}
		});
		for (const p of this.buffers.paths()) if (!open.has(p)) void this.buffers.drop(p);
	}

	private subscribe(): void {
		this.events?.close();
		// Each index event may change the state shown; a burst is one refresh.
		let pending: number | null = null;
		const stream = this.client.stream("events", undefined, () => {
			if (pending !== null) return;
			pending = window.setTimeout(() => {
				pending = null;
				this.refreshStatus();
			}, 500);
		});
		stream.done.catch(() => undefined);
		this.events = stream;
	}

	private refreshStatus(): void {
		if (this.statusTimer !== null) window.clearTimeout(this.statusTimer);
		this.statusTimer = null;
		const show = (st: Status | null, e: unknown) => {
			const view = statusView(st, e);
			this.statusEl.setText(view.text);
			this.statusEl.setAttribute("aria-label", view.title);
			this.statusEl.dataset.state = view.state;
			// While busy the numbers move without events (embedding): look again soon.
			if (this.client.state === "up") {
				this.statusTimer = window.setTimeout(() => this.refreshStatus(),
					view.state === "busy" ? BUSY_POLL_MS : IDLE_POLL_MS);
			}
		};
		if (this.client.state !== "up") {
			show(null, this.client.lastError ?? new RagdError("not_running", "ragd is not running"));
			return;
		}
		this.client.request<Status>("status").then((st) => show(st, null), (e) => show(null, e));
	}
}
