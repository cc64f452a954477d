// npm run lint: the rules Obsidian's plugin review applies (eslint-plugin-obsidianmd: ESLint's
// and typescript-eslint's type-checked recommended sets, and Obsidian's own), over the plugin
// and its tests. Type-checked rules read tsconfig.json; the files it does not name (this one,
// the build and release scripts) are linted in a default project.
import { defineConfig, globalIgnores } from "eslint/config";
import obsidianmd from "eslint-plugin-obsidianmd";
// (the plugin's list of names kept as written, to which ours is added: the option replaces it)
import { DEFAULT_BRANDS } from "eslint-plugin-obsidianmd/dist/lib/rules/ui/brands.js";
import globals from "globals";

export default defineConfig([
	...obsidianmd.configs.recommended,
	{
		languageOptions: {
			globals: { ...globals.browser },
			parserOptions: {
				projectService: { allowDefaultProject: ["eslint.config.mts", "*.mjs", "test/*.mjs"] },
				tsconfigRootDir: import.meta.dirname,
			},
		},
		rules: {
			// the daemon's name is written in lower case, as its commands are
			"obsidianmd/ui/sentence-case": ["warn", { brands: [...DEFAULT_BRANDS, "ragd"] }],
		},
	},
	{
		// Plain Node modules (no Obsidian API), run by node --test as they are: there is no
		// `window` for their timers; node:test's test() returns a promise its runner awaits.
		files: ["src/client.ts", "src/buffers.ts", "src/models.ts", "src/socket.ts", "test/**",
			"*.mjs"],
		languageOptions: { globals: { ...globals.node } },
		rules: { "obsidianmd/prefer-window-timers": "off" },
	},
	{
		files: ["test/**"],
		rules: { "@typescript-eslint/no-floating-promises": "off" },
	},
	globalIgnores(["node_modules", "build", "main.js"]),
]);
