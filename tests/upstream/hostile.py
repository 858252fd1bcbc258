"""A hostile MCP server over stdio, for tests/it/upstream.rs: plain Python, no dependencies.

Tools:
  hang  never answers;
  huge  answers with one line of about 100 MB (written in pieces: this process never holds it);
  mid   answers with a text of 1,100,000 characters (over a 1 MiB result cap, under its line cap);
  echo  answers with its `message`;
  slow  answers after `seconds` (other calls are served meanwhile), with the most slow calls it
        has had running at once;
  grow  adds the tool `grown` and says so with 200 `notifications/tools/list_changed`.
Every `notifications/cancelled` it receives is appended (the request id, one per line) to the file
named by HOSTILE_LOG, so that a test can see the upstream was told; every `tools/list` appends a line to HOSTILE_LOG.lists.
"""

import json
import os
import sys
import threading
import time

TOOLS = [
    {"name": name, "description": text, "inputSchema": {"type": "object", "properties": props}}
    for name, text, props in (
        ("hang", "Never answers.", {}),
        ("huge", "Answers with about 100 MB.", {}),
        ("mid", "Answers with 1,100,000 characters.", {}),
        ("echo", "Echoes.", {"message": {"type": "string"}}),
        ("slow", "Answers after `seconds`.", {"seconds": {"type": "number"}}),
        ("grow", "Adds the tool `grown`.", {}),
    )
]
GROWN = {"name": "grown", "description": "Added by grow.", "inputSchema": {"type": "object", "properties": {}}}
WRITING = threading.Lock()
COUNTING = threading.Lock()
ACTIVE = 0
PEAK = 0


def send(message):
    with WRITING:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def result(request_id, value):
    send({"jsonrpc": "2.0", "id": request_id, "result": value})


def text_result(request_id, text):
    result(request_id, {"content": [{"type": "text", "text": text}]})


def later(request_id, seconds):
    global ACTIVE, PEAK
    with COUNTING:
        ACTIVE += 1
        PEAK = max(PEAK, ACTIVE)
    time.sleep(seconds)
    with COUNTING:
        ACTIVE -= 1
        peak = PEAK
    text_result(request_id, f"peak {peak}")


def main():
    log = os.environ.get("HOSTILE_LOG")
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            result(
                request_id,
                {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "1.0.0"},
                },
            )
        elif method == "tools/list":
            if log:
                with open(log + ".lists", "a") as f:
                    f.write("list\n")
            result(request_id, {"tools": TOOLS})
        elif method == "ping":
            result(request_id, {})
        elif method == "notifications/cancelled":
            if log:
                with open(log, "a") as f:
                    f.write(f"{params.get('requestId')}\n")
        elif method == "tools/call":
            name = params.get("name")
            if name == "hang":
                continue
            if name == "huge":
                head = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": "@"}]}})
                before, after = head.split("@")
                with WRITING:
                    sys.stdout.write(before)
                    chunk = "x" * (1 << 20)
                    for _ in range(100):
                        sys.stdout.write(chunk)
                    sys.stdout.write(after + "\n")
                    sys.stdout.flush()
            elif name == "mid":
                text_result(request_id, "y" * 1_100_000)
            elif name == "slow":
                seconds = float((params.get("arguments") or {}).get("seconds", 1))
                threading.Thread(target=later, args=(request_id, seconds), daemon=True).start()
            elif name == "grow":
                if GROWN not in TOOLS:
                    TOOLS.append(GROWN)
                for _ in range(200):
                    send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
                text_result(request_id, "grew")
            elif name == "grown":
                text_result(request_id, "grown")
            elif name == "echo":
                text_result(request_id, str((params.get("arguments") or {}).get("message", "")))
            else:
                send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "unknown tool"}})
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "method not found"}})


if __name__ == "__main__":
    main()
