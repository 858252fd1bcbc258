# Python side of one execution: runs the user's code as __main__ with top-level await (its notebook
# syntax made Python by notebook.py), turns the final expression into its str() (and displays it when
# it has a rich representation), saves the matplotlib figures it leaves open (and those passed to
# plt.show()) as PNG files, and reports the outcome (with tracebacks that show only the user's frames)
# through the `report` function call.js hands over. In a session the namespace persists between calls. Loaded as the module `_sandbox_runner` before the
# memory snapshot is taken (so restored sandboxes find it ready), or at start-up in full-boot mode. The
# JavaScript runtime calls `prepare` once per sandbox, then `run`.
#
# The limits are enforced in Rust; the caps here only keep huge strings from being converted to
# JavaScript at all. Builtins the user's code could replace are bound as default arguments when this
# module is defined, before any user code exists.

import contextvars
import importlib.util
import linecache
import os
import random
import sys
import time
import traceback

from pyodide.code import eval_code_async

import _sandbox_display as display
import _sandbox_notebook as notebook
import _sandbox_http as http_glue
import _sandbox_upstream as upstream_tools

FILENAME = "<code>"
# The notebook helpers' own files: their frames are left out of tracebacks.
HELPER_FILENAMES = ("<sandbox-notebook>", "<sandbox-display>")
RESULT_LIMIT = 64 * 1024
MESSAGE_LIMIT = 16 * 1024
TRACEBACK_LIMIT = 64 * 1024


