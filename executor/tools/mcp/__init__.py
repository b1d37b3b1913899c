"""MCP servers as tool providers: each declared server's tools served as `NAME.TOOL`,
its process in the sandbox, its calls through the cancel ladder (see provider.py)."""

from __future__ import annotations

from .provider import McpProvider
from .server import ServerStatus
from .tool import McpTool

__all__ = ["McpProvider", "McpTool", "ServerStatus"]
