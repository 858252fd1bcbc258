// The result view of run_python_code, an MCP App (src/apps/mod.rs composes it after the extension's
// app library, which defines `ExtApps`; plotly.js, which defines `Plotly`, is in the document as
// inert text that `plotly()` runs when a result has a figure). The host sends the
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

// --- Tables --------------------------------------------------------------------------------------

const PAGE_ROWS = 100;
const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });

function cellText(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// A DataFrame's first rows as a grid: a header per column that sorts on click (again: the other
// way), a filter over every cell's text, and pages of PAGE_ROWS rows; only the page is in the DOM.
// Columns are kept as arrays and the order as row numbers, so sorting moves no row data.
function grid(table, heading) {
  const rows = Array.isArray(table.data) ? table.data.filter(Array.isArray) : [];
  const names = Array.isArray(table.columns) ? table.columns.map(cellText) : [];
  const index = Array.isArray(table.index) ? table.index.map(cellText) : [];
  const columns = [rows.map((_, r) => index[r] ?? String(r)), ...names.map((_, c) => rows.map((row) => row[c]))];
  const headers = ["", ...names];
  const count = rows.length;
  const text = columns.map((column) => column.map(cellText));
  let order = Uint32Array.from({ length: count }, (_, r) => r);
  let shown = order;
  let sorted = { column: -1, ascending: true };
  let query = "";
  let lower = null;
  let page = 0;

  const into = section("table-section", heading);
  const tools = element("div", "grid-tools");
  const filter = element("input", "grid-filter");
  filter.type = "search";
  filter.placeholder = "Filter rows";
  filter.setAttribute("aria-label", "Filter rows");
  const previous = element("button", "grid-previous", "Previous");
  const next = element("button", "grid-next", "Next");
  const status = element("span", "grid-status");
  tools.append(filter, previous, next, status);
  const scroller = element("div", "grid-scroll");
  const tableNode = element("table", "grid");
  const head = element("thead");
  const headRow = element("tr");
  const buttons = headers.map((name, c) => {
    const th = element("th");
    th.setAttribute("scope", "col");
    const button = element("button", "grid-sort", name);
    button.type = "button";
    button.addEventListener("click", () => sortBy(c));
    th.append(button);
    headRow.append(th);
    return th;
  });
  head.append(headRow);
  let body = element("tbody");
  tableNode.append(head, body);
  scroller.append(tableNode);
  into.append(tools, scroller);
  const total = Number.isSafeInteger(table.total_rows) ? table.total_rows : count;
  const totalColumns = Number.isSafeInteger(table.total_columns) ? table.total_columns : names.length;
  if (total > count || totalColumns > names.length) {
    into.append(
      element(
        "p",
        "note",
        `The first ${count.toLocaleString()} of ${total.toLocaleString()} rows and ` +
          `${names.length} of ${totalColumns} columns are here.`,
      ),
    );
  }

  function paint() {
    const pages = Math.max(1, Math.ceil(shown.length / PAGE_ROWS));
    page = Math.min(Math.max(page, 0), pages - 1);
    const from = page * PAGE_ROWS;
    const to = Math.min(shown.length, from + PAGE_ROWS);
    const fresh = element("tbody");
    for (let i = from; i < to; i++) {
      const r = shown[i];
      const tr = element("tr");
      for (let c = 0; c < columns.length; c++) {
        const cell = element(c === 0 ? "th" : "td", typeof columns[c][r] === "number" ? "number" : "", text[c][r]);
        if (c === 0) cell.setAttribute("scope", "row");
        tr.append(cell);
      }
      fresh.append(tr);
    }
    body.replaceWith(fresh);
    body = fresh;
    const of = shown.length === count ? "" : ` (filtered from ${count.toLocaleString()})`;
    status.textContent = shown.length === 0
      ? `No rows${of}`
      : `Rows ${(from + 1).toLocaleString()}–${to.toLocaleString()} of ${shown.length.toLocaleString()}${of}`;
    previous.disabled = page === 0;
    next.disabled = page >= pages - 1;
    buttons.forEach((th, c) => {
      th.setAttribute(
        "aria-sort",
        c !== sorted.column ? "none" : sorted.ascending ? "ascending" : "descending",
      );
    });
  }

  // Numbers (and nulls, last) by value when every value of the column is one; else text, in the
  // user's collation, numbers inside text by value.
  function sortBy(c) {
    sorted = { column: c, ascending: sorted.column === c ? !sorted.ascending : true };
    const column = columns[c];
    const sign = sorted.ascending ? 1 : -1;
    const numeric = c > 0 && column.every((v) => v === null || typeof v === "number");
    let compare;
    if (numeric) {
      const keys = Float64Array.from(column, (v) => (v === null ? NaN : v));
      compare = (a, b) => {
        const x = keys[a];
        const y = keys[b];
        if (Number.isNaN(x) || Number.isNaN(y)) return Number.isNaN(x) - Number.isNaN(y) || a - b;
        return (x - y) * sign || a - b;
      };
    } else {
      const keys = text[c];
      compare = (a, b) => {
        const x = column[a] === null ? 1 : 0;
        const y = column[b] === null ? 1 : 0;
        return x - y || collator.compare(keys[a], keys[b]) * sign || a - b;
      };
    }
    order = Uint32Array.from({ length: count }, (_, r) => r).sort(compare);
    page = 0;
    apply();
  }

  function apply() {
    if (query === "") {
      shown = order;
    } else {
      lower ??= text.map((column) => column.map((t) => t.toLowerCase()));
      shown = order.filter((r) => lower.some((column) => column[r].includes(query)));
    }
    paint();
    performance.mark("grid-painted");
  }

  filter.addEventListener("input", () => {
    query = filter.value.trim().toLowerCase();
    page = 0;
    apply();
  });
  previous.addEventListener("click", () => {
    page -= 1;
    paint();
  });
  next.addEventListener("click", () => {
    page += 1;
    paint();
  });
  paint();
}

function image(mime, base64, heading) {
  if (!IMAGES.includes(mime) || typeof base64 !== "string" || !BASE64.test(base64)) return;
  const img = element("img", "image");
  img.alt = heading;
  img.src = `data:${mime};base64,${base64}`;
  section("image-section", heading).append(img);
}

// One rich output: a figure, a table's grid, an image, or its Markdown or plain text.
function display(data, n, tables) {
  if (!data || typeof data !== "object") return;
  const heading = `Output ${n + 1}`;
  if (typeof data[PLOTLY] === "string") return figure(data[PLOTLY], heading);
  if (tables.has(n)) return grid(tables.get(n), heading);
  for (const mime of IMAGES) {
    if (typeof data[mime] === "string") return image(mime, data[mime], heading);
  }
  textSection("display", heading, data["text/markdown"] ?? data["text/plain"]);
}

function renderStructured(result, tables) {
  textSection("stdout", "Output", result.stdout);
  (Array.isArray(result.displays) ? result.displays : []).forEach((d, n) => display(d?.data, n, tables));
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
      if (tables.has(n - 1)) grid(tables.get(n - 1), `Output ${n}`);
      else textSection("text", "Output", block.text);
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
