// node esbuild.config.mjs [production|test]: main.js (watching, or once for production), or
// the tests (test/*.test.ts -> build/test/*.test.mjs, for node --test).
import esbuild from "esbuild";
import { readdirSync } from "node:fs";
import { builtinModules } from "node:module";
import process from "node:process";

const mode = process.argv[2];

if (mode === "test") {
	await esbuild.build({
		entryPoints: readdirSync("test").filter((f) => f.endsWith(".test.ts")).map((f) => `test/${f}`),
		bundle: true,
		platform: "node",
		format: "esm",
		target: "node20",
		outdir: "build/test",
		outExtension: { ".js": ".mjs" },
		external: [...builtinModules, ...builtinModules.map((m) => `node:${m}`)],
		sourcemap: "inline",
		logLevel: "warning",
	});
	process.exit(0);
}

const prod = mode === "production";
const context = await esbuild.context({
	entryPoints: ["src/main.ts"],
	bundle: true,
	// Provided by Obsidian at run time.
	external: ["obsidian", "electron", "@codemirror/*", "@lezer/*", ...builtinModules],
	format: "cjs",
	target: "es2020",
	platform: "node",
	logLevel: "info",
	sourcemap: prod ? false : "inline",
	treeShaking: true,
	outfile: "main.js",
	minify: prod,
});

if (prod) {
	await context.rebuild();
	process.exit(0);
} else {
	await context.watch();
}
