// The result view of run_python_code, an MCP App (src/apps/mod.rs composes it after the extension's
// app library, which defines `ExtApps`, and common.js; plotly.js, which defines `Plotly`, is in the
// document as inert text that `plotly()` runs when a result has a figure). The host sends the
// call's result over the bridge; the view draws its plotly figures (zoom, hover, legend), tables
// (sort, filter, pages: the data is in the result's `_meta`, see src/apps/mod.rs `take_tables`),
// images, output and error.
//
// Everything drawn comes from code the user ran, so nothing of it is ever parsed as HTML: text goes
// through textContent, images only as data: URLs of checked Base64, figures as JSON (prototype keys
// dropped) handed to plotly.js, which draws its own text as SVG text. The document's policy allows
// only its two scripts (by hash) and no network: see src/apps/assets.rs.

performance.mark("view-start");
const PLOTLY = "application/vnd.plotly.v1+json";


// The trace types the cartesian bundle registers (Plotly.PlotSchema.get() lists the same, in
// 40-60 ms of a first paint; the browser test checks the two agree).
const DRAWABLE = new Set([
  "scatter", "bar", "box", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "contour",
  "scatterternary", "violin", "image", "pie",
]);

const pending = [];

// Resolves once what is in the document now has been painted: the text of a result shows before
// its figures are drawn (they wait for `textPainted`, set by `render`).
const afterPaint = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
let textPainted = Promise.resolve();

// plotly.js, run once, the first time a figure is drawn: the document carries it as text (see
// src/apps/assets.rs), and a script element with the same text runs under the same hash.
let plotlyRan = false;
function plotly() {
  if (!plotlyRan) {
    plotlyRan = true;
    const script = document.createElement("script");
    script.textContent = document.getElementById("plotly-source").textContent;
    document.head.append(script);
  }
  if (typeof Plotly === "undefined") throw new Error("plotly.js did not load");
  return Plotly;
}

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
    textPainted.then(() => plotly().newPlot(div, traces, layout, {
      responsive: true,
      displaylogo: false,
      modeBarButtonsToRemove: ["toImage", "sendDataToCloud"],
    })).catch((error) => {
      into.append(element("p", "note", `The figure could not be drawn: ${error}`));
    }),
  );
}

// An image with its heading, and a Download button when the host lets views download (the image
// goes to the host as an embedded blob named `name`).
function image(mime, base64, heading, name) {
  const img = imageElement(mime, base64, heading);
  if (!img) return;
  const into = section("image-section", heading);
  into.append(img);
  if (!app.getHostCapabilities()?.downloadFile) return;
  const status = element("span", "files-status");
  const uri = `file:///${name.split("/").map(encodeURIComponent).join("/")}`;
  const resource = { type: "resource", resource: { uri, mimeType: mime, blob: base64 } };
  const tools = element("div", "grid-tools");
  tools.append(button("image-download", "Download", () => download(app, resource, name, status)), status);
  into.append(tools);
}

const EXTENSIONS = { "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp" };

// One rich output: a figure, a table's grid, an image, or its Markdown or plain text.
function display(data, n, tables) {
  if (!data || typeof data !== "object") return;
  const heading = `Output ${n + 1}`;
  if (typeof data[PLOTLY] === "string") return figure(data[PLOTLY], heading);
  if (tables.has(n)) return grid(tables.get(n), section("table-section", heading));
  for (const mime of IMAGES) {
    if (typeof data[mime] === "string") {
      return image(mime, data[mime], heading, `output-${n + 1}.${EXTENSIONS[mime]}`);
    }
  }
  textSection("display", heading, data["text/markdown"] ?? data["text/plain"]);
}

function renderStructured(result, tables) {
  textSection("stdout", "Output", result.stdout);
  (Array.isArray(result.displays) ? result.displays : []).forEach((d, n) => display(d?.data, n, tables));
  // Returned images (matplotlib's figure-N.png among them); other files are named in the text.
  for (const file of Array.isArray(result.files) ? result.files : []) {
    if (file && typeof file.path === "string") {
      image(file.mime_type, file.content_base64, file.path, file.path);
    }
  }
  // (A final expression shown as a rich output above is not repeated as text.)
  const shown = Array.isArray(result.displays) && result.displays.some((d) => d?.source === "result");
  if (typeof result.result === "string" && !shown) textSection("value", "Result", result.result);
  textSection("stderr", "Standard error", result.stderr);
  const error = result.error;
  if (error && typeof error === "object") {
    const name = error.type ?? error.error_type ?? error.kind ?? "Error";
    const text = [error.traceback, `${name}: ${error.message ?? ""}`].filter(Boolean).join("\n");
    textSection("error", "Error", text);
  }
}

// A result without structured content (an older protocol, or results.structured_content = false):
// the first text block is the result's JSON, then a block per display (a table's is its Markdown);
// figures come as embedded resources, images as blocks.
function renderBlocks(blocks, tables) {
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
      if (tables.has(n - 1)) grid(tables.get(n - 1), section("table-section", `Output ${n}`));
      else textSection("text", "Output", block.text);
    } else if (block?.type === "image") {
      image(block.mimeType, block.data, `Image ${n + 1}`, `image-${n + 1}.${EXTENSIONS[block.mimeType]}`);
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
  textPainted = afterPaint();
  // Tables' grid data, by the index of their display.
  const tables = new Map();
  const meta = result?._meta?.["code-interpreter-mcp/view"];
  for (const table of Array.isArray(meta?.tables) ? meta.tables : []) {
    if (table && typeof table === "object" && Number.isSafeInteger(table.display)) {
      tables.set(table.display, table);
    }
  }
  const structured = result?.structuredContent;
  if (structured && typeof structured === "object") {
    renderStructured(structured, tables);
  } else if (Array.isArray(result?.content)) {
    renderBlocks(result.content, tables);
  }
  if (view.childElementCount === 0) view.append(element("p", "empty", "No output."));
  await Promise.all(pending);
  requestAnimationFrame(() => {
    performance.mark("rendered");
    document.documentElement.dataset.rendered = "true";
  });
}

const app = new ExtApps.App({ name: "code-interpreter-mcp result", version: "1" }, {}, {
  autoResize: true,
});
app.ontoolresult = (result) => render(result);
await connect(app);
