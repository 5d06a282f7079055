// A tap between Pincer and an MCP stdio server (crates/pincer/tests/mcp_external.rs): runs the command given
// after the log file's path, passes stdin, stdout and stderr through, and appends to the log the
// server's pid (`{"serverPid": N}`) and then every line the client sends. It ends as the server does.
import { spawn } from "node:child_process";
import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";

const [log, command, ...args] = process.argv.slice(2);
const server = spawn(command, args, { stdio: ["pipe", "inherit", "inherit"] });
appendFileSync(log, JSON.stringify({ serverPid: server.pid }) + "\n");
createInterface({ input: process.stdin }).on("line", (line) => {
  appendFileSync(log, line + "\n");
  server.stdin.write(line + "\n");
});
process.stdin.on("end", () => server.stdin.end());
server.on("exit", (code, signal) => {
  if (signal) process.kill(process.pid, signal);
  process.exit(code ?? 1);
});
