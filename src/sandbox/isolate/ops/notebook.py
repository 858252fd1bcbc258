# Notebook syntax for the runner (runner.py), loaded as the module `_sandbox_notebook` before the
# memory snapshot is taken: `transform` makes the cell as a notebook writes it Python with the same
# line numbers (`%pip` and `!pip install`, `%time`, `%timeit`, `%%time`, `%%capture`, `%matplotlib`,
# `%who`; any other magic or shell command becomes a clear error at its line), and the functions
# the transformed lines call. Rich output (`display`, the IPython stand-in, plotly) is display.py's.

import io
import re
import shlex
import sys
import time as _time
import types

import _sandbox_display as display

# State of the running cell.
_cell = None


class UsageError(Exception):
    """A notebook magic the sandbox does not offer, or used wrongly."""


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
            display._emit(bundle, "display")

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
    outputs = []
    display.start_capture(outputs)
    _cell = ("capture", (saved, out, err, target, namespace, outputs), None)


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
    display.stop_capture()
    sys.stdout, sys.stderr = saved
    if target:
        namespace[target] = CapturedIO(out.getvalue(), err.getvalue(), outputs)
    return "capture"


def prepare():
    """Per-sandbox set-up (see runner.prepare): transformed cells call this module as
    `__sandbox_nb__`."""
    import builtins

    builtins.__sandbox_nb__ = sys.modules[__name__]
