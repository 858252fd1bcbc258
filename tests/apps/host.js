// The host side of the MCP Apps bridge, as a web host runs it, for the browser tests
// (apps.test.mjs bundles this file with esbuild and serves it with host.html). It uses the
// extension's own AppBridge and PostMessageTransport: the view runs in an iframe sandboxed to
// scripts only (an opaque origin: no access to this page, its storage or cookies), gets the tool's
// input and then its result, and its tools/call and resources/read requests go to the test driver
// (window.driverCallTool / driverReadResource, exposed by Playwright), which holds the MCP
// connection to the server.
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

const host = { events: [], bridge: null };
window.host = host;

// Mounts `html` as a view, then sends the call's input and result; resolves once the view has
// completed the bridge's handshake, with the milliseconds from mounting to it.
host.mount = async ({ html, toolInput, toolResult, theme = "light" }) => {
  if (host.bridge) await host.bridge.close().catch(() => {});
  document.getElementById("view")?.remove();
  host.events.length = 0;
  const iframe = document.createElement("iframe");
  iframe.id = "view";
  iframe.setAttribute("sandbox", "allow-scripts");
  document.body.append(iframe);
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
  const started = performance.now();
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  iframe.srcdoc = html;
  await initialized;
  const handshakeMs = performance.now() - started;
  await bridge.sendToolInput({ arguments: toolInput });
  await bridge.sendToolResult(toolResult);
  return { handshakeMs, started };
};
