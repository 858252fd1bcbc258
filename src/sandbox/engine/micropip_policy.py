

# --- Appended by code-interpreter-mcp: the server's package policy. -----------------------------------
# This runs whenever micropip is imported, re-imported or reloaded, so the policy cannot be undone by
# importlib.reload(micropip).


def _code_interpreter_mcp_policy(index_urls, disabled):
    global install
    if index_urls:
        set_index_urls(index_urls)
    if disabled:

        def install(*args, **kwargs):
            """Runtime package installation is disabled on this server."""
            raise RuntimeError("Runtime package installation is disabled")

        def _refuse(self, *args, **kwargs):
            raise RuntimeError("Runtime package installation is disabled")

        PackageManager.install = _refuse

    # Outside a browser, "Can't fetch wheel ... (CORS)" hides the real reason (host not on the
    # allowlist, HTTP status, TLS): surface the download error itself.
    from .wheelinfo import WheelInfo

    if not getattr(WheelInfo._fetch_bytes, "_code_interpreter_mcp", False):
        original = WheelInfo._fetch_bytes

        async def _fetch_bytes(self, *args, **kwargs):
            try:
                return await original(self, *args, **kwargs)
            except ValueError as e:
                if isinstance(e.__context__, OSError):
                    raise e.__context__ from None
                raise

        _fetch_bytes._code_interpreter_mcp = True
        WheelInfo._fetch_bytes = _fetch_bytes

    # micropip reads a wheel's body whatever the HTTP status; a 404 page then fails as "not a zip
    # file". Check the status first and say what happened.
    from . import _compat

    layer = _compat.compatibility_layer
    if not getattr(layer.fetch_bytes, "_code_interpreter_mcp", False):
        original_fetch_bytes = layer.fetch_bytes

        async def fetch_bytes(url, kwargs):
            if url.startswith(("https://", "http://")):
                from pyodide.http import pyfetch

                response = await pyfetch(url, **kwargs)
                if not response.ok:
                    raise OSError(f"download failed (HTTP {response.status}) for {url}")
                return await response.bytes()
            return await original_fetch_bytes(url, kwargs)

        fetch_bytes._code_interpreter_mcp = True
        layer.fetch_bytes = staticmethod(fetch_bytes)
        _compat.fetch_bytes = fetch_bytes
