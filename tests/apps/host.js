// The host side of the MCP Apps bridge, as a web host runs it, for the browser tests
// (apps.test.mjs bundles this file with esbuild and serves it with host.html). It uses the
// extension's own AppBridge and PostMessageTransport and the spec's double iframe: the sandbox
// proxy (sandbox.html, on a second origin, served with the policy built from the view's
// `_meta.ui.csp`) frames the view in an iframe sandboxed to scripts only (an opaque origin: no
// access to this page, its storage or cookies). The view gets the tool's input and then its
// result; its tools/call, resources/read and download requests go to the test driver
// (window.driverCallTool / driverReadResource, exposed by Playwright), which holds the MCP
// connection to the server.
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

const host = { events: [], bridge: null };
window.host = host;

// Mounts `html` as a view through the sandbox proxy at `proxy` (its `csp` as the proxy's policy),
// then sends the call's input and result; resolves once the view has completed the bridge's
// handshake, with the milliseconds from mounting to it.
host.mount = async ({ html, csp, proxy, toolInput, toolResult, theme = "light" }) => {
  if (host.bridge) await host.bridge.close().catch(() => {});
  document.getElementById("view")?.remove();
  host.events.length = 0;
  const iframe = document.createElement("iframe");
  iframe.id = "view";
  iframe.setAttribute("sandbox", "allow-scripts allow-same-origin");
  const query = new URLSearchParams({ host: location.origin, csp: JSON.stringify(csp ?? {}) });
  iframe.src = `${proxy}/sandbox.html?${query}`;
  const bridge = new AppBridge(
    null,
    { name: "cim-test-host", version: "1.0.0" },
    { serverTools: {}, serverResources: {}, downloadFile: {} },
    { hostContext: { theme, displayMode: "inline", platform: "web" } },
  );
  host.bridge = bridge;
  bridge.oncalltool = (params) => window.driverCallTool(params);
  bridge.onreadresource = (params) => window.driverReadResource(params);
  bridge.onsizechange = ({ height }) => {
    host.events.push({ sizechange: height });
    if (height) iframe.style.height = `${Math.ceil(height)}px`;
  };
  bridge.onopenlink = async (params) => {
    host.events.push({ openlink: params });
    return {};
  };
  bridge.ondownloadfile = async (params) => {
    host.events.push({ download: params });
    return {};
  };
  bridge.onmessage = async (params) => {
    host.events.push({ message: params });
    return {};
  };
  const initialized = new Promise((resolve) => {
    bridge.oninitialized = resolve;
  });
  const proxyReady = new Promise((resolve) => {
    bridge.onsandboxready = resolve;
  });
  const started = performance.now();
  document.body.append(iframe);
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  await proxyReady;
  await bridge.sendSandboxResourceReady({ html, sandbox: "allow-scripts", csp });
  await initialized;
  const handshakeMs = performance.now() - started;
  await bridge.sendToolInput({ arguments: toolInput });
  await bridge.sendToolResult(toolResult);
  return { handshakeMs, started };
};
