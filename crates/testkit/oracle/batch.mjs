#!/usr/bin/env node
// The Pi oracle in batch mode: one Node process answers many requests, so a test binary pays for
// Node's start and the Pi library's import once instead of once per comparison.
//
//   node batch.mjs ORACLE_DIR      (ORACLE_DIR: the installed copy of shared/pi-oracle)
//
// Reads one JSON request per line on stdin and writes one JSON line per request on stdout:
//   {"op":"context","file":F,"leaf":L?}                      -> what `node context.mjs F [L]` prints
//   {"op":"prepare","file":F,"leaf":L?,"keep":N?,"reserve":N?} -> what `node prepare.mjs F [L] --keep N --reserve N` prints
// as {"stdout": <the exact text the script prints>, "code": <its exit code>, "stderr"?: <why it failed>}.
// It calls the oracle's own exported runContext/runPrepare and prints their results the way the
// scripts' main blocks do, so the text is byte-identical (crates/testkit/tests/oracle_batch.rs
// checks that on every fixture). Exits when stdin closes.
import { createInterface } from "node:readline";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const dir = process.argv[2];
if (!dir) {
	process.stderr.write("usage: node batch.mjs ORACLE_DIR\n");
	process.exit(64);
}
const out = process.stdout;
// Anything the library logs goes to stderr: stdout carries only the answers.
console.log = (...args) => process.stderr.write(`${args.join(" ")}\n`);
console.info = console.log;

const { runContext } = await import(pathToFileURL(join(dir, "context.mjs")).href);
const { runPrepare } = await import(pathToFileURL(join(dir, "prepare.mjs")).href);

/** The scripts' main blocks: an error prints `{error}` and exits with its code, else the result. */
function printed(result) {
	if (result.error) return { stdout: `${JSON.stringify({ error: result.error }, null, 2)}\n`, code: result.code };
	return { stdout: `${JSON.stringify(result, null, 2)}\n`, code: 0 };
}

function answer(req) {
	switch (req.op) {
		case "context":
			return printed(runContext(req.file, req.leaf ?? undefined));
		case "prepare":
			return printed(runPrepare(req.file, req.leaf ?? undefined, req.keep ?? undefined, req.reserve ?? undefined));
		default:
			return { stdout: "", code: 64, stderr: `unknown op ${JSON.stringify(req.op)}` };
	}
}

for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
	if (!line.trim()) continue;
	let reply;
	try {
		reply = answer(JSON.parse(line));
	} catch (e) {
		// An uncaught exception: node would print it and exit 1.
		reply = { stdout: "", code: 1, stderr: String(e?.stack ?? e) };
	}
	out.write(`${JSON.stringify(reply)}\n`);
}
