// The sandbox proxy of the MCP Apps spec ("Sandbox proxy" 1-8), as a web host serves it for the
// browser tests: a page on an origin other than the host page's (apps.test.mjs serves it from
// localhost, the host from 127.0.0.1), framed by the host with `allow-scripts allow-same-origin`,
// served with the Content-Security-Policy the host built from the view's `_meta.ui.csp`. It says
// it is ready, takes the view's HTML from the host's sandbox-resource-ready notification, loads it
// into an inner iframe (srcdoc: the inner document inherits this page's policy), and relays every
// other message both ways, unchanged.
const READY = "ui/notifications/sandbox-proxy-ready";
const RESOURCE = "ui/notifications/sandbox-resource-ready";
const HOST_ORIGIN = new URLSearchParams(location.search).get("host");

let inner = null;

window.addEventListener("message", (event) => {
  const message = event.data;
  if (event.source === window.parent && event.origin === HOST_ORIGIN) {
    if (message?.method === RESOURCE) {
      if (inner) return;
      inner = document.createElement("iframe");
      inner.setAttribute("sandbox", message.params?.sandbox ?? "allow-scripts");
      inner.srcdoc = String(message.params?.html ?? "");
      document.body.append(inner);
      return;
    }
    inner?.contentWindow?.postMessage(message, "*");
  } else if (inner && event.source === inner.contentWindow) {
    if (typeof message?.method === "string" && message.method.startsWith("ui/notifications/sandbox-")) return;
    window.parent.postMessage(message, HOST_ORIGIN);
  }
});

window.parent.postMessage({ jsonrpc: "2.0", method: READY, params: {} }, HOST_ORIGIN);
