// npm test. These tests talk to the real daemon, which tests/test_editor_obsidian.py and
// tests/test_editor_new_ops.py start for them: each node test file with the vault, config and
// expected replies it needs (what RAGD_TEST_* carry). So run by hand, npm test runs those
// through pytest, in the repository's Python environment (RAGD_PYTHON, else the checkout's
// .venv, else python3); arguments after `npm test --` go to pytest (`-k related`). With no
// Python that has ragd and pytest, it says so in one line and skips.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..", "..", "..");
const venv = join(repo, ".venv", "bin", "python");
const python = process.env.RAGD_PYTHON || (existsSync(venv) ? venv : "python3");

const probe = spawnSync(python, ["-c", "import ragd, pytest"], { encoding: "utf8" });
if (probe.status !== 0) {
	const why = probe.error ? probe.error.message
		: (probe.stderr.trim().split("\n").pop() || `exit ${probe.status}`);
	process.stdout.write(`npm test: skipped: these tests need the real ragd, started by pytest, and ` +
		`${python} has no ragd and pytest (${why}); install them (python3 -m pip install -e ` +
		`'.[test]' in ${repo}) or set RAGD_PYTHON\n`);
	process.exit(0);
}

// A -k of the caller narrows ours (pytest keeps only the last -k: it would widen it to the
// Neovim tests of test_editor_new_ops.py).
let select = "obsidian";
const rest = [];
for (let i = 2; i < process.argv.length; i++) {
	const a = process.argv[i];
	if (a === "-k" && i + 1 < process.argv.length) select += ` and (${process.argv[++i]})`;
	else rest.push(a);
}
const args = ["-m", "pytest", "tests/test_editor_obsidian.py", "tests/test_editor_new_ops.py",
	"-k", select, ...rest];
process.stdout.write(`npm test: ${python} ${args.join(" ")} (in ${repo})\n`);
const run = spawnSync(python, args, { cwd: repo, stdio: "inherit" });
process.exit(run.status ?? 1);
