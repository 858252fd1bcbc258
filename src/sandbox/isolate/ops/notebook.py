# Notebook conveniences for the runner (runner.py), loaded as the module `_sandbox_notebook` before the
# memory snapshot is taken:
# - `transform`: the cell as a notebook writes it, made Python with the same line numbers: `%pip` and
#   `!pip install`, `%time`, `%timeit`, `%%time`, `%%capture`, `%matplotlib`, `%who`; any other magic
#   or shell command becomes a clear error at its line;
# - `display` and the MIME bundles of IPython's display protocol (`_repr_mimebundle_`, `_repr_html_`,
#   ...), with DataFrames and Series also as a bounded Markdown table, matplotlib figures as PNG and
#   plotly figures as their JSON; an `IPython.display` stand-in when the real IPython is not installed;
# - plotly: `fig.show()` displays the figure and saves it as figure-N.html.
# Whatever is published here is checked and capped again in Rust.

import base64
import html
import importlib.util
import io
import json
import os
import re
import shlex
import sys
import time as _time
import types

# What one bundle's value may be before it is dropped here (Rust caps bundles again).
MAX_VALUE_CHARS = 2 * 1024 * 1024
# text/plain of an object: at most this much of its repr.
MAX_PLAIN_CHARS = 64 * 1024
# Figures a call may save (matplotlib and plotly together), and the largest one in pixels.
MAX_FIGURES = 16
MAX_FIGURE_PIXELS = 4096 * 4096

# Set by the runner for each call: publishes one bundle (a JSON string) to Rust.
_publish = None
# Settings from the server (see `configure`).
_table_rows = 20
_table_columns = 20
# State of the running cell.
_cell = None


class UsageError(Exception):
    """A notebook magic the sandbox does not offer, or used wrongly."""


def configure(table_rows, table_columns):
    global _table_rows, _table_columns
    _table_rows = max(2, int(table_rows))
    _table_columns = max(2, int(table_columns))


# --- The cell transform ---------------------------------------------------------------------------


class _Scan:
    """Where a line starts: inside a string, inside brackets, or after a backslash continuation. Only
    lines that start a statement can be magics."""

    def __init__(self):
        self.quote = None  # the open string's quote ("'", '"', "'''" or '"""')
        self.depth = 0
        self.continued = False

    def at_statement(self):
        return self.quote is None and self.depth == 0 and not self.continued

    def feed(self, line):
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if self.quote is not None:
                if c == "\\":
                    i += 2
                    continue
                if line.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = None
                    continue
                i += 1
                continue
            if c == "#":
                break
            if c in "'\"":
                triple = line[i : i + 3]
                self.quote = triple if triple in ("'''", '"""') else c
                i += len(self.quote)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        if self.quote in ("'", '"'):
            self.quote = None  # a one-line string does not continue (Python reports it)
        code = line.split("#", 1)[0] if self.quote is None else line
        self.continued = self.quote is None and code.rstrip().endswith("\\")


_ASSIGNED = re.compile(r"^[A-Za-z_][\w.]*\s*=\s*[!%]")
_KNOWN_LINE = ("pip", "pip3", "time", "timeit", "matplotlib", "who")
_KNOWN_CELL = ("time", "capture")


def transform(code):
    """`code` with notebook syntax made Python, line for line (tracebacks keep the user's lines)."""
    if "%" not in code and "!" not in code:
        return code
    out = []
    scan = _Scan()
    first = True
    for line in code.split("\n"):
        stripped = line.lstrip()
        if scan.at_statement() and stripped:
            indent = line[: len(line) - len(stripped)]
            if stripped.startswith("%%"):
                line = indent + (_cell_magic(stripped[2:]) if first and not indent else _misplaced(stripped))
            elif stripped.startswith("%"):
                line = indent + _line_magic(stripped[1:])
            elif stripped.startswith("!"):
                line = indent + _shell(stripped[1:])
            elif _ASSIGNED.match(stripped):
                line = indent + f"__sandbox_nb__.refuse({stripped!r})"
        if stripped and not stripped.startswith("#"):
            first = False
        scan.feed(line)
        out.append(line)
    return "\n".join(out)


