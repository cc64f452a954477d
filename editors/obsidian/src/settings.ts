import { App, PluginSettingTab, Setting } from "obsidian";
import type RagdPlugin from "./main";

export interface RagdSettings {
	/** Empty: found as ragctl finds it. */
	socketPath: string;
	resultsPerView: number;
}

export const DEFAULT_SETTINGS: RagdSettings = {
	socketPath: "",
	resultsPerView: 10,
};

export class RagdSettingTab extends PluginSettingTab {
	constructor(app: App, private plugin: RagdPlugin) {
		super(app, plugin);
	}

	display(): void {
		const { containerEl } = this;
		containerEl.empty();
		new Setting(containerEl)
			.setName("Socket path")
			.setDesc(`Where ragd listens. Empty: as ragctl finds it (now ${this.plugin.defaultSocket()}).`)
			.addText((text) => text
				.setPlaceholder(this.plugin.defaultSocket())
				.setValue(this.plugin.settings.socketPath)
				.onChange(async (value) => {
					this.plugin.settings.socketPath = value.trim();
					await this.plugin.saveSettings();
				}));
		new Setting(containerEl)
			.setName("Results per view")
			.setDesc("How many notes the related pane and the search show.")
			.addSlider((slider) => slider
				.setLimits(3, 50, 1)
				.setValue(this.plugin.settings.resultsPerView)
				.setDynamicTooltip()
				.onChange(async (value) => {
					this.plugin.settings.resultsPerView = value;
					await this.plugin.saveSettings();
				}));
	}
}
