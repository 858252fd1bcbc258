// What every view shares (src/apps/mod.rs puts it before each view's own module code): building
// DOM from untrusted data without ever parsing it as HTML (textContent and fixed attributes only),
// images from checked Base64, JSON without prototype keys, a grid for tables, the host's theme.

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

// A button that calls `onClick`.
function button(className, label, onClick) {
  const node = element("button", className, label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

// Hands `content` (one item of a download: an embedded resource or a resource link) to `app`'s
// host to save; what went wrong, if anything, goes into `status`, after `what`.
async function download(app, content, what, status) {
  status.textContent = "";
  try {
    const { isError } = await app.downloadFile({ contents: [content] });
    if (isError) status.textContent = `${what}: the download was refused or cancelled.`;
  } catch (error) {
    status.textContent = `${what}: ${error?.message ?? error}`;
  }
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

// --- Tables --------------------------------------------------------------------------------------

const PAGE_ROWS = 100;
const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });

function cellText(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// A table (`columns`, `index`, `data` rows, `total_rows`, `total_columns`: see src/apps/mod.rs
// `take_tables`) as a grid in `into`: a header per column that sorts on click (again: the other
// way), a filter over every cell's text, and pages of PAGE_ROWS rows; only the page is in the DOM.
// Columns are kept as arrays and the order as row numbers, so sorting moves no row data.
function grid(table, into) {
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

  const tools = element("div", "grid-tools");
  const filter = element("input", "grid-filter");
  filter.type = "search";
  filter.placeholder = "Filter rows";
  filter.setAttribute("aria-label", "Filter rows");
  const previous = button("grid-previous", "Previous", () => {
    page -= 1;
    paint();
  });
  const next = button("grid-next", "Next", () => {
    page += 1;
    paint();
  });
  const status = element("span", "grid-status");
  tools.append(filter, previous, next, status);
  const scroller = element("div", "grid-scroll");
  const tableNode = element("table", "grid");
  const head = element("thead");
  const headRow = element("tr");
  const buttons = headers.map((name, c) => {
    const th = element("th");
    th.setAttribute("scope", "col");
    th.append(button("grid-sort", name, () => sortBy(c)));
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
  paint();
}

// An image from Base64 of one of the IMAGES types, or null.
function imageElement(mime, base64, alt) {
  if (!IMAGES.includes(mime) || typeof base64 !== "string" || !BASE64.test(base64)) return null;
  const img = element("img", "image");
  img.alt = alt;
  img.src = `data:${mime};base64,${base64}`;
  return img;
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

// Connects a view's `app` (its own handlers set) to the host: a cancelled call said, the host's
// theme followed, teardown answered.
async function connect(app) {
  app.ontoolcancelled = () => {
    view.replaceChildren(element("p", "empty", "The call was cancelled."));
  };
  app.onhostcontextchanged = (context) => applyContext(context);
  app.onteardown = async () => ({});
  await app.connect();
  performance.mark("connected");
  applyContext(app.getHostContext());
}