def _split(text):
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _line_magic(text):
    name, _, rest = text.partition(" ")
    name = name.strip()
    if name in ("pip", "pip3"):
        return f"await __sandbox_nb__.pip({_split(rest)!r})"
    if name == "time":
        return f"(await __sandbox_nb__.time({rest.strip()!r}, globals()))"
    if name == "timeit":
        return f"__sandbox_nb__.timeit({rest.strip()!r}, globals())"
    if name == "matplotlib":
        return "pass"
    if name == "who":
        return "__sandbox_nb__.who(globals())"
    return f"__sandbox_nb__.unknown({('%' + name)!r})"


def _cell_magic(text):
    name, _, rest = text.partition(" ")
    name = name.strip()
    if name in _KNOWN_CELL:
        return f"__sandbox_nb__.cell({name!r}, {_split(rest)!r}, globals())"
    return f"__sandbox_nb__.unknown({('%%' + name)!r})"


def _misplaced(text):
    return f"__sandbox_nb__.refuse({text!r}, 'a cell magic must be the first line of the code')"


def _shell(text):
    words = _split(text)
    if words[:1] in (["pip"], ["pip3"]):
        return f"await __sandbox_nb__.pip({words[1:]!r})"
    if words[:3] == ["python", "-m", "pip"] or words[:3] == ["python3", "-m", "pip"]:
        return f"await __sandbox_nb__.pip({words[3:]!r})"
    return f"__sandbox_nb__.refuse({('!' + text)!r})"


# --- What the transformed lines call ----------------------------------------------------------------


def refuse(text, why=None):
    if why is None:
        raise UsageError(
            f"shell commands are not available in the sandbox: {text[:200]} (there is no shell or "
            "subprocess; use Python's os and pathlib for files, and %pip install or "
            "micropip.install for packages)"
        )
    raise UsageError(f"{text[:200]}: {why}")


def unknown(name):
    raise UsageError(
        f"the magic {name} is not available in the sandbox (it offers %pip, !pip install, %time, "
        "%timeit, %%time, %%capture, %matplotlib and %who)"
    )


async def pip(args):
    """`pip install ...` through micropip, under the server's installation policy."""
    if not args or args[0] not in ("install", "list"):
        raise UsageError(
            f"pip {' '.join(args[:1])}: only `pip install` and `pip list` are available in the sandbox"
        )
    import micropip

    if args[0] == "list":
        for name, package in sorted(micropip.list().items()):
            print(f"{name} {package.version}")
        return
    requirements, deps, pre, quiet = [], True, False, False
    for arg in args[1:]:
        if arg in ("-q", "--quiet", "-qq", "-U", "--upgrade", "--user", "--no-cache-dir"):
            quiet = quiet or arg.startswith("-q") or arg == "--quiet"
        elif arg == "--no-deps":
            deps = False
        elif arg == "--pre":
            pre = True
        elif arg.startswith("-"):
            raise UsageError(f"pip install {arg}: this option is not available in the sandbox")
        else:
            requirements.append(arg)
    if not requirements:
        raise UsageError("pip install needs at least one requirement")
    await micropip.install(requirements, deps=deps, pre=pre)
    if not quiet:
        print("Successfully installed " + " ".join(requirements))


def _eval_code(source, namespace):
    """Compiles `source` for the namespace (top-level await allowed); (code, is_expression)."""
    flags = 0x2000  # PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        return compile(source, "<magic>", "eval", flags=flags), True
    except SyntaxError:
        return compile(source, "<magic>", "exec", flags=flags), False


async def _run(code, namespace):
    result = eval(code, namespace)
    if code.co_flags & 0x80:  # CO_COROUTINE: the statement awaited something
        result = await result
    return result


def _seconds(value):
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


