// Runs the real Pi library's convertToLlm and bashExecutionToText over the JSON array of messages
// on stdin and prints {"llm": [...], "bash": [...]} (bash: the text of every bashExecution message).
// The oracle's own internals.mjs (in $PINCER_PI_ORACLE) gives access to the library's modules.
import { pathToFileURL } from "node:url";
import { readFileSync } from "node:fs";

const { messages } = await import(pathToFileURL(`${process.env.PINCER_PI_ORACLE}/internals.mjs`).href);
const input = JSON.parse(readFileSync(0, "utf8"));
const bash = input.filter((m) => m.role === "bashExecution").map((m) => messages.bashExecutionToText(m));
process.stdout.write(JSON.stringify({ llm: messages.convertToLlm(input), bash }));
