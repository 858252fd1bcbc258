// Web APIs that Pyodide and Python's `js` module use, each backed by an op (web.rs) where it touches
// the host: encoding, URL parsing, Base64, time and timers, randomness, HTTPS fetch to allowlisted
// hosts, and a console whose output goes to the sandbox's stderr. Installed on `globalThis` when this
// module is evaluated.

import { core } from "ext:core/mod.js";

const {
  op_sandbox_atob,
  op_sandbox_btoa,
  op_sandbox_decode,
  op_sandbox_fetch,
  op_sandbox_fetch_body,
  op_sandbox_fetch_body_into,
  op_sandbox_now,
  op_sandbox_random_fill,
  op_sandbox_url_parse,
  op_sandbox_write,
  op_sandbox_yield,
} = core.ops;

// ---------------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------------

class TextEncoder {
  get encoding() {
    return "utf-8";
  }
  encode(input = "") {
    return core.encode(String(input));
  }
  encodeInto(input, dest) {
    const encoded = core.encode(String(input));
    if (encoded.length <= dest.length) {
      dest.set(encoded);
      return { read: String(input).length, written: encoded.length };
    }
    // Copy whole code points while they fit.
    let read = 0;
    let written = 0;
    for (const ch of String(input)) {
      const bytes = core.encode(ch);
      if (written + bytes.length > dest.length) break;
      dest.set(bytes, written);
      written += bytes.length;
      read += ch.length;
    }
    return { read, written };
  }
}