async def time(source, namespace, _clock=_time.perf_counter, _cpu=_time.process_time):
    """`%time STATEMENT`: runs it in the namespace and prints how long it took; an expression's value
    is returned (as the cell's result when it is the last line)."""
    code, expression = _eval_code(source, namespace)
    wall, cpu = _clock(), _cpu()
    value = await _run(code, namespace)
    cpu, wall = _cpu() - cpu, _clock() - wall
    print(f"CPU times: total: {_seconds(cpu)}\nWall time: {_seconds(wall)}")
    return value if expression else None


def timeit(source, namespace, budget=2.0, _clock=_time.perf_counter):
    """`%timeit [-n N] [-r R] STATEMENT`: the mean and spread of runs, bounded to about `budget`
    seconds in all (the call's timeout bounds it too)."""
    import statistics
    import timeit as _timeit

    words = source.split()
    number = repeat = None
    while len(words) >= 2 and words[0] in ("-n", "-r"):
        try:
            value = int(words[1])
        except ValueError:
            raise UsageError(f"%timeit {words[0]} needs a number") from None
        if words[0] == "-n":
            number = value
        else:
            repeat = value
        words = words[2:]
    statement = " ".join(words) if words else "pass"
    timer = _timeit.Timer(statement, globals=namespace)
    if number is None:
        number, taken = timer.autorange()
        if taken > budget:
            number = max(1, int(number * budget / taken))
    started = _clock()
    times = []
    for _ in range(repeat or 7):
        times.append(timer.timeit(number) / number)
        if _clock() - started > budget and len(times) >= 1:
            break
    mean = statistics.fmean(times)
    spread = statistics.stdev(times) if len(times) > 1 else 0.0
    runs = len(times)
    print(
        f"{_seconds(mean)} ± {_seconds(spread)} per loop (mean ± std. dev. of {runs} run"
        f"{'s' if runs != 1 else ''}, {number} loop{'s' if number != 1 else ''} each)"
    )


def who(namespace):
    """`%who`: the names the code defined (not modules, functions of this sandbox, or private ones)."""
    names = sorted(
        name
        for name, value in namespace.items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    )
    print("\t".join(names) if names else "Interactive namespace is empty.")


class CapturedIO:
    """What `%%capture NAME` keeps: the cell's stdout, stderr and displays."""

    def __init__(self, stdout, stderr, outputs):
        self.stdout = stdout
        self.stderr = stderr
        self.outputs = outputs

    def show(self):
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)
        for bundle in self.outputs:
            _emit(bundle, "display")

    def __call__(self):
        self.show()


def cell(name, args, namespace):
    """A cell magic on the first line: `%%time` prints the cell's time when it ends; `%%capture
    [--no-stdout] [--no-stderr] [NAME]` keeps its output (and its displays) instead of showing it."""
    global _cell
    if name == "time":
        _cell = ("time", (_time.perf_counter(), _time.process_time()), None)
        return
    keep_out = "--no-stdout" not in args
    keep_err = "--no-stderr" not in args
    target = next((a for a in args if not a.startswith("-")), None)
    saved = (sys.stdout, sys.stderr)
    out, err = io.StringIO(), io.StringIO()
    if keep_out:
        sys.stdout = out
    if keep_err:
        sys.stderr = err
    _cell = ("capture", (saved, out, err, target, namespace, []), None)


def capturing():
    """The displays list of a `%%capture` in progress, if any."""
    if _cell is not None and _cell[0] == "capture":
        return _cell[1][5]
    return None


def end_cell():
    """Called by the runner when the code has ended (whatever way); the cell magic that ran, if any."""
    global _cell
    state, _cell = _cell, None
    if state is None:
        return None
    if state[0] == "time":
        wall0, cpu0 = state[1]
        print(
            f"CPU times: total: {_seconds(_time.process_time() - cpu0)}\n"
            f"Wall time: {_seconds(_time.perf_counter() - wall0)}"
        )
        return "time"
    saved, out, err, target, namespace, outputs = state[1]
    sys.stdout, sys.stderr = saved
    if target:
        namespace[target] = CapturedIO(out.getvalue(), err.getvalue(), outputs)
    return "capture"


