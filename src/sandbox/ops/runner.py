# Python side of one execution: runs the user's code as __main__ with top-level await, turns the final
# expression into its str(), and reports Python errors with tracebacks that show only the user's frames.
# Loaded as the module `_sandbox_runner` before the memory snapshot is taken (so restored sandboxes
# find it ready), or at start-up in full-boot mode. The JavaScript runtime calls `prepare` once per
# sandbox, then `run`.

import linecache
import random
import sys
import traceback

from pyodide.code import eval_code_async

FILENAME = "<code>"
RESULT_LIMIT = 64 * 1024


def _truncate(text, limit):
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def _user_traceback(exc):
    """The traceback from the first frame of the user's code on; runner and Pyodide frames are dropped."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    return "".join(lines)


def _error(exc):
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": _user_traceback(exc),
    }


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


async def run(code, start_clock):
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    start_clock()
    try:
        value = await eval_code_async(code, namespace, filename=FILENAME)
    except SystemExit as exc:
        _flush()
        if exc.code is None or exc.code == 0:
            return {"success": True, "result": None, "result_truncated": False}
        return {"success": False, "error": _error(exc)}
    except BaseException as exc:
        _flush()
        return {"success": False, "error": _error(exc)}
    _flush()
    if value is None:
        return {"success": True, "result": None, "result_truncated": False}
    try:
        text = str(value)
    except BaseException as exc:
        return {"success": False, "error": _error(exc)}
    text, truncated = _truncate(text, RESULT_LIMIT)
    return {"success": True, "result": text, "result_truncated": truncated}


def prepare():
    """Per-sandbox set-up after a snapshot restore (or a full boot)."""
    # The snapshot froze whatever random state existed: draw fresh OS entropy.
    random.seed()
    # The package layer added files under directories the snapshot's path finders already listed:
    # forget those listings (importlib.invalidate_caches() would too, but imports importlib.metadata).
    sys.path_importer_cache.clear()
    # Output reaches the caller line by line, interleaved as the code wrote it.
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
