# urllib.request over the sandbox's one HTTPS op: `urlopen`, and what uses it (pandas.read_csv with
# an https:// URL, for one), reach the allowlisted and granted hosts as requests, httpx and pyfetch
# already do (their Pyodide transports call the same op through fetch). Rust decides everything:
# the host, the method, the path, the headers it adds; nothing of a browser (CORS, XHR) is involved.
# And pyodide.http's `FetchResponse.bytes()` gets the body straight from Rust into the bytes object
# it returns, with no JavaScript ArrayBuffer of it in between (web.js keeps a fetched body in Rust
# until it is read). Loaded as the module `_sandbox_http` before the memory snapshot is taken;
# `install` runs at every prepare(), and hooks each module in when it is first imported (so
# sandboxes that never use them do not pay for importing them).

import builtins
import importlib.abc
import importlib.machinery
import io
import json
import sys

# The JavaScript function of the running call (see upstream.py), None between calls.
_js = None
# Headers urllib adds for its own connection, which the transport in Rust sets instead.
_TRANSPORT_HEADERS = frozenset(("host", "connection", "content-length", "transfer-encoding", "accept-encoding"))


def _open(req):
    import email.message
    import urllib.error
    import urllib.response

    from pyodide.ffi import can_run_sync, run_sync, to_js

    js = _js
    if js is None:
        raise urllib.error.URLError("requests can be made only while code runs")
    if not can_run_sync():
        raise urllib.error.URLError(
            "urllib cannot wait here: use an async client (pyodide.http.pyfetch, httpx.AsyncClient)"
        )
    data = req.data
    if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
        data = data.read() if hasattr(data, "read") else b"".join(data)
    headers = json.dumps([[k, v] for k, v in req.header_items() if k.lower() not in _TRANSPORT_HEADERS])
    body = to_js(bytes(data)) if data is not None else None
    failure = None
    try:
        reply = run_sync(js("http", req.full_url, req.get_method(), headers, body))
    except Exception as exc:
        failure = str(exc).splitlines()[-1] if str(exc) else repr(exc)
    # An exception raised here keeps this frame (and no longer the JavaScript exception it
    # replaces): it must not keep JavaScript values, or a session whose code keeps the exception
    # could not be saved.
    js = body = None
    if failure is not None:
        raise urllib.error.URLError(failure)
    meta = json.loads(str(reply[0]))
    content = reply[1].to_bytes()
    reply = None
    message = email.message.Message()
    for name, value in meta["headers"]:
        message[name] = value
    response = urllib.response.addinfourl(io.BytesIO(content), message, meta["url"], meta["status"])
    response.msg = meta["statusText"]
    response.reason = meta["statusText"]
    return response


def _handler_class(request):
    import urllib.error

    class SandboxHTTPSHandler(request.BaseHandler):
        """https:// through the sandbox's HTTPS op (before urllib's own handler)."""

        handler_order = 100

        def https_open(self, req):
            return _open(req)

        def http_open(self, req):
            raise urllib.error.URLError("only https:// URLs can be reached from the sandbox")

    return SandboxHTTPSHandler


def _install_urllib(request):
    """`request`: the module urllib.request (while it is first imported, not yet an attribute of
    urllib)."""
    request.install_opener(request.build_opener(_handler_class(request)))


def _install_pyfetch(module):
    """`module`: pyodide.http._pyfetch, whose FetchResponse.bytes() this replaces (once)."""
    cls = module.FetchResponse
    if getattr(cls.bytes, "_sandbox", False):
        return
    through_javascript = cls.bytes

    async def bytes(self):
        """Return the response body as a bytes object"""
        self._raise_if_failed()
        js = _js
        length = js("bodyLength", self.js_response) if js is not None else -1
        if length > 0:
            # A new bytes object of that length, filled once through its buffer before anything
            # else can see it (as CPython's and Pyodide's own C code fill the bytes they make).
            out = builtins.bytes(length)
            js("bodyInto", self.js_response, out)
            js = None
            return out
        js = None
        return await through_javascript(self)

    bytes._sandbox = True
    cls.bytes = bytes


# What to do when each module is first imported.
_INSTALLERS = {"urllib.request": _install_urllib, "pyodide.http._pyfetch": _install_pyfetch}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _INSTALLERS[module.__name__](module)


class _Finder:
    """Installs what `_INSTALLERS` names when its module is first imported."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in _INSTALLERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install():
    """Called by the runner's prepare()."""
    waiting = False
    for name, installer in _INSTALLERS.items():
        if name in sys.modules:
            installer(sys.modules[name])
        else:
            waiting = True
    if waiting and _Finder not in sys.meta_path:
        sys.meta_path.insert(0, _Finder)