# --- Display --------------------------------------------------------------------------------------

_REPRS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)
_BINARY = ("image/png", "image/jpeg")


def _warn(what, exc):
    print(f"display: {what} failed: {type(exc).__name__}: {exc}"[:500], file=sys.stderr)


def bundle(obj, include=None, exclude=None):
    """The MIME bundle of `obj` (mime type -> text; binary data Base64), by IPython's protocol."""
    data = {}
    if not isinstance(obj, type):
        method = getattr(obj, "_repr_mimebundle_", None)
        if callable(method):
            try:
                got = method(include=include, exclude=exclude)
                if isinstance(got, tuple):
                    got = got[0]
                if isinstance(got, dict):
                    data.update(got)
            except Exception as exc:
                _warn("_repr_mimebundle_", exc)
        for mime, name in _REPRS:
            if mime in data:
                continue
            method = getattr(obj, name, None)
            if not callable(method):
                continue
            try:
                value = method()
            except Exception as exc:
                _warn(name, exc)
                continue
            if isinstance(value, tuple):
                value = value[0]
            if value is not None:
                data[mime] = value
        _special(obj, data)
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)[:MAX_PLAIN_CHARS]
        except Exception as exc:
            data["text/plain"] = f"<{type(obj).__name__} object: repr failed: {type(exc).__name__}>"
    if include is not None:
        data = {k: v for k, v in data.items() if k in include or k == "text/plain"}
    if exclude is not None:
        data = {k: v for k, v in data.items() if k not in exclude}
    return _normalise(data)


def _normalise(data):
    out = {}
    for mime, value in data.items():
        if not isinstance(mime, str) or "/" not in mime:
            continue
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = base64.b64encode(bytes(value)).decode("ascii")
        elif isinstance(value, (dict, list)):
            try:
                value = json.dumps(value, default=str)
            except Exception:
                continue
        elif not isinstance(value, str):
            value = str(value)
        if len(value) > MAX_VALUE_CHARS:
            print(f"display: the {mime} representation was too large and was left out", file=sys.stderr)
            continue
        out[mime] = value
    return out


def _special(obj, data):
    """Representations the protocol does not give for these types, or not well for a model."""
    module = type(obj).__module__ or ""
    try:
        if (module == "pandas" or module.startswith("pandas.")) and type(obj).__name__ in (
            "DataFrame",
            "Series",
        ):
            data.setdefault("text/markdown", table(obj))
        elif module.startswith("matplotlib.figure") and "image/png" not in data:
            buffer = io.BytesIO()
            obj.savefig(buffer, format="png")
            data["image/png"] = buffer.getvalue()
        elif module.startswith("plotly.") and hasattr(obj, "to_plotly_json"):
            data["application/vnd.plotly.v1+json"] = obj.to_plotly_json()
            data.pop("text/html", None)
    except Exception as exc:
        _warn(f"representing a {type(obj).__name__}", exc)


def _cell_text(value, limit=60):
    text = str(value).replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(obj):
    """A DataFrame or Series as a Markdown table of at most the configured rows and columns (the
    first and last ones; the cut stated), with its shape."""
    frame = obj.to_frame() if type(obj).__name__ == "Series" else obj
    rows, columns = frame.shape
    half_rows, half_cols = _table_rows // 2, _table_columns // 2
    row_cut = rows > _table_rows
    col_cut = columns > _table_columns
    row_index = list(range(half_rows)) + list(range(rows - half_rows, rows)) if row_cut else list(range(rows))
    col_index = (
        list(range(half_cols)) + list(range(columns - half_cols, columns)) if col_cut else list(range(columns))
    )
    names = [_cell_text(frame.columns[c], 40) for c in col_index]
    if col_cut:
        names.insert(half_cols, "…")
    lines = ["| " + " | ".join([""] + names) + " |", "|" + "---|" * (len(names) + 1)]
    for n, r in enumerate(row_index):
        if row_cut and n == half_rows:
            lines.append("| " + " | ".join(["…"] * (len(names) + 1)) + " |")
        cells = [_cell_text(frame.iat[r, c]) for c in col_index]
        if col_cut:
            cells.insert(half_cols, "…")
        lines.append("| " + " | ".join([_cell_text(frame.index[r], 40)] + cells) + " |")
    kind = type(obj).__name__
    shape = f"{rows} rows × {columns} columns" if kind == "DataFrame" else f"{rows} rows"
    note = f"{kind}, {shape}"
    if row_cut or col_cut:
        note += f" (showing {len(row_index)} rows and {len(col_index)} columns)"
    return "\n".join(lines) + f"\n\n*{note}*"