class TextDecoder {
  #label;
  #fatal;
  #ignoreBOM;
  constructor(label = "utf-8", options = {}) {
    this.#label = String(label).trim().toLowerCase();
    this.#fatal = !!options.fatal;
    this.#ignoreBOM = !!options.ignoreBOM;
    // Validate the label now, as the standard requires.
    op_sandbox_decode(this.#label, new Uint8Array(0), false, true);
  }
  get encoding() {
    return this.#label;
  }
  get fatal() {
    return this.#fatal;
  }
  get ignoreBOM() {
    return this.#ignoreBOM;
  }
  decode(input = new Uint8Array(0), _options = undefined) {
    let bytes;
    if (input instanceof Uint8Array) {
      bytes = input;
    } else if (ArrayBuffer.isView(input)) {
      bytes = new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
    } else {
      bytes = new Uint8Array(input);
    }
    return op_sandbox_decode(this.#label, bytes, this.#fatal, this.#ignoreBOM);
  }
}

// ---------------------------------------------------------------------------------------------------
// URL (parsed by the `url` crate)
// ---------------------------------------------------------------------------------------------------

class URLSearchParams {
  #pairs = [];
  constructor(init = "") {
    if (typeof init === "string") {
      const s = init.startsWith("?") ? init.slice(1) : init;
      for (const part of s.split("&")) {
        if (part === "") continue;
        const eq = part.indexOf("=");
        const k = eq === -1 ? part : part.slice(0, eq);
        const v = eq === -1 ? "" : part.slice(eq + 1);
        this.#pairs.push([decodeParam(k), decodeParam(v)]);
      }
    } else if (init && typeof init === "object") {
      const entries = Symbol.iterator in init ? init : Object.entries(init);
      for (const [k, v] of entries) this.#pairs.push([String(k), String(v)]);
    }
  }
  get(name) {
    const hit = this.#pairs.find(([k]) => k === name);
    return hit ? hit[1] : null;
  }
  getAll(name) {
    return this.#pairs.filter(([k]) => k === name).map(([, v]) => v);
  }
  has(name) {
    return this.#pairs.some(([k]) => k === name);
  }
  set(name, value) {
    this.delete(name);
    this.#pairs.push([String(name), String(value)]);
  }
  append(name, value) {
    this.#pairs.push([String(name), String(value)]);
  }
  delete(name) {
    this.#pairs = this.#pairs.filter(([k]) => k !== name);
  }
  entries() {
    return this.#pairs.map((p) => [...p])[Symbol.iterator]();
  }
  [Symbol.iterator]() {
    return this.entries();
  }
  toString() {
    return this.#pairs
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)
      .join("&");
  }
}

function decodeParam(s) {
  try {
    return decodeURIComponent(s.replaceAll("+", " "));
  } catch {
    return s;
  }
}

class URL {
  #p;
  constructor(url, base = undefined) {
    this.#p = op_sandbox_url_parse(String(url), base === undefined ? null : String(base));
  }
  static canParse(url, base = undefined) {
    try {
      new URL(url, base);
      return true;
    } catch {
      return false;
    }
  }
  get href() { return this.#p.href; }
  set href(value) { this.#p = op_sandbox_url_parse(String(value), null); }
  get origin() { return this.#p.origin; }
  get protocol() { return this.#p.protocol; }
  get username() { return this.#p.username; }
  get password() { return this.#p.password; }
  get host() { return this.#p.host; }
  get hostname() { return this.#p.hostname; }
  get port() { return this.#p.port; }
  get pathname() { return this.#p.pathname; }
  get search() { return this.#p.search; }
  get hash() { return this.#p.hash; }
  get searchParams() { return new URLSearchParams(this.#p.search); }
  toString() { return this.#p.href; }
  toJSON() { return this.#p.href; }
}

// ---------------------------------------------------------------------------------------------------
// Base64, time, timers, randomness
// ---------------------------------------------------------------------------------------------------

function btoa(data) {
  return op_sandbox_btoa(String(data));
}

function atob(data) {
  return op_sandbox_atob(String(data));
}

// Set when the sandbox boots (this module may have been evaluated long before, into the V8 startup
// snapshot).
let timeOrigin = 0;

/** Called when the sandbox boots: `performance.timeOrigin` is then. */
export function setTimeOrigin() {
  timeOrigin = Date.now();
}
const performance = {
  now: () => op_sandbox_now(),
  get timeOrigin() {
    return timeOrigin;
  },
  mark() {},
  measure() {},
};

const timers = new Map();
let nextTimerId = 1;

function addTimer(callback, delay, args, repeat) {
  if (typeof callback !== "function") {
    throw new TypeError("timer callback must be a function");
  }
  const id = nextTimerId++;
  // Browsers clamp delays to a signed 32-bit millisecond count.
  const ms = Math.min(Math.max(Number(delay) || 0, 0), 2147483647);
  const timer = core.createTimer(
    () => {
      if (!repeat) timers.delete(id);
      // An exception in a timer callback is reported, as a browser does, and ends nothing else.
      try {
        callback(...args);
      } catch (error) {
        reportUncaught("in a timer callback", error);
      }
    },
    ms,
    undefined,
    repeat,
    true,
  );
  timers.set(id, timer);
  return id;
}

function clearTimer(id) {
  const timer = timers.get(id);
  if (timer !== undefined) {
    timers.delete(id);
    core.cancelTimer(timer);
  }
}

const setTimeout = (cb, delay = 0, ...args) => addTimer(cb, delay, args, false);
const setInterval = (cb, delay = 0, ...args) => addTimer(cb, delay, args, true);
const clearTimeout = (id) => clearTimer(id);
const clearInterval = (id) => clearTimer(id);

/**
 * The part of MessageChannel that Pyodide uses to schedule zero-delay tasks (asyncio's call_soon):
 * a message posted on port2 reaches port1.onmessage on the next event-loop turn, without the 1 ms
 * floor of timers.
 */
class MessageChannel {
  constructor() {
    const port1 = { onmessage: null, start() {}, close() {} };
    const port2 = {
      postMessage(data) {
        op_sandbox_yield().then(() => port1.onmessage?.({ data }));
      },
      start() {},
      close() {},
    };
    this.port1 = port1;
    this.port2 = port2;
  }
}

const crypto = {
  getRandomValues(view) {
    if (!ArrayBuffer.isView(view) || view instanceof Float32Array || view instanceof Float64Array) {
      throw new TypeError("getRandomValues needs an integer typed array");
    }
    if (view.byteLength > 65536) {
      throw new RangeError("getRandomValues is limited to 65536 bytes");
    }
    op_sandbox_random_fill(new Uint8Array(view.buffer, view.byteOffset, view.byteLength));
    return view;
  },
  randomUUID() {
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  },
};

// ---------------------------------------------------------------------------------------------------
// fetch: HTTPS to allowlisted hosts only, performed by Rust
// ---------------------------------------------------------------------------------------------------

class Headers {
  #map = new Map();
  constructor(init = undefined) {
    if (init instanceof Headers) {
      for (const [k, v] of init) this.append(k, v);
    } else if (Array.isArray(init)) {
      for (const [k, v] of init) this.append(k, v);
    } else if (init && typeof init === "object") {
      for (const [k, v] of Object.entries(init)) this.append(k, v);
    }
  }
  append(name, value) {
    const key = String(name).toLowerCase();
    const prev = this.#map.get(key);
    this.#map.set(key, prev === undefined ? String(value) : `${prev}, ${value}`);
  }
  set(name, value) {
    this.#map.set(String(name).toLowerCase(), String(value));
  }
  get(name) {
    return this.#map.get(String(name).toLowerCase()) ?? null;
  }
  has(name) {
    return this.#map.has(String(name).toLowerCase());
  }
  delete(name) {
    this.#map.delete(String(name).toLowerCase());
  }
  forEach(fn, thisArg = undefined) {
    for (const [k, v] of this.#map) fn.call(thisArg, v, k, this);
  }
  keys() {
    return this.#map.keys();
  }
  values() {
    return this.#map.values();
  }
  entries() {
    return this.#map.entries();
  }
  [Symbol.iterator]() {
    return this.#map.entries();
  }
}

/**
 * A body fetch() received, still in Rust: a reader of the Response takes it as an ArrayBuffer of its
 * own (`op_sandbox_fetch_body`), and pyodide.http's `bytes()` has it copied straight into Python's
 * memory (`takeHeldInto`, through http.py), so that no ArrayBuffer of it is ever made.
 */
class HeldBody {
  constructor(id, length) {
    this.id = id;
    this.length = length;
  }
}

// The bodies fetch() received: a whole ArrayBuffer of their own, which nothing else can reach once
// the response hands it out (a body is read once), so it is handed out without a copy.
const fetched = new WeakSet();

/** The length of the body a Response from fetch() holds in Rust unread, else -1. */
export let heldLength;
/** Copies that body into `target`, a Uint8Array of exactly its length, and marks it read. */
export let takeHeldInto;

class Response {
  #body;
  constructor(body, init = {}) {
    this.#body = body ?? new Uint8Array(0);
    this.status = init.status ?? 200;
    this.statusText = init.statusText ?? "";
    this.headers = new Headers(init.headers);
    this.url = init.url ?? "";
    this.redirected = !!init.redirected;
    this.type = "basic";
    this.bodyUsed = false;
  }
  get ok() {
    return this.status >= 200 && this.status < 300;
  }
  /**
   * The body as a stream with a reader (what urllib3's streaming requests read): the bytes, already
   * in memory, in one chunk.
   */
  get body() {
    if (this.#stream === undefined) {
      const take = () => this.#take();
      let done = false;
      const reader = {
        read: async () => {
          if (done) return { done: true, value: undefined };
          done = true;
          return { done: false, value: take() };
        },
        cancel: async () => {
          done = true;
        },
        releaseLock() {},
      };
      this.#stream = { getReader: () => reader, cancel: reader.cancel, locked: false };
    }
    return this.#stream;
  }
  #stream = undefined;
  /** The body's bytes, handed over by Rust first if fetch() left them there. */
  #bytes() {
    if (this.#body instanceof HeldBody) {
      const received = new Uint8Array(op_sandbox_fetch_body(this.#body.id));
      fetched.add(received);
      this.#body = received;
    }
    return this.#body;
  }
  #take() {
    if (this.bodyUsed) throw new TypeError("Body has already been consumed");
    this.bodyUsed = true;
    return this.#bytes();
  }
  static {
    heldLength = (response) =>
      #body in response && response.#body instanceof HeldBody && !response.bodyUsed
        ? response.#body.length
        : -1;
    takeHeldInto = (response, target) => {
      if (heldLength(response) < 0) throw new TypeError("no unread body held for this response");
      op_sandbox_fetch_body_into(response.#body.id, target);
      response.bodyUsed = true;
      response.#body = new Uint8Array(0);
    };
  }
  async bytes() {
    const body = this.#take();
    return fetched.has(body) ? body : body.slice();
  }
  async arrayBuffer() {
    const body = this.#take();
    return fetched.has(body) ? body.buffer : body.slice().buffer;
  }
  async text() {
    return op_sandbox_decode("utf-8", this.#take(), false, false);
  }
  async json() {
    return JSON.parse(await this.text());
  }
  clone() {
    if (this.bodyUsed) throw new TypeError("Body has already been consumed");
    return new Response(this.#bytes().slice(), this);
  }
}

class AbortSignal {
  aborted = false;
  reason = undefined;
  addEventListener() {}
  removeEventListener() {}
  throwIfAborted() {
    if (this.aborted) throw this.reason;
  }
}

class AbortController {
  signal = new AbortSignal();
  abort(reason = new Error("aborted")) {
    this.signal.aborted = true;
    this.signal.reason = reason;
  }
}


async function fetch(input, init = {}) {
  const url = input instanceof Request ? input.url : String(input);
  const method = String(init.method ?? (input instanceof Request ? input.method : "GET")).toUpperCase();
  const headers = [...new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined))];
  let body = null;
  if (init.body !== undefined && init.body !== null) {
    if (typeof init.body === "string") body = core.encode(init.body);
    else if (init.body instanceof ArrayBuffer) body = new Uint8Array(init.body);
    else if (ArrayBuffer.isView(init.body)) {
      body = new Uint8Array(init.body.buffer, init.body.byteOffset, init.body.byteLength);
    } else body = core.encode(String(init.body));
  }
  const res = await op_sandbox_fetch(url, method, headers, body);
  return new Response(new HeldBody(res.body, res.bodyLength), {
    status: res.status,
    statusText: res.statusText,
    headers: res.headers,
    url: res.url,
    redirected: res.redirected,
  });
}

class Request {
  constructor(input, init = {}) {
    this.url = input instanceof Request ? input.url : String(input);
    this.method = String(init.method ?? "GET").toUpperCase();
    this.headers = new Headers(init.headers);
  }
}

// ---------------------------------------------------------------------------------------------------
// console: user-visible output goes to the sandbox's stderr, never to the server's own streams
// ---------------------------------------------------------------------------------------------------

function formatArgs(args) {
  return args
    .map((a) => {
      if (typeof a === "string") return a;
      try {
        return a instanceof Error ? String(a.stack ?? a) : JSON.stringify(a) ?? String(a);
      } catch {
        return String(a);
      }
    })
    .join(" ");
}

const toStderr = (...args) => op_sandbox_write(2, core.encode(formatArgs(args) + "\n"));

/** How a value thrown by user code reads, whatever it is (a Proxy, an object whose getters throw). */
function describe(value) {
  try {
    return value instanceof Error ? String(value.stack ?? value) : String(value);
  } catch {
    return "(a value that cannot be printed)";
  }
}

/**
 * Reports an exception nobody caught (in a timer, a microtask or a promise) on the sandbox's stderr,
 * as a browser reports it on its console; the call goes on. Uses only functions captured here.
 */
function reportUncaught(where, error) {
  try {
    op_sandbox_write(2, core.encode(`Uncaught JavaScript exception ${where}: ${describe(error)}\n`));
  } catch {
    // Nothing is left to report it with.
  }
}

// Unhandled promise rejections and exceptions in microtasks would otherwise end the event loop
// with an error; they are the user's code's, and a browser only reports them.
core.setUnhandledPromiseRejectionHandler((_promise, reason) => {
  reportUncaught("(in a promise)", reason);
  return true;
});
core.setReportExceptionCallback((error) => reportUncaught("in a microtask", error));
const console = {
  log: toStderr,
  info: toStderr,
  warn: toStderr,
  error: toStderr,
  debug: toStderr,
  trace: toStderr,
};

// ---------------------------------------------------------------------------------------------------
// Install the Web APIs
// ---------------------------------------------------------------------------------------------------

for (const [name, value] of Object.entries({
  TextEncoder,
  TextDecoder,
  URL,
  URLSearchParams,
  btoa,
  atob,
  performance,
  setTimeout,
  setInterval,
  clearTimeout,
  clearInterval,
  crypto,
  fetch,
  Headers,
  Response,
  Request,
  AbortController,
  AbortSignal,
  MessageChannel,
  console,
})) {
  Object.defineProperty(globalThis, name, {
    value,
    writable: true,
    configurable: true,
    enumerable: false,
  });
}
