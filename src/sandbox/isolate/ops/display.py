# Rich outputs for the runner (runner.py), loaded as the module `_sandbox_display` before the memory
# snapshot is taken:
# - `display` and the MIME bundles of IPython's display protocol (`_repr_mimebundle_`, `_repr_html_`,
#   ...), with DataFrames and Series also as a bounded Markdown table (and, for a client that draws
#   them, as data for a grid: `grid`), matplotlib figures as PNG and
#   plotly figures as their JSON; an `IPython.display` stand-in when the real IPython is not installed;
# - plotly: `fig.show()` displays the figure and saves it as figure-N.html;
# - the call's figure count and names (matplotlib's figures are saved by the runner through them).
# Whatever is published here is checked and capped again in Rust.

import base64
import html
import importlib.util
import io
import json
import os
import sys
import types

# What one bundle's value may be before it is dropped here (Rust caps bundles again).
MAX_VALUE_CHARS = 2 * 1024 * 1024
# text/plain of an object: at most this much of its repr.
MAX_PLAIN_CHARS = 64 * 1024
# Figures a call may save (matplotlib and plotly together), and the largest one in pixels.
MAX_FIGURES = 16
MAX_FIGURE_PIXELS = 4096 * 4096

# A table's data for an interactive grid (src/sandbox/types.rs TABLE_MIME, capped there again), and
# the most of it sent: fewer rows rather than more characters; the first columns only.
TABLE_MIME = "application/vnd.code-interpreter-mcp.table+json"
MAX_TABLE_CHARS = 4 * 1024 * 1024
MAX_GRID_COLUMNS = 200
MAX_LABEL_CHARS = 200

# Set by the runner for each call: publishes one bundle (a JSON string) to Rust.
_publish = None
# Set by the runner for each call: rows of a table's grid data (0: the client draws no grids).
_grid_rows = 0
# Settings from the server (see `configure`).
_table_rows = 20
_table_columns = 20
_plotly_js = "cdn"
# The displays of a `%%capture` in progress (see notebook.py), if any.
_captured = None


def configure(table_rows, table_columns, plotly_js="cdn"):
    global _table_rows, _table_columns, _plotly_js
    _table_rows = max(2, int(table_rows))
    _table_columns = max(2, int(table_columns))
    # plotly's `include_plotlyjs`: "cdn", True (the whole library in the file) or a script URL.
    _plotly_js = True if plotly_js == "inline" else str(plotly_js)


def start_capture(outputs):
    """From now on, displays go into the list `outputs` (a `%%capture` cell) instead of the result."""
    global _captured
    _captured = outputs


def stop_capture():
    global _captured
    _captured = None


def capturing():
    """The displays list of a `%%capture` in progress, if any."""
    return _captured


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
        if len(value) > (MAX_TABLE_CHARS if mime == TABLE_MIME else MAX_VALUE_CHARS):
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
            if _grid_rows > 0:
                data[TABLE_MIME] = grid(obj, _grid_rows)
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


def _label(value):
    text = str(value)
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"


def grid(obj, max_rows):
    """A DataFrame or Series as JSON data for a view's grid: its first `max_rows` rows (fewer when
    that would be over MAX_TABLE_CHARS) and first MAX_GRID_COLUMNS columns; labels as text, values
    as pandas writes JSON (NaN as null, dates in ISO 8601, other objects by str()); with its dtypes
    and whole shape."""
    frame = obj.to_frame() if type(obj).__name__ == "Series" else obj
    rows, columns = frame.shape
    frame = frame.iloc[:, :MAX_GRID_COLUMNS]
    n = min(rows, max_rows)
    for _ in range(6):
        head = frame.iloc[:n]
        text = (
            '{"columns":' + json.dumps([_label(c) for c in head.columns])
            + ',"dtypes":' + json.dumps([str(t) for t in head.dtypes])
            + ',"index":' + json.dumps([_label(i) for i in head.index])
            + ',"data":' + head.to_json(orient="values", date_format="iso", default_handler=str)
            + f',"total_rows":{rows},"total_columns":{columns}}}'
        )
        if len(text) <= MAX_TABLE_CHARS or n == 0:
            break
        n = int(n * MAX_TABLE_CHARS / len(text) * 0.9)
    return text


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
        fig.write_html(free_name("figure", "html"), include_plotlyjs=_plotly_js, full_html=True)
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
    figure-N.html, which gets plotly.js as `results.figure_plotly_js` says (its CDN by default)."""
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
    """Per-sandbox set-up (see runner.prepare): the `display` builtin, the IPython stand-in, and
    plotly's figures shown through `show_plotly`."""
    import builtins

    builtins.display = display
    if _IPythonFinder not in sys.meta_path:
        sys.meta_path.append(_IPythonFinder)
    if _PlotlyFinder not in sys.meta_path:
        sys.meta_path.insert(0, _PlotlyFinder)
