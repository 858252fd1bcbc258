"""The analyst workflow shared by the Python interop drivers (standard library only).

Each driver wraps one client library in an adapter with this interface (all coroutines):

    list_tools() -> list[dict]                    tools as wire dicts (name, inputSchema, ...)
    call(name, args, on_progress=None) -> Outcome one tools/call; on_progress(progress, message)
    read_resource(uri) -> list[dict]              resources/read contents as wire dicts
    supports_progress: bool                       whether call() can pass a progress callback
    check_logs() -> str | None                    (optional) client errors logged during the step

and calls run_workflow(adapter) inside the client's connection. Each step prints exactly one line,
`step NAME: ok`, `step NAME: FAIL reason` or `step NAME: skip reason` (skip only when the client's
API cannot do the step at all: raise Skip). Details go to stderr. The step names are shared with the
Node drivers (tests/interop/node) so run.sh can put every client in one matrix.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

TOOL = "run_python_code"
STEPS = [
    "list_tools",
    "print",
    "final_expression",
    "syntax_error",
    "timeout",
    "csv_groupby",
    "plot",
    "session_create",
    "session_reuse",
    "session_list_files",
    "session_read_resource",
    "session_fork",
    "session_clear",
    "snippets",
    "long_call",
]
EXPECTED_TOOLS = {
    "run_python_code",
    "list_session_files",
    "clear_session",
    "fork_session",
    "list_code_snippets",
    "get_code_snippet",
}

CSV = "region,product,sales\nnorth,a,10\nsouth,a,5\nnorth,b,7\nsouth,b,3\neast,a,4\n"
CSV_CODE = """\
import json
import pandas as pd
df = pd.read_csv("data.csv")
totals = df.groupby("region")["sales"].sum()
json.dumps({k: int(v) for k, v in totals.items()}, sort_keys=True)
"""
CSV_EXPECTED = {"east": 4, "north": 17, "south": 8}
PLOT_CODE = """\
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [3, 1, 2])
plt.savefig("plot.png")
"saved"
"""
LONG_CODE = """\
import time
for i in range(3):
    print(f"tick {i}", flush=True)
    time.sleep(1)
"done"
"""


class Skip(Exception):
    """The client's API has no way to do this step."""


