#!/bin/sh
# The client `npx @modelcontextprotocol/conformance client` drives (crates/pincer/tests/mcp_external.rs): Pincer's
# MCP client through `pincer mcp` (PINCER_BIN) against the scenario's server, whose URL comes last.
for url; do :; done
case "$MCP_CONFORMANCE_SCENARIO" in
  tools_call) exec "$PINCER_BIN" mcp call --url "$url" --tool add_numbers --arguments '{"a": 5, "b": 3}' ;;
  sse-retry) exec "$PINCER_BIN" mcp call --url "$url" --tool test_reconnection ;;
  *) exec "$PINCER_BIN" mcp probe --url "$url" --json ;;
esac
