"""Agent tools and run control end to end: real tool sidecars (Python and Node), MCP servers, stores."""
