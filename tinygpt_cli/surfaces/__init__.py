"""The doors for programs that are not a shell: the notebook API (api.py), the MCP server
(mcp_server.py), both running the commands by the command line's own code through calls.py,
and the one table of commands (commands.py) that the command line, the API and MCP all read."""