def _truncate(text, limit, str=str, len=len):
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def _user_traceback(exc, traceback=traceback):
    """The traceback from the first frame of the user's code on; runner and Pyodide frames before it,
    and the notebook helpers' own frames (a magic's implementation), are dropped."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    report = traceback.TracebackException(type(exc), exc, tb)
    report.stack = traceback.StackSummary.from_list(
        [frame for frame in report.stack if frame.filename not in HELPER_FILENAMES]
    )
    return "".join(report.format())


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


# The session's namespace: one per interpreter, kept between the calls of a session.
_session_namespace = None
# The session's context variables (decimal's context among them) as its last call left them: each
# call runs in a task of its own, which starts from a copy of the thread's context, so they are set
# again before the code runs.
_session_context = None

# The matplotlib backend every sandbox uses (set as MPLBACKEND in prepare()): Agg, with a show() that
# saves the open figures instead of trying to display them (which a sandbox cannot).
BACKEND = "_sandbox_mpl_backend"


class _BackendLoader:
    """Makes the backend module when matplotlib imports it (by then matplotlib is importable)."""

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        from matplotlib.backend_bases import FigureManagerBase
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        module.FigureCanvas = FigureCanvasAgg
        module.FigureManager = FigureManagerBase
        module.show = lambda *args, **kwargs: save_figures()


class _BackendFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != BACKEND:
            return None
        return importlib.util.spec_from_loader(name, _BackendLoader)


class _UnavailableFinder:
    """On a server started without a package source: `import micropip` says why it cannot work."""

    message = None

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "micropip" and cls.message is not None:
            raise ModuleNotFoundError(cls.message, name=name)
        return None


def _interruptible_sleep(seconds, _sleep=time.sleep, _monotonic=time.monotonic):
    """time.sleep in slices short enough for Python to notice an interrupt between them (a
    session's timeout raises KeyboardInterrupt in the code instead of ending the session)."""
    if seconds != seconds or seconds < 0:
        return _sleep(seconds)
    end = _monotonic() + seconds
    while True:
        left = end - _monotonic()
        if left <= 0:
            return None
        _sleep(min(left, 0.05))


def save_figures(print=print):
    """Saves every open matplotlib figure (seaborn's too) as figure-N.png (the first free N: a file
    the code made is never overwritten) and closes it; at most display.py's figure count per call,
    none larger than its pixel limit (what is left out marks the output truncated)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        numbers = plt.get_fignums()
    except BaseException:
        return
    for number in numbers:
        try:
            figure = plt.figure(number)
            width, height = figure.get_size_inches() * figure.dpi
            if width * height > display.MAX_FIGURE_PIXELS:
                print(f"figure {number} is {int(width)}x{int(height)} pixels, over the limit: not saved", file=sys.stderr)
                display.mark_truncated()
                continue
            if not display.take_figure():
                continue
            figure.savefig(display.free_name("figure", "png"), format="png")
        except BaseException as exc:
            print(f"could not save figure {number}: {exc}", file=sys.stderr)
    try:
        plt.close("all")
    except BaseException:
        pass


async def run(code, start_clock, report, persistent=False, publish=None, upstream=None, grid_rows=0):
    """One call: `code` run with this call's JavaScript functions (the clock, the report, the
    display's publisher, the upstream handle), and the rows of a table's grid data it sends (0:
    none; see display.py). They are held in a list emptied when the call ends:
    a frame of this call can outlive it (an exception the code caught from an awaited JavaScript
    promise keeps its traceback, and the frames up to here, reachable from JavaScript), and a
    session holding a JavaScript function could not be saved."""
    call = [start_clock, report, publish, upstream]
    del start_clock, report, publish, upstream
    try:
        await _run(code, call, persistent, grid_rows)
    finally:
        call.clear()


async def _run(code, call, persistent, grid_rows, BaseException=BaseException, SystemExit=SystemExit, str=str):
    global _session_namespace, _session_context
    if persistent:
        if _session_namespace is None:
            _session_namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        namespace = _session_namespace
    else:
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    # Tracebacks quote the code as the user wrote it; what runs has its notebook syntax made Python,
    # line for line.
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    display._publish = call[2]
    display._grid_rows = int(grid_rows or 0)
    upstream_tools._js = call[3]
    http_glue._js = call[3]
    display.reset_figures()
    call[0]()
    cell = None
    try:
        try:
            if persistent and _session_context is not None:
                for var, kept in _session_context.items():
                    var.set(kept)
            value = await eval_code_async(notebook.transform(code), namespace, filename=FILENAME)
        finally:
            cell = notebook.end_cell()
            if persistent:
                _session_context = contextvars.copy_context()
    except SystemExit as exc:
        _finish()
        if exc.code is None or exc.code == 0:
            _report(call[1], True, None, False, None, None, None)
        else:
            _report(call[1], False, None, False, *_describe(exc))
        return
    except BaseException as exc:
        _finish()
        _report(call[1], False, None, False, *_describe(exc))
        return
    # (`%%capture` keeps the cell's output, its result's display included.)
    if value is not None and cell != "capture":
        try:
            display.display_result(value)
        except BaseException as exc:
            print(f"display: the result could not be displayed: {exc}", file=sys.stderr)
    _finish()
    if value is None:
        _report(call[1], True, None, False, None, None, None)
        return
    try:
        text = str(value)
    except BaseException as exc:
        _report(call[1], False, None, False, *_describe(exc))
        return
    text, truncated = _truncate(text, RESULT_LIMIT)
    _report(call[1], True, text, truncated, None, None, None)


def _finish():
    """What every ending does: figures saved, output flushed, publishing and upstream calls over."""
    save_figures()
    _flush()
    display._publish = None
    display._grid_rows = 0
    upstream_tools.release()
    http_glue._js = None


def _report(report, success, result, truncated, error_type, message, traceback):
    """The report, saying also whether something (figures) was left out of the output."""
    report(success, result, truncated or display.figures_truncated(), error_type, message, traceback)


def release_files():
    """Before a session's image is checked or made, with files open: lets go of those held open
    only as a cache (matplotlib's font files, which its text rendering opens again when needed), so
    that they do not keep the session from being saved."""
    font_manager = sys.modules.get("matplotlib.font_manager")
    if font_manager is not None:
        try:
            font_manager._get_font.cache_clear()
        except Exception:
            pass
    import gc

    gc.collect()


def prepare(micropip_unavailable=None, table_rows=20, table_columns=20, figure_plotly_js="cdn", reseed=True, upstream=False):
    """Per-sandbox set-up after a snapshot restore (or a full boot); `micropip_unavailable`: why
    micropip cannot be imported, on a server whose package layer has none; the table size of
    DataFrames displayed as Markdown; `reseed`: false for a session restored from its image, whose
    random streams continue where they were; `upstream`: whether upstream MCP servers are
    configured (`import upstream` finds them)."""
    notebook.prepare()
    display.prepare()
    display.configure(table_rows, table_columns, figure_plotly_js)
    if micropip_unavailable is not None:
        _UnavailableFinder.message = micropip_unavailable
        sys.meta_path.insert(0, _UnavailableFinder)
    # The snapshot froze whatever random state existed: draw fresh OS entropy (numpy's legacy
    # global generator too, when numpy was pre-imported into the snapshot).
    if reseed:
        random.seed()
        np_random = sys.modules.get("numpy.random")
        if np_random is not None:
            np_random.seed()
    # matplotlib, if pre-imported, made its config directory in a file system that did not survive.
    mpl = sys.modules.get("matplotlib")
    if mpl is not None:
        try:
            os.makedirs(mpl.get_cachedir(), exist_ok=True)
        except Exception:
            pass
    # matplotlib draws with Agg; plt.show() and figures left open become PNG files.
    if _BackendFinder not in sys.meta_path:
        sys.meta_path.append(_BackendFinder)
    if upstream:
        upstream_tools.install()
    # urlopen (pandas.read_csv of a URL) through the HTTPS op, as requests, httpx and pyfetch go.
    http_glue.install()
    os.environ["MPLBACKEND"] = "module://" + BACKEND
    # A long time.sleep notices an interrupt within 50 ms.
    time.sleep = _interruptible_sleep
    # The package layer added files under directories the snapshot's path finders already listed:
    # forget those listings (importlib.invalidate_caches() would too, but imports importlib.metadata).
    sys.path_importer_cache.clear()
    # Output reaches the caller line by line, interleaved as the code wrote it.
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
