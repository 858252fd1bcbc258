// The result view of run_python_code, an MCP App (src/apps/mod.rs composes it after the extension's
// app library, which defines `ExtApps`, and plotly.js, which defines `Plotly`). The host sends the
// call's result over the bridge; the view draws its plotly figures (zoom, hover, legend), images,
// output and error.
//
// Everything drawn comes from code the user ran, so nothing of it is ever parsed as HTML: text goes
// through textContent, images only as data: URLs of checked Base64, figures as JSON (prototype keys
// dropped) handed to plotly.js, which draws its own text as SVG text. The document's policy allows
// only its two scripts (by hash) and no network: see src/apps/assets.rs.

performance.mark("view-start");
const PLOTLY = "application/vnd.plotly.v1+json";
const IMAGES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;
const PROTOTYPE_KEYS = new Set(["__proto__", "constructor", "prototype"]);
const view = document.getElementById("view");

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function section(kind, heading) {
  const node = element("section", kind);
  node.append(element("h2", "", heading));
  view.append(node);
  return node;
}

function textSection(kind, heading, text) {
  if (typeof text !== "string" || text === "") return;
  section(kind, heading).append(element("pre", "", text));
}

function parseJson(text) {
  return JSON.parse(text, (key, value) => (PROTOTYPE_KEYS.has(key) ? undefined : value));
}

// The trace types the cartesian bundle registers (Plotly.PlotSchema.get() lists the same, in
// 40-60 ms of a first paint; the browser test checks the two agree).
const DRAWABLE = new Set([
  "scatter", "bar", "box", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "contour",
  "scatterternary", "violin", "image", "pie",
]);

const pending = [];

function figure(spec, heading) {
  const into = section("figure-section", heading);
  let figure;
  try {
    figure = typeof spec === "string" ? parseJson(spec) : spec;
  } catch {
    into.append(element("p", "note", "The figure is not valid JSON."));
    return;
  }
  if (!figure || typeof figure !== "object") return;
  const layout = figure.layout && typeof figure.layout === "object" ? figure.layout : {};
  // Images in a layout only from data: URLs (the policy would block any other anyway).
  if (Array.isArray(layout.images)) {
    layout.images = layout.images.filter(
      (image) => typeof image?.source === "string" && image.source.startsWith("data:image/"),
    );
  }
  const traces = [];
  const missing = new Set();
  for (const trace of Array.isArray(figure.data) ? figure.data : []) {
    if (!trace || typeof trace !== "object") continue;
    // plotly express switches to WebGL (scattergl) above 1,000 points; this bundle has no WebGL
    // (it would need eval), and SVG scatter reads the same attributes.
    let type = typeof trace.type === "string" ? trace.type : "scatter";
    if (type === "scattergl") type = "scatter";
    if (!DRAWABLE.has(type)) {
      missing.add(type);
      continue;
    }
    traces.push({ ...trace, type });
  }
  const div = element("div", "figure");
  into.append(div);
  if (missing.size > 0) {
    into.append(
      element(
        "p",
        "note",
        `Not drawn here (trace types this view does not have): ${[...missing].join(", ")}. ` +
          "The figure's figure-N.html file has them.",
      ),
    );
  }
  pending.push(
    Plotly.newPlot(div, traces, layout, {
      responsive: true,
      displaylogo: false,
      modeBarButtonsToRemove: ["toImage", "sendDataToCloud"],
    }).catch((error) => {
      into.append(element("p", "note", `The figure could not be drawn: ${error}`));
    }),
  );
}

function image(mime, base64, heading) {
  if (!IMAGES.includes(mime) || typeof base64 !== "string" || !BASE64.test(base64)) return;
  const img = element("img", "image");
  img.alt = heading;
  img.src = `data:${mime};base64,${base64}`;
  section("image-section", heading).append(img);
}

// One rich output: a figure, an image, or its Markdown or plain text.
function display(data, n) {
  if (!data || typeof data !== "object") return;
  const heading = `Output ${n + 1}`;
  if (typeof data[PLOTLY] === "string") return figure(data[PLOTLY], heading);
  for (const mime of IMAGES) {
    if (typeof data[mime] === "string") return image(mime, data[mime], heading);
  }
  textSection("display", heading, data["text/markdown"] ?? data["text/plain"]);
}

function renderStructured(result) {
  textSection("stdout", "Output", result.stdout);
  (Array.isArray(result.displays) ? result.displays : []).forEach((d, n) => display(d?.data, n));
  // Returned images (matplotlib's figure-N.png among them); other files are named in the text.
  for (const file of Array.isArray(result.files) ? result.files : []) {
    if (file && typeof file.path === "string") image(file.mime_type, file.content_base64, file.path);
  }
  if (typeof result.result === "string") textSection("value", "Result", result.result);
  textSection("stderr", "Standard error", result.stderr);
  const error = result.error;
  if (error && typeof error === "object") {
    const name = error.type ?? error.error_type ?? error.kind ?? "Error";
    const text = [error.traceback, `${name}: ${error.message ?? ""}`].filter(Boolean).join("\n");
    textSection("error", "Error", text);
  }
}

// A result without structured content (an older protocol, or results.structured_content = false):
// the first text block is the result's JSON; figures come as embedded resources, images as blocks.
function renderBlocks(blocks) {
  let n = 0;
  for (const block of blocks) {
    if (block?.type === "text" && n === 0) {
      try {
        const result = parseJson(block.text);
        if (result && typeof result === "object" && "stdout" in result) {
          textSection("stdout", "Output", result.stdout);
          if (typeof result.result === "string") textSection("value", "Result", result.result);
          textSection("stderr", "Standard error", result.stderr);
          n += 1;
          continue;
        }
      } catch {}
      textSection("text", "Output", block.text);
    } else if (block?.type === "image") {
      image(block.mimeType, block.data, `Image ${n + 1}`);
    } else if (block?.type === "resource" && block.resource?.mimeType === PLOTLY) {
      figure(block.resource.text, `Output ${n + 1}`);
    }
    n += 1;
  }
}

async function render(result) {
  performance.mark("result");
  view.replaceChildren();
  delete document.documentElement.dataset.rendered;
  pending.length = 0;
  const structured = result?.structuredContent;
  if (structured && typeof structured === "object") {
    renderStructured(structured);
  } else if (Array.isArray(result?.content)) {
    renderBlocks(result.content);
  }
  if (view.childElementCount === 0) view.append(element("p", "empty", "No output."));
  await Promise.all(pending);
  requestAnimationFrame(() => {
    performance.mark("rendered");
    document.documentElement.dataset.rendered = "true";
  });
}

// The host's theme and style variables, when it sends them (names checked, values as CSS text).
function applyContext(context) {
  if (!context || typeof context !== "object") return;
  if (context.theme === "dark" || context.theme === "light") {
    document.documentElement.dataset.theme = context.theme;
  }
  const variables = context.styles?.variables;
  if (variables && typeof variables === "object") {
    for (const [name, value] of Object.entries(variables)) {
      if (/^--[A-Za-z0-9-]+$/.test(name) && typeof value === "string") {
        document.documentElement.style.setProperty(name, value);
      }
    }
  }
}

const app = new ExtApps.App({ name: "code-interpreter-mcp result", version: "1" }, {}, {
  autoResize: true,
});
app.ontoolresult = (result) => render(result);
app.ontoolcancelled = () => {
  view.replaceChildren(element("p", "empty", "The call was cancelled."));
};
app.onhostcontextchanged = (context) => applyContext(context);
app.onteardown = async () => ({});
await app.connect();
performance.mark("connected");
applyContext(app.getHostContext());