def _emit(data, source):
    captured = capturing()
    if captured is not None and source == "display":
        captured.append(data)
        return
    if _publish is not None and data:
        _publish(json.dumps({"source": source, "data": data}))


def display(*objs, include=None, exclude=None, metadata=None, transient=None, display_id=None, raw=False, clear=False, **kwargs):
    """Shows each object as a rich representation in the call's result (its `displays`)."""
    if clear:
        clear_output()
    for obj in objs:
        if raw and isinstance(obj, dict):
            _emit(_normalise(obj), "display")
        else:
            _emit(bundle(obj, include, exclude), "display")


def clear_output(wait=False):
    """Drops what this call displayed so far."""
    if _publish is not None:
        _publish("clear")


def display_result(value):
    """The final expression, displayed as a notebook shows it when it has a representation richer
    than text (its str() is the result already); a plotly figure is saved as figure-N.html too."""
    if capturing() is not None:
        return
    data = bundle(value)
    if set(data) - {"text/plain"}:
        _emit(data, "result")
    if _is_plotly(value) and take_figure():
        _save_plotly(value)


def _is_plotly(obj):
    return (type(obj).__module__ or "").startswith("plotly.") and hasattr(obj, "write_html")


def _save_plotly(fig):
    try:
        fig.write_html(free_name("figure", "html"), include_plotlyjs="cdn", full_html=True)
    except Exception as exc:
        _warn("saving the plotly figure", exc)


# --- An IPython.display stand-in ------------------------------------------------------------------


class DisplayObject:
    def __init__(self, data=None, url=None, filename=None, metadata=None, **kwargs):
        if filename is not None and data is None:
            with open(filename, "rb" if self._binary else "r") as f:
                data = f.read()
        self.data = data
        self.url = url
        self.filename = filename
        self.metadata = metadata

    _binary = False

    def __repr__(self):
        return f"<IPython.core.display.{type(self).__name__} object>"


class HTML(DisplayObject):
    def _repr_html_(self):
        return self.data


class Markdown(DisplayObject):
    def _repr_markdown_(self):
        return self.data


class Latex(DisplayObject):
    def _repr_latex_(self):
        return self.data


class Math(DisplayObject):
    def _repr_latex_(self):
        text = (self.data or "").strip("$")
        return f"$\\displaystyle {text}$"


class SVG(DisplayObject):
    def _repr_svg_(self):
        return self.data


class JSON(DisplayObject):
    def __init__(self, data=None, url=None, filename=None, expanded=False, metadata=None, root="root", **kwargs):
        if isinstance(data, str) and filename is None:
            data = json.loads(data)
        super().__init__(data, url, filename, metadata)
        if isinstance(self.data, str):
            self.data = json.loads(self.data)

    def _repr_json_(self):
        return self.data


