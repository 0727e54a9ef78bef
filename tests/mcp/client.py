"""A real MCP client (the official Python SDK, PyPI `mcp`) driving `swarmtodo mcp`.

Run by tests/hub/mcp.rs: `python client.py SCENARIO SWARMTODO HUB LIST`. Each scenario
starts `swarmtodo mcp` processes over stdio, calls them as a coding agent's MCP client
would, checks what it must, and prints one JSON object with what it saw (the Rust test
checks more). Any failed check raises: a non-zero exit with the reason on stderr.
"""

import asyncio
import json
import sys
import urllib.request

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
import mcp_types as types

SCENARIO, SWARMTODO, HUB, LIST = sys.argv[1:5]
HTTP = HUB.replace("ws://", "http://")

EXPECTED_TOOLS = {
    "todo_read", "todo_write", "todo_claim", "todo_delegate",
    "TodoWrite", "TaskCreate", "TaskUpdate", "TaskList", "TaskGet",
    "update_plan", "todowrite", "write_todos",
}


def server(agent):
    return StdioServerParameters(
        command=SWARMTODO,
        args=["mcp", "--hub", HTTP, "--list", LIST, "--agent", agent],
        env={"SWARMTODO_LOG": "warn", "PATH": "/usr/bin:/bin"},
    )


