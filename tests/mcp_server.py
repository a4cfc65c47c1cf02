"""A small MCP server of the tests' own (the official SDK's MCPServer), for what the real servers do not do on
demand: a tool that fails, one that takes too long, one that ends the server, and results that are not text.

    python tests/mcp_server.py                  (stdio)
    python tests/mcp_server.py --http PORT      (streamable HTTP on 127.0.0.1:PORT, path /mcp)
"""

from __future__ import annotations

import os
import sys
import threading

from mcp.server.mcpserver import MCPServer
from mcp.types import EmbeddedResource, ImageContent, TextContent, TextResourceContents

server = MCPServer("probe")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return str(a + b)


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason given."""
    raise ValueError(f"refused: {reason}")


@server.tool()
def slow(seconds: float) -> str:
    """Answers after the given number of seconds."""
    threading.Event().wait(seconds)
    return "finally"


@server.tool()
def crash() -> str:
    """Ends the server's process at once, answering nothing."""
    sys.stdout.flush()
    os._exit(3)


@server.tool()
def picture() -> list:
    """A result that is an image, a resource and a line of text."""
    return [TextContent(type="text", text="a red dot follows"),
            ImageContent(type="image", data="iVBORw0KGgoAAAANSUhEUg==", mime_type="image/png"),
            EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///notes.txt",
                                                                          mime_type="text/plain", text="the notes"))]


@server.tool()
def big(lines: int) -> str:
    """As many numbered lines of text as asked."""
    return "\n".join(f"line {i} of the long result" for i in range(lines))


@server.tool()
def secret() -> str:
    """Tells the value of the PROBE_SECRET environment variable."""
    return f"the secret is {os.environ.get('PROBE_SECRET', 'unset')}"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