class Image(DisplayObject):
    _binary = True

    def __init__(self, data=None, url=None, filename=None, format=None, embed=None, width=None, height=None, **kwargs):
        if isinstance(data, str) and filename is None and url is None:
            if data.startswith(("http://", "https://")):
                url, data = data, None
            else:
                filename, data = data, None
        super().__init__(data, url, filename)
        self.format = (format or (filename or url or "").rsplit(".", 1)[-1] or "png").lower()
        self.width, self.height = width, height

    def _repr_png_(self):
        return self.data if self.data is not None and self.format == "png" else None

    def _repr_jpeg_(self):
        return self.data if self.data is not None and self.format in ("jpg", "jpeg") else None

    def _repr_html_(self):
        if self.url is not None:
            return f'<img src="{html.escape(self.url)}"/>'
        return None


def _ipython_modules():
    display_module = types.ModuleType("IPython.display")
    display_module.__doc__ = "The sandbox's stand-in for IPython.display (the real IPython is not installed)."
    for name in ("display", "clear_output", "HTML", "Markdown", "Latex", "Math", "SVG", "JSON", "Image", "DisplayObject"):
        setattr(display_module, name, globals()[name])
    package = types.ModuleType("IPython")
    package.__doc__ = "The sandbox's stand-in for IPython: IPython.display only."
    package.__path__ = []
    package.display = display_module
    # What libraries that look for IPython check (matplotlib, pandas): no shell is running.
    package.get_ipython = lambda: None
    package.version_info = (9, 0, 0, "")
    package.__version__ = "9.0.0"
    core = types.ModuleType("IPython.core")
    core.__path__ = []
    core.display = display_module
    package.core = core
    return {"IPython": package, "IPython.display": display_module, "IPython.core": core, "IPython.core.display": display_module}


class _IPythonFinder:
    """Serves the stand-in for `IPython`, `IPython.display` and `IPython.core.display` when no real
    IPython is installed (it is consulted after the path finders)."""

    modules = None

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in ("IPython", "IPython.display", "IPython.core", "IPython.core.display"):
            return None
        if cls.modules is None:
            cls.modules = _ipython_modules()
        return importlib.util.spec_from_loader(name, cls, is_package=name in ("IPython", "IPython.core"))

    @classmethod
    def create_module(cls, spec):
        return cls.modules[spec.name]

    @classmethod
    def exec_module(cls, module):
        return None


# --- plotly -----------------------------------------------------------------------------------------

_figures_saved = 0
_figures_truncated = False


def reset_figures():
    global _figures_saved, _figures_truncated
    _figures_saved = 0
    _figures_truncated = False


def take_figure():
    """Whether one more figure may be saved in this call (else the call says output was cut)."""
    global _figures_saved, _figures_truncated
    if _figures_saved >= MAX_FIGURES:
        _figures_truncated = True
        return False
    _figures_saved += 1
    return True


def mark_truncated():
    global _figures_truncated
    _figures_truncated = True


def figures_truncated():
    return _figures_truncated


def free_name(stem, extension):
    """figure-N.EXT for the first N no file has: a user's file is never overwritten."""
    n = 1
    while os.path.exists(f"{stem}-{n}.{extension}"):
        n += 1
    return f"{stem}-{n}.{extension}"


def show_plotly(fig, *args, **kwargs):
    """plotly's `fig.show()` in the sandbox: the figure is displayed (its JSON) and saved as
    figure-N.html, which loads plotly.js from its CDN when opened."""
    display(fig)
    if take_figure():
        _save_plotly(fig)


class _PlotlyLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self.loader.exec_module(module)
        figure = getattr(module, "BaseFigure", None)
        if figure is not None:
            figure.show = show_plotly


class _PlotlyFinder:
    """Makes plotly's figures show themselves through `show_plotly` once plotly defines them."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "plotly.basedatatypes":
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PlotlyLoader(spec.loader)
                return spec
        return None


def prepare():
    """Per-sandbox set-up (see runner.prepare)."""
    import builtins

    builtins.display = display
    builtins.__sandbox_nb__ = sys.modules[__name__]
    if _IPythonFinder not in sys.meta_path:
        sys.meta_path.append(_IPythonFinder)
    if _PlotlyFinder not in sys.meta_path:
        sys.meta_path.insert(0, _PlotlyFinder)
