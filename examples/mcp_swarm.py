"""One lead and three subagents, each an MCP client of its own `swarmtodo mcp`, sharing
one list on a local hub.

    swarmtodo serve &                      # a hub on 127.0.0.1:7700
    python3 -m venv .venv && .venv/bin/pip install mcp==2.3.0
    .venv/bin/python examples/mcp_swarm.py [SWARMTODO] [HUB] [LIST]

The lead plans with Claude Code's TodoWrite payload; each subagent claims the next ready
task (todo_claim: the hub gives a task to one agent only), reports it done in its own
tool's payload (Codex update_plan, OpenCode todowrite, Gemini CLI write_todos), and
claims again until nothing is ready. The lead prints the list as Markdown at the end.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SWARMTODO = sys.argv[1] if len(sys.argv) > 1 else "swarmtodo"
HUB = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:7700"
LIST = sys.argv[3] if len(sys.argv) > 3 else "mcp-swarm"


def agent(name):
    return StdioServerParameters(
        command=SWARMTODO, args=["mcp", "--hub", HUB, "--list", LIST, "--agent", name]
    )


async def lead():
    async with stdio_client(agent("lead")) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        steps = ["Read the issue", "Write the parser", "Write the tests", "Update the docs",
                 "Review the change", "Write the changelog"]
        await s.call_tool("TodoWrite", {"todos": [
            {"content": c, "status": "pending", "activeForm": c.replace("Write", "Writing")}
            for c in steps]})


def done_payload(tool, task):
    """The task completed, in the subagent's own tool's payload (one item: the list's
    other tasks are not this agent's, and a whole-list payload that leaves out another
    agent's task keeps it)."""
    if tool == "update_plan":
        return {"plan": [{"step": task["content"], "status": "completed"}]}
    if tool == "todowrite":
        return {"todos": [{"content": task["content"], "status": "completed",
                           "priority": task.get("priority", "medium"), "id": task["id"]}]}
    return {"todos": [{"description": task["content"], "status": "completed"}]}


async def subagent(name, tool):
    done = []
    async with stdio_client(agent(name)) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        await s.call_tool("todo_read", {})
        while True:
            claimed = await s.call_tool("todo_claim", {})
            if claimed.is_error:
                break  # nothing_ready: every task is taken or done
            task = claimed.structured_content["task"]
            await s.call_tool("todo_read", {})
            result = await s.call_tool(tool, done_payload(tool, task))
            if result.is_error:
                raise RuntimeError(result.content[0].text)
            done.append(task["content"])
    return name, done


async def main():
    await lead()
    results = await asyncio.gather(
        subagent("codex-1", "update_plan"),
        subagent("opencode-1", "todowrite"),
        subagent("gemini-1", "write_todos"),
    )
    async with stdio_client(agent("lead")) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        final = await s.call_tool("todo_read", {})
    print(final.content[0].text, file=sys.stderr)
    print(json.dumps({"done": dict(results), "list": final.structured_content}))


if __name__ == "__main__":
    asyncio.run(main())
