// `npm version X` runs this (the "version" script), after it has set package.json's version:
// manifest.json gets the same version, and versions.json maps it to the manifest's
// minAppVersion (Obsidian reads that map to offer users of an older app the newest release
// that still runs there). Run by hand it does nothing but say so.
import { readFileSync, writeFileSync } from "node:fs";
import process from "node:process";

const version = process.env.npm_package_version;
if (!version) {
	process.stderr.write("version-bump.mjs: run it through `npm version X`, which sets npm_package_version\n");
	process.exit(2);
}
const read = (file) => JSON.parse(readFileSync(file, "utf8"));
const write = (file, data) => writeFileSync(file, JSON.stringify(data, null, "\t") + "\n");

const manifest = read("manifest.json");
manifest.version = version;
write("manifest.json", manifest);

const versions = read("versions.json");
versions[version] = manifest.minAppVersion;
write("versions.json", versions);
process.stdout.write(`manifest.json and versions.json: ${version} (Obsidian ${manifest.minAppVersion} and later)\n`);