class StepFailed(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise StepFailed(msg)


@dataclass
class Outcome:
    """One tools/call result, normalised across client libraries.

    structured: structuredContent when the client exposes it (None otherwise).
    blocks: content blocks as wire-shaped dicts ({"type": "text", "text": ...}, {"type": "image",
        "data", "mimeType"}, {"type": "resource_link", "uri"}, {"type": "resource", "resource": {...}}).
    is_error: the result's isError when the client exposes it (None otherwise).
    """

    structured: dict | None = None
    blocks: list[dict] = field(default_factory=list)
    is_error: bool | None = None
    progress: list[tuple[float, str | None]] = field(default_factory=list)

    @property
    def data(self) -> dict:
        """The result object: structuredContent, else the JSON object in the first text block that
        holds one (the server mirrors the result as JSON text for clients without structuredContent)."""
        if isinstance(self.structured, dict):
            return self.structured
        for block in self.blocks:
            if block.get("type") == "text":
                try:
                    value = json.loads(block.get("text") or "")
                except ValueError:
                    continue
                if isinstance(value, dict) and value.keys() & {"success", "snippets", "snippet", "id"}:
                    return value
        texts = [b.get("text", "")[:120] for b in self.blocks if b.get("type") == "text"]
        raise StepFailed(f"no result object in the response (text blocks: {texts!r})")

    def file_bytes(self, name: str) -> bytes | str | None:
        """A returned file's bytes, "link" when it only came as a resource_link, None when absent."""
        data = self.structured if isinstance(self.structured, dict) else None
        for f in (data or {}).get("files") or []:
            if f.get("path") == name and f.get("content_base64") is not None:
                return base64.b64decode(f["content_base64"])
        linked = False
        for block in self.blocks:
            kind = block.get("type")
            if kind == "resource":
                res = block.get("resource") or {}
                if str(res.get("uri", "")).endswith("/" + name):
                    if res.get("blob") is not None:
                        return base64.b64decode(res["blob"])
                    return (res.get("text") or "").encode()
            elif kind == "resource_link" and str(block.get("uri", "")).endswith("/" + name):
                linked = True
        return "link" if linked else None


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Workflow:
    def __init__(self, client: Any) -> None:
        self.c = client
        self.session: str | None = None
        self.fork: str | None = None
        self.session_uri: str | None = None

    async def run(self, args: dict, on_progress: Callable | None = None) -> Outcome:
        return await self.c.call(TOOL, args, on_progress)

    # --- steps ------------------------------------------------------------------------------
    async def list_tools(self) -> None:
        tools = await self.c.list_tools()
        names = {t.get("name") for t in tools}
        missing = EXPECTED_TOOLS - names
        check(not missing, f"missing tools {sorted(missing)} (got {sorted(names)})")
        run = next(t for t in tools if t["name"] == TOOL)
        schema = run.get("inputSchema") or run.get("input_schema") or {}
        check("code" in (schema.get("properties") or {}), f"{TOOL} inputSchema lacks 'code': {schema}")

    async def print(self) -> None:
        out = await self.run({"code": "print(1)"})
        d = out.data
        check(d.get("success") is True, f"success is {d.get('success')!r}: {d.get('error')}")
        check(d.get("stdout") == "1\n", f"stdout is {d.get('stdout')!r}")

    async def final_expression(self) -> None:
        d = (await self.run({"code": "1+1"})).data
        check(d.get("result") == "2", f"result is {d.get('result')!r}")

    async def syntax_error(self) -> None:
        out = await self.run({"code": "def ("})
        d = out.data
        check(d.get("success") is False, f"success is {d.get('success')!r}")
        err = d.get("error") or {}
        check(err.get("type") == "SyntaxError", f"error is {err!r}")
        check(out.is_error in (True, None), f"isError is {out.is_error!r}")

    async def timeout(self) -> None:
        out = await self.run({"code": "while True: pass", "timeout_ms": 1000})
        d = out.data
        check(d.get("success") is False, f"success is {d.get('success')!r}")
        err = d.get("error") or {}
        check(d.get("timed_out") is True or err.get("kind") == "timeout", f"not a timeout: {err!r}")

    async def csv_groupby(self) -> None:
        files = [{"path": "data.csv", "content_base64": base64.b64encode(CSV.encode()).decode()}]
        d = (await self.run({"code": CSV_CODE, "files": files})).data
        check(d.get("success") is True, f"failed: {d.get('error')}")
        try:
            got = json.loads(d.get("result") or "")
        except ValueError:
            raise StepFailed(f"result is not JSON: {d.get('result')!r}") from None
        check(got == CSV_EXPECTED, f"totals {got!r} != {CSV_EXPECTED!r}")

    async def plot(self) -> None:
        out = await self.run({"code": PLOT_CODE})
        d = out.data
        check(d.get("success") is True, f"failed: {d.get('error')}")
        images = [b for b in out.blocks if b.get("type") == "image"]
        image_ok = any(base64.b64decode(b.get("data") or "").startswith(b"\x89PNG") for b in images)
        f = out.file_bytes("plot.png")
        file_ok = f == "link" or (isinstance(f, bytes) and f.startswith(b"\x89PNG"))
        listed = any(x.get("path") == "plot.png" for x in d.get("files") or [])
        check(image_ok or file_ok, f"no PNG image block or plot.png file (blocks {[b.get('type') for b in out.blocks]}, listed {listed})")
        print(f"  plot: image block {image_ok}, file {'link' if f == 'link' else bool(f)}", file=sys.stderr)

    async def session_create(self) -> None:
        out = await self.run({"code": 'x = 41; open("notes.txt","w").write("hi")', "session_id": "new"})
        d = out.data
        check(d.get("success") is True, f"failed: {d.get('error')}")
        sid = d.get("session_id")
        check(isinstance(sid, str) and len(sid) >= 16, f"session_id is {sid!r}")
        self.session = sid
        f = out.file_bytes("notes.txt")
        listed = any(x.get("path") == "notes.txt" for x in d.get("files") or [])
        check(f == "link" or f == b"hi" or listed, f"notes.txt not reported (file {f!r})")

    def _need_session(self) -> str:
        if not self.session:
            raise StepFailed("no session (session_create failed)")
        return self.session

    async def session_reuse(self) -> None:
        d = (await self.run({"code": "x + 1", "session_id": self._need_session()})).data
        check(d.get("result") == "42", f"result is {d.get('result')!r}: {d.get('error')}")

    async def session_list_files(self) -> None:
        sid = self._need_session()
        d = (await self.c.call("list_session_files", {"session_id": sid}, None)).data
        check(d.get("success") is True, f"failed: {d}")
        files = {f.get("path"): f for f in d.get("files") or []}
        check("notes.txt" in files, f"notes.txt not listed: {list(files)}")
        self.session_uri = files["notes.txt"].get("uri")

    async def session_read_resource(self) -> None:
        sid = self._need_session()
        uri = self.session_uri or f"session://{sid}/notes.txt"
        contents = await self.c.read_resource(uri)
        check(len(contents) >= 1, "no contents")
        first = contents[0]
        if first.get("text") is not None:
            text = first["text"]
        else:
            text = base64.b64decode(first.get("blob") or "").decode(errors="replace")
        check(text == "hi", f"content is {text!r}")

    async def session_fork(self) -> None:
        sid = self._need_session()
        d = (await self.c.call("fork_session", {"session_id": sid}, None)).data
        check(d.get("success") is True, f"failed: {d}")
        new = d.get("session_id")
        check(isinstance(new, str) and new != sid, f"fork session_id is {new!r}")
        self.fork = new
        d = (await self.run({"code": "x", "session_id": new})).data
        check(d.get("result") == "41", f"x in fork is {d.get('result')!r}: {d.get('error')}")

    async def session_clear(self) -> None:
        sid = self._need_session()
        d = (await self.c.call("clear_session", {"session_id": sid}, None)).data
        check(d.get("success") is True, f"clear_session: {d}")
        out = await self.run({"code": "x", "session_id": sid})
        d = out.data
        err = d.get("error") or {}
        check(d.get("success") is False, f"call after clear succeeded: {d}")
        check(err.get("kind") == "session" and bool(err.get("type")), f"error after clear: {err!r}")
        if self.fork:  # tidy up; not checked
            try:
                await self.c.call("clear_session", {"session_id": self.fork}, None)
            except Exception:  # noqa: BLE001
                pass

    async def snippets(self) -> None:
        d = (await self.c.call("list_code_snippets", {}, None)).data
        snippets = d.get("snippets")
        check(isinstance(snippets, list), f"no snippets list: {d}")
        check(len(snippets) >= 1, "list_code_snippets returned no snippets (is the server's snippet config loaded?)")
        sid = snippets[0].get("id")
        d = (await self.c.call("get_code_snippet", {"id": sid}, None)).data
        code = d.get("code_snippet") or d.get("code") or (d.get("snippet") or {}).get("code_snippet")
        check(d.get("id") == sid or (d.get("snippet") or {}).get("id") == sid, f"get_code_snippet: {d}")
        check(isinstance(code, str) and code.strip() != "", f"no code in get_code_snippet: {d}")

    async def long_call(self) -> None:
        seen: list[tuple[float, str | None]] = []

        async def on_progress(progress: float, message: str | None) -> None:
            seen.append((progress, message))

        use = on_progress if getattr(self.c, "supports_progress", False) else None
        d = (await self.run({"code": LONG_CODE}, use)).data
        check(d.get("success") is True, f"failed: {d.get('error')}")
        check(d.get("stdout") == "tick 0\ntick 1\ntick 2\n", f"stdout is {d.get('stdout')!r}")
        check(d.get("result") == "done", f"result is {d.get('result')!r}")
        if use is not None:
            print(f"  long_call: {len(seen)} progress notifications: {seen}", file=sys.stderr)
            check(len(seen) >= 1, "no progress notifications reached the callback")
        else:
            print("  long_call: client API has no progress callback", file=sys.stderr)


async def run_workflow(client: Any) -> bool:
    """Runs every step in order; returns True when none failed."""
    wf = Workflow(client)
    ok = True
    # INTEROP_STEPS (space-separated) limits a run to some steps; the others report skip. run.sh uses
    # it where a client's transport adds nothing to the other steps but time (langchain over stdio
    # starts a server process per tool call: its session steps are what that mode tests).
    chosen = os.environ.get("INTEROP_STEPS", "").split()
    for name in STEPS:
        if chosen and name not in chosen:
            emit(name, "skip not selected for this run (INTEROP_STEPS)")
            continue
        try:
            await getattr(wf, name)()
            problem = client.check_logs() if hasattr(client, "check_logs") else None
            if problem:
                raise StepFailed(problem)
        except Skip as exc:
            emit(name, f"skip {_one_line(str(exc))}")
            continue
        except StepFailed as exc:
            ok = False
            emit(name, f"FAIL {_one_line(str(exc))}")
        except Exception as exc:  # noqa: BLE001 - a client/protocol exception fails the step
            ok = False
            emit(name, f"FAIL {type(exc).__name__}: {_one_line(str(exc))}")
            traceback.print_exc(file=sys.stderr)
        else:
            emit(name, "ok")
    return ok


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--url", help="Streamable HTTP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    group.add_argument("--stdio", action="store_true", help="start $CIM_BIN --stdio as a child process")
    return parser.parse_args()


def server_process() -> dict[str, Any]:
    """What a driver starts for --stdio, as every client library's stdio parameters name it:
    `command` ($CIM_BIN), `args` (--stdio [--config $CIM_CONFIG]), `env` and `cwd` (the same
    convention as the Node drivers). The environment is passed whole: the SDKs' stdio clients
    otherwise hand the child only a small default set (PATH, HOME, ...), dropping the
    CODE_INTERPRETER_MCP_* settings."""
    binary = os.environ.get("CIM_BIN") or "target/debug/code-interpreter-mcp"
    argv = ["--stdio"]
    if os.environ.get("CIM_CONFIG"):
        argv += ["--config", os.environ["CIM_CONFIG"]]
    return {"command": os.path.abspath(binary), "args": argv, "env": dict(os.environ), "cwd": os.getcwd()}


async def guarded(workflow: Callable[[], Awaitable[bool]]) -> int:
    """A driver's exit status for `workflow` (its connection and run_workflow inside it): 0 when every
    step passed; a failure of the connection itself (connect, or teardown) fails every step not
    reported yet (fail_rest)."""
    try:
        ok = await workflow()
    except BaseException as exc:  # noqa: BLE001 - any failure of the connection fails the rest
        fail_rest(exc)
        return 1
    return 0 if ok else 1


_reported: list[str] = []


def emit(name: str, verdict: str) -> None:
    _reported.append(name)
    print(f"step {name}: {verdict}", flush=True)


def fail_rest(exc: BaseException) -> None:
    """A connection-level failure (connect, or teardown): every step not reported yet fails with it."""
    reason = _one_line(f"{type(exc).__name__}: {exc}")
    traceback.print_exception(exc, file=sys.stderr)
    rest = [n for n in STEPS if n not in _reported]
    for name in rest:
        emit(name, f"FAIL connection: {reason}")
    if not rest:  # every step reported; a failure at teardown is still a failure
        print(f"teardown: FAIL {reason}", flush=True)


def to_dict(obj: Any) -> dict:
    """A pydantic model (any MCP SDK version) or dict as a wire-shaped dict."""
    if isinstance(obj, dict):
        return obj
    dump = getattr(obj, "model_dump", None)
    if dump is not None:
        return dump(mode="json", by_alias=True, exclude_none=True)
    return dict(vars(obj))


Runner = Callable[[], Awaitable[bool]]