def http(method, path, body=None, agent="other"):
    req = urllib.request.Request(
        HTTP + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"X-Swarmtodo-Agent": agent, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def call(session, tool, args, ok=True):
    result = await session.call_tool(tool, args)
    if ok:
        check(not result.is_error, f"{tool}({json.dumps(args)}) failed: {text(result)}")
    else:
        check(result.is_error, f"{tool}({json.dumps(args)}) should be refused: {text(result)}")
    return result


def tasks():
    return http("GET", f"/v1/lists/{LIST}")["tasks"]


def by_content(content):
    found = [t for t in tasks() if t["content"] == content]
    check(len(found) == 1, f"one task {content!r}: {found}")
    return found[0]


async def every_tool():
    updates = asyncio.Queue()

    async def on_message(message):
        if isinstance(message, types.ServerNotification) or hasattr(message, "root"):
            root = getattr(message, "root", message)
            if getattr(root, "method", "") == "notifications/resources/updated":
                await updates.put(root.params.uri)

    seen = {}
    async with stdio_client(server("claude")) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as session:
            init = await session.initialize()
            seen["protocol"] = init.protocol_version
            names = {t.name for t in (await session.list_tools()).tools}
            check(names == EXPECTED_TOOLS, f"tools: {sorted(names)}")
            seen["tools"] = sorted(names)

            # Claude Code TodoWrite, exactly its payload.
            await call(session, "TodoWrite", {"todos": [
                {"content": "Read the issue", "status": "completed", "activeForm": "Reading the issue"},
                {"content": "Write the parser", "status": "in_progress", "activeForm": "Writing the parser"},
                {"content": "Write the tests", "status": "pending", "activeForm": "Writing the tests"},
            ]})
            parser = by_content("Write the parser")
            check(parser["status"] == "in_progress" and parser["active_form"] == "Writing the parser", parser)
            # Another agent adds a task; Claude's next snapshot (without it) keeps it.
            http("POST", f"/v1/lists/{LIST}/todo_write", {"mode": "patch", "ops": [
                {"op": "upsert", "task": {"id": "other-1", "content": "Another agent's task"}}]})
            await call(session, "TodoWrite", {"todos": [
                {"content": "Read the issue", "status": "completed", "activeForm": "Reading the issue"},
                {"content": "Write the parser", "status": "completed", "activeForm": "Writing the parser"},
                {"content": "Write the tests", "status": "in_progress", "activeForm": "Writing the tests"},
            ]})
            check(by_content("Another agent's task")["status"] == "pending", "another agent's task kept")
            check(by_content("Write the tests")["status"] == "in_progress", "tests in progress")

            # Claude Code tasks.
            created = await call(session, "TaskCreate", {
                "subject": "Fix the login bug", "description": "Users cannot log in with SSO",
                "activeForm": "Fixing the login bug"})
            fix = by_content("Fix the login bug")
            check(fix["id"] in text(created), text(created))
            await call(session, "TaskUpdate", {"taskId": fix["id"], "addBlockedBy": [by_content("Write the tests")["id"]]})
            check(by_content("Fix the login bug")["blocked_by"] == [by_content("Write the tests")["id"]], "addBlockedBy")
            listed = await call(session, "TaskList", {})
            check("Fix the login bug" in text(listed) and "blocked by" in text(listed), text(listed))
            got = await call(session, "TaskGet", {"taskId": fix["id"]})
            check(got.structured_content["task"]["subject"] == "Fix the login bug", got.structured_content)
            check(got.structured_content["task"]["description"] == "Users cannot log in with SSO", got.structured_content)
            # "Write the tests" is claude's, in progress (TodoWrite made it so): a second
            # task in progress is refused until it completes.
            refused = await call(session, "TaskUpdate", {"taskId": "other-1", "status": "in_progress"}, ok=False)
            check("second_in_progress" in text(refused), text(refused))
            await call(session, "TaskUpdate", {"taskId": by_content("Write the tests")["id"], "status": "completed"})
            await call(session, "TaskUpdate", {"taskId": "other-1", "status": "in_progress"})
            check(by_content("Another agent's task")["owner"] == "claude", "TaskUpdate in_progress claims")
            await call(session, "TaskUpdate", {"taskId": fix["id"], "status": "deleted"})
            check(not [t for t in tasks() if t["content"] == "Fix the login bug"], "deleted")

            # Codex update_plan, OpenCode todowrite, Gemini CLI write_todos.
            await call(session, "update_plan", {"explanation": "Plan the release", "plan": [
                {"step": "Tag the release", "status": "pending"}]})
            check(by_content("Tag the release")["status"] == "pending", "update_plan")
            await call(session, "todowrite", {"todos": [
                {"content": "Write the changelog", "status": "pending", "priority": "high", "id": "oc-1"}]})
            check(by_content("Write the changelog")["priority"] == "high", "todowrite priority")
            await call(session, "write_todos", {"todos": [
                {"description": "Announce it", "status": "cancelled"}]})
            check(by_content("Announce it")["status"] == "cancelled", "write_todos cancelled")

            # Our own tools.
            read = await call(session, "todo_read", {})
            version = read.structured_content["version"]
            await call(session, "todo_write", {"mode": "patch", "ops": [
                {"op": "upsert", "task": {"id": "own-1", "content": "Own tool task", "priority": "low"}}],
                "expected_version": version})
            stale = await call(session, "todo_write", {"mode": "patch", "ops": [
                {"op": "upsert", "task": {"id": "own-2", "content": "Never"}}],
                "expected_version": version}, ok=False)
            check("stale_version" in text(stale), text(stale))
            http("POST", f"/v1/lists/{LIST}/todo_write", {"mode": "patch", "ops": [
                {"op": "upsert", "task": {"id": "ready-1", "content": "Ready to claim", "priority": "high"}}]})
            # One task in progress per agent: the claim is refused until it completes one.
            refused = await call(session, "todo_claim", {}, ok=False)
            check("second_in_progress" in text(refused), text(refused))
            await call(session, "TaskUpdate", {"taskId": "other-1", "status": "completed"})
            claimed = await call(session, "todo_claim", {})
            check(claimed.structured_content["task"]["owner"] == "claude", claimed.structured_content)
            seen["claimed"] = claimed.structured_content["task"]["id"]

            # Bad payloads: a tool error that says what is allowed, and nothing changes.
            before = http("GET", f"/v1/lists/{LIST}")["version"]
            bad = {
                "TodoWrite": {"todos": [{"content": "x", "status": "done", "activeForm": "X"}]},
                "update_plan": {"plan": [{"step": "x", "status": "cancelled"}]},
                "todowrite": {"todos": [{"content": "x", "status": "pending", "priority": "urgent", "id": "x"}]},
                "write_todos": {"todos": [{"content": "x", "status": "pending"}]},
                "TaskCreate": {"subject": "x"},
                "TaskUpdate": {"taskId": "own-1", "status": "done"},
                "TaskGet": {"taskId": "nowhere"},
                "todo_write": {"mode": "patch", "ops": [{"op": "upsert", "task": {"id": "q", "content": "q", "status": "finished"}}]},
                "todo_claim": {"task": "nowhere"},
                "todo_read": {"unexpected": 1},
                "todo_delegate": {"task": "nowhere", "agent": "sub-1"},
            }
            errors = {}
            for tool, args in bad.items():
                errors[tool] = text(await call(session, tool, args, ok=False))
            check("pending" in errors["TodoWrite"] and "in_progress" in errors["TodoWrite"], errors["TodoWrite"])
            check("urgent" in errors["todowrite"] or "high" in errors["todowrite"], errors["todowrite"])
            check(http("GET", f"/v1/lists/{LIST}")["version"] == before, "bad payloads changed nothing")
            seen["errors"] = errors

            # The list as a resource, subscribed: another agent's write is notified.
            resources = {r.uri.unicode_string() if hasattr(r.uri, "unicode_string") else str(r.uri)
                         for r in (await session.list_resources()).resources}
            list_uri = f"swarmtodo://lists/{LIST}"
            check(list_uri in resources and f"{list_uri}/violations" in resources, resources)
            content = await session.read_resource(list_uri)
            snapshot = json.loads(content.contents[0].text)
            check(any(t["content"] == "Own tool task" for t in snapshot["tasks"]), snapshot)
            await session.subscribe_resource(list_uri)
            await asyncio.sleep(0.5)
            http("POST", f"/v1/lists/{LIST}/todo_write", {"mode": "patch", "ops": [
                {"op": "upsert", "task": {"id": "late-1", "content": "Written after the subscription"}}]})
            uri = await asyncio.wait_for(updates.get(), timeout=10)
            check(str(uri) == list_uri, uri)
            content = await session.read_resource(list_uri)
            check("Written after the subscription" in content.contents[0].text, "the notified read sees the write")
            violations = await session.read_resource(f"{list_uri}/violations")
            seen["violations"] = json.loads(violations.contents[0].text)
            seen["notified"] = str(uri)
    return seen


async def codex_race():
    """Two Codex agents send update_plan snapshots concurrently, each from its own stale
    view: neither loses the other's steps, neither reverts the other's statuses."""
    async with stdio_client(server("codex-a")) as (ra, wa), stdio_client(server("codex-b")) as (rb, wb):
        async with ClientSession(ra, wa) as a, ClientSession(rb, wb) as b:
            await a.initialize()
            await b.initialize()
            await call(a, "update_plan", {"plan": [
                {"step": "Shared step 1", "status": "pending"},
                {"step": "Shared step 2", "status": "pending"}]})
            # Both read the same list.
            await call(a, "todo_read", {})
            await call(b, "todo_read", {})
            # Concurrently: A starts step 1 and adds its own; B completes step 2 and adds
            # its own. Each sends its whole plan from what it read.
            ra_, rb_ = await asyncio.gather(
                a.call_tool("update_plan", {"explanation": "A", "plan": [
                    {"step": "Shared step 1", "status": "in_progress"},
                    {"step": "Shared step 2", "status": "pending"},
                    {"step": "A's step", "status": "pending"}]}),
                b.call_tool("update_plan", {"explanation": "B", "plan": [
                    {"step": "Shared step 1", "status": "pending"},
                    {"step": "Shared step 2", "status": "completed"},
                    {"step": "B's step", "status": "pending"}]}),
            )
            check(not ra_.is_error, text(ra_))
            check(not rb_.is_error, text(rb_))
            # And once more, each from the list its last write answered (stale again by
            # the other's write): each changes only its own steps.
            def plan(answer, changes):
                three = {"blocked": "pending", "cancelled": "completed"}
                steps = []
                for t in answer.structured_content["snapshot"]["tasks"]:
                    status = changes.get(t["content"], three.get(t["status"], t["status"]))
                    steps.append({"step": t["content"], "status": status})
                return {"plan": steps}
            r2 = await asyncio.gather(
                a.call_tool("update_plan", plan(ra_, {"Shared step 1": "completed", "A's step": "in_progress"})),
                b.call_tool("update_plan", plan(rb_, {"B's step": "in_progress"})),
            )
            for r in r2:
                check(not r.is_error, text(r))
    final = {t["content"]: t["status"] for t in tasks()}
    return {"final": final}


async def delegate():
    """A lead delegates a task over MCP; the subagent, an MCP client of its own server
    on the new list, plans and completes it: the lead's task rolls up to completed."""
    async with stdio_client(server("lead")) as (rl, wl), ClientSession(rl, wl) as lead:
        await lead.initialize()
        await call(lead, "TodoWrite", {"todos": [
            {"content": "Design the API", "status": "pending", "activeForm": "Designing the API"},
            {"content": "Build the parser", "status": "pending", "activeForm": "Building the parser"}]})
        parser = by_content("Build the parser")
        handed = await call(lead, "todo_delegate", {"task": parser["id"], "agent": "sub-1"})
        sub_list = handed.structured_content["list"]
        check(handed.structured_content["task"]["owner"] == "sub-1", handed.structured_content)
        check(sub_list in text(handed), text(handed))
        sub_server = StdioServerParameters(
            command=SWARMTODO,
            args=["mcp", "--hub", HTTP, "--list", sub_list, "--agent", "sub-1"],
            env={"SWARMTODO_LOG": "warn", "PATH": "/usr/bin:/bin"},
        )
        statuses = []
        async with stdio_client(sub_server) as (rs, ws), ClientSession(rs, ws) as sub:
            await sub.initialize()
            await call(sub, "write_todos", {"todos": [
                {"description": "Write the grammar", "status": "in_progress"},
                {"description": "Write the tests", "status": "pending"}]})
            await asyncio.sleep(0.3)
            statuses.append(by_content("Build the parser")["status"])
            await call(sub, "write_todos", {"todos": [
                {"description": "Write the grammar", "status": "completed"},
                {"description": "Write the tests", "status": "cancelled"}]})
        for _ in range(100):
            if by_content("Build the parser")["status"] == "completed":
                break
            await asyncio.sleep(0.1)
        statuses.append(by_content("Build the parser")["status"])
    return {"sub_list": sub_list, "statuses": statuses}


SCENARIOS = {"every-tool": every_tool, "codex-race": codex_race, "delegate": delegate}

def leaves(e):
    """The exceptions inside exception groups (anyio wraps a failure in a task group)."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for inner in e.exceptions for leaf in leaves(inner)]
    return [e]


if __name__ == "__main__":
    try:
        out = asyncio.run(SCENARIOS[SCENARIO]())
    except BaseException as e:  # noqa: BLE001 - report the cause, not the wrapping
        import traceback
        for leaf in leaves(e):
            traceback.print_exception(leaf, limit=-3)
        sys.exit(1)
    print(json.dumps(out))
