# Python side of one execution: runs the user's code as __main__ with top-level await, turns the final
# expression into its str(), and reports the outcome (with tracebacks that show only the user's frames)
# through the `report` function call.js hands over. Loaded as the module `_sandbox_runner` before the
# memory snapshot is taken (so restored sandboxes find it ready), or at start-up in full-boot mode. The
# JavaScript runtime calls `prepare` once per sandbox, then `run`.
#
# The limits are enforced in Rust; the caps here only keep huge strings from being converted to
# JavaScript at all. Builtins the user's code could replace are bound as default arguments when this
# module is defined, before any user code exists.

import linecache
import random
import sys
import traceback

from pyodide.code import eval_code_async

FILENAME = "<code>"
RESULT_LIMIT = 64 * 1024
MESSAGE_LIMIT = 16 * 1024
TRACEBACK_LIMIT = 64 * 1024


def _truncate(text, limit, str=str, len=len):
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def _user_traceback(exc, traceback=traceback):
    """The traceback from the first frame of the user's code on; runner and Pyodide frames are dropped."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _describe(exc, str=str, type=type, BaseException=BaseException):
    """(type name, message, traceback) of `exc`, even when its __str__ or the formatting raises."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException:
        message = f"<exception str() failed: {name}>"
    try:
        text = _user_traceback(exc)
    except BaseException:
        text = f"{name}: {message}\n"
    return (
        _truncate(name, 256)[0],
        _truncate(message, MESSAGE_LIMIT)[0],
        _truncate(text, TRACEBACK_LIMIT)[0],
    )


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


async def run(code, start_clock, report, BaseException=BaseException, SystemExit=SystemExit, str=str):
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    start_clock()
    try:
        value = await eval_code_async(code, namespace, filename=FILENAME)
    except SystemExit as exc:
        _flush()
        if exc.code is None or exc.code == 0:
            report(True, None, False, None, None, None)
        else:
            report(False, None, False, *_describe(exc))
        return
    except BaseException as exc:
        _flush()
        report(False, None, False, *_describe(exc))
        return
    _flush()
    if value is None:
        report(True, None, False, None, None, None)
        return
    try:
        text = str(value)
    except BaseException as exc:
        report(False, None, False, *_describe(exc))
        return
    text, truncated = _truncate(text, RESULT_LIMIT)
    report(True, text, truncated, None, None, None)


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
