// The files view of list_session_files, an MCP App (src/apps/mod.rs composes it after the
// extension's app library, which defines `ExtApps`, and common.js). The host sends the listing
// over the bridge; the view shows each file's name, size and type, previews a file on request
// (images as images, CSV as a grid, any other text as text: HTML too, never rendered) by reading
// its session:// resource through the host, offers it for download through the host, and lists
// again on request (a tools/call through the host, with the host's own authorization).
//
// Names and contents come from code the user ran: nothing of them is ever parsed as HTML (see
// common.js). The document's policy allows only its one script (by hash) and no network.

performance.mark("view-start");
// Text previews show at most this much of a file.
const PREVIEW_TEXT_CHARS = 200_000;
// A CSV preview parses at most this many rows into its grid.
const PREVIEW_CSV_ROWS = 100_000;
const NUMBER = /^-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

let sessionId = null;

function formatSize(bytes) {
  if (!Number.isFinite(bytes)) return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

// RFC 4180 CSV (quoted fields, doubled quotes, CRLF or LF) as a grid's table: the first row names
// the columns; cells that are numbers become numbers (so they sort by value), empty ones null.
function parseCsv(text) {
  const rows = [];
  let row = [];
  let field = "";
  let quoted = false;
  let i = 0;
  while (i < text.length && rows.length <= PREVIEW_CSV_ROWS) {
    const ch = text[i];
    if (quoted) {
      if (ch === '"' && text[i + 1] === '"') {
        field += '"';
        i += 2;
        continue;
      }
      if (ch === '"') quoted = false;
      else field += ch;
      i += 1;
      continue;
    }
    if (ch === '"' && field === "") quoted = true;
    else if (ch === ",") {
      row.push(field);
      field = "";
    } else if (ch === "\n" || ch === "\r") {
      if (ch === "\r" && text[i + 1] === "\n") i += 1;
      row.push(field);
      rows.push(row);
      row = [];
      field = "";
    } else field += ch;
    i += 1;
  }
  if (field !== "" || row.length > 0) {
    row.push(field);
    rows.push(row);
  }
  const [header = [], ...body] = rows;
  const data = body.slice(0, PREVIEW_CSV_ROWS).map((cells) =>
    header.map((_, c) => {
      const cell = cells[c] ?? "";
      if (cell === "") return null;
      return NUMBER.test(cell) ? Number(cell) : cell;
    }),
  );
  return {
    columns: header,
    index: data.map((_, r) => String(r)),
    data,
    total_rows: i < text.length ? data.length + 1 : data.length,
    total_columns: header.length,
  };
}

async function preview(file, pane) {
  pane.replaceChildren(element("h2", "", file.path), element("p", "note", "Reading…"));
  delete pane.dataset.previewed;
  let read;
  try {
    read = await app.readServerResource({ uri: file.uri });
  } catch (error) {
    pane.replaceChildren(
      element("h2", "", file.path),
      element("p", "note", `The file could not be read: ${error?.message ?? error}`),
    );
    return;
  }
  const content = Array.isArray(read?.contents) ? read.contents[0] : null;
  const mime = typeof content?.mimeType === "string" ? content.mimeType : file.mime_type;
  const body = element("div", "preview-body");
  if (typeof content?.blob === "string" && IMAGES.includes(mime)) {
    const img = imageElement(mime, content.blob, file.path);
    body.append(img ?? element("p", "note", "Not a valid image."));
  } else if (typeof content?.text === "string" && (mime === "text/csv" || /\.csv$/i.test(file.path))) {
    grid(parseCsv(content.text), body);
  } else if (typeof content?.text === "string") {
    const text = content.text;
    body.append(element("pre", "", text.slice(0, PREVIEW_TEXT_CHARS)));
    if (text.length > PREVIEW_TEXT_CHARS) {
      body.append(element("p", "note", `The first ${PREVIEW_TEXT_CHARS.toLocaleString()} characters.`));
    }
  } else {
    body.append(element("p", "note", `No preview for ${mime || "this file"}: download it instead.`));
  }
  pane.replaceChildren(element("h2", "", file.path), body);
  pane.dataset.previewed = file.path;
}

function render(result) {
  performance.mark("result");
  view.replaceChildren();
  delete document.documentElement.dataset.rendered;
  const listed = result?.structuredContent;
  if (!listed || typeof listed !== "object") {
    const block = Array.isArray(result?.content) ? result.content.find((b) => b?.type === "text") : null;
    textSection("text", "Files", block?.text ?? "No listing.");
  } else if (listed.success === false) {
    textSection("error", "Error", listed.error?.message ?? "The session's files could not be listed.");
  } else {
    listing(listed);
  }
  requestAnimationFrame(() => {
    performance.mark("rendered");
    document.documentElement.dataset.rendered = "true";
  });
}

function listing(listed) {
  if (typeof listed.session_id === "string") sessionId = listed.session_id;
  const files = (Array.isArray(listed.files) ? listed.files : []).filter(
    (f) => f && typeof f.path === "string" && typeof f.uri === "string" && f.uri.startsWith("session://"),
  );
  const host = app.getHostCapabilities() ?? {};
  const into = section("files-section", `Session files (${files.length})`);
  const tools = element("div", "grid-tools");
  const status = element("span", "files-status");
  if (host.serverTools && sessionId) {
    const refresh = button("files-refresh", "List again", async () => {
      try {
        render(await app.callServerTool({ name: "list_session_files", arguments: { session_id: sessionId } }));
      } catch (error) {
        status.textContent = `Could not list the files: ${error?.message ?? error}`;
      }
    });
    tools.append(refresh);
  }
  tools.append(status);
  into.append(tools);
  if (!host.serverResources) {
    into.append(element("p", "note", "This host does not let views read the server's resources: no previews."));
  }
  const table = element("table", "grid files");
  const head = element("tr");
  for (const name of ["Name", "Size", "Type", ""]) head.append(element("th", "", name));
  table.append(element("thead"), element("tbody"));
  table.tHead.append(head);
  const pane = section("preview-section", "Preview");
  pane.hidden = true;
  for (const file of files) {
    const tr = element("tr");
    const actions = element("td", "files-actions");
    if (host.serverResources) {
      actions.append(
        button("files-preview", "Preview", () => {
          pane.hidden = false;
          preview(file, pane);
        }),
      );
    }
    if (host.downloadFile) {
      const link = { type: "resource_link", uri: file.uri, name: file.path, mimeType: file.mime_type };
      actions.append(button("files-download", "Download", () => download(app, link, file.path, status)));
    }
    tr.append(
      element("td", "files-name", file.path),
      element("td", "number", formatSize(file.size)),
      element("td", "", typeof file.mime_type === "string" ? file.mime_type : ""),
      actions,
    );
    table.tBodies[0].append(tr);
  }
  const scroller = element("div", "grid-scroll");
  scroller.append(table);
  into.append(scroller);
  if (files.length === 0) into.append(element("p", "empty", "No files."));
  if (listed.truncated || listed.files_left_out > 0) {
    into.append(element("p", "note", `${Number(listed.files_left_out) || "Some"} files are not listed.`));
  }
  // (The preview pane after the list.)
  view.append(pane);
}

const app = new ExtApps.App({ name: "code-interpreter-mcp files", version: "1" }, {}, {
  autoResize: true,
});
app.ontoolinput = (params) => {
  const id = params?.arguments?.session_id;
  if (typeof id === "string") sessionId = id;
};
app.ontoolresult = (result) => render(result);
await connect(app);
