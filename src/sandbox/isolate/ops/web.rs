//! The ops behind web.js's Web APIs: text decoding, Base64, URL parsing (the `url` crate), OS
//! randomness, the clock, a zero-delay yield, and HTTPS fetch to allowlisted hosts (performed by the
//! engine's `Fetcher`).

use std::cell::RefCell;
use std::rc::Rc;

use base64::Engine as _;
use deno_core::{OpState, op2, v8};
use deno_error::JsErrorBox;

use super::{call_state, state};
use crate::fetch::{FetchError, SandboxRequest};
use crate::protocol::limits::shown;

#[op2]
#[string]
pub(super) fn op_sandbox_decode(
    #[string] label: String,
    #[buffer] data: &[u8],
    fatal: bool,
    ignore_bom: bool,
) -> Result<String, JsErrorBox> {
    let encoding = encoding_rs::Encoding::for_label(label.as_bytes()).ok_or_else(|| {
        JsErrorBox::range_error(format!(
            "the encoding label {} is not supported",
            shown(&label)
        ))
    })?;
    let (text, had_errors) = if ignore_bom {
        encoding.decode_without_bom_handling(data)
    } else {
        encoding.decode_with_bom_removal(data)
    };
    if fatal && had_errors {
        return Err(JsErrorBox::type_error("the encoded data is not valid"));
    }
    let decoded = text.into_owned();
    Ok(decoded)
}

#[op2]
#[string]
pub(super) fn op_sandbox_btoa(#[string] data: String) -> Result<String, JsErrorBox> {
    let bytes: Option<Vec<u8>> = data
        .chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect();
    let bytes = bytes.ok_or_else(|| {
        JsErrorBox::new(
            "InvalidCharacterError",
            "btoa: the string contains characters outside Latin-1",
        )
    })?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

#[op2]
#[string]
pub(super) fn op_sandbox_atob(#[string] data: String) -> Result<String, JsErrorBox> {
    let cleaned: String = data
        .chars()
        .filter(|c| !matches!(c, ' ' | '\t' | '\n' | '\x0c' | '\r'))
        .collect();
    // Padding is optional, but only in its canonical place.
    let body = if cleaned.len().is_multiple_of(4) {
        cleaned
            .strip_suffix("==")
            .or_else(|| cleaned.strip_suffix('='))
            .unwrap_or(&cleaned)
    } else {
        &cleaned
    };
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    let bytes = engine.decode(body.as_bytes()).map_err(|_| {
        JsErrorBox::new(
            "InvalidCharacterError",
            "atob: the string is not valid Base64",
        )
    })?;
    Ok(bytes.into_iter().map(char::from).collect())
}

#[derive(serde::Serialize)]
struct UrlParts {
    href: String,
    origin: String,
    protocol: String,
    username: String,
    password: String,
    host: String,
    hostname: String,
    port: String,
    pathname: String,
    search: String,
    hash: String,
}

#[op2]
#[serde]
pub(super) fn op_sandbox_url_parse(
    #[string] href: String,
    #[string] base: Option<String>,
) -> Result<UrlParts, JsErrorBox> {
    let invalid = || JsErrorBox::type_error(format!("Invalid URL: {}", shown(&href)));
    let url = match base {
        Some(base) => url::Url::parse(&base)
            .and_then(|b| b.join(&href))
            .map_err(|_| invalid())?,
        None => url::Url::parse(&href).map_err(|_| invalid())?,
    };
    let nonempty = |prefix: &str, s: Option<&str>| match s {
        Some(s) if !s.is_empty() => format!("{prefix}{s}"),
        _ => String::new(),
    };
    let hostname = url.host_str().unwrap_or("").to_string();
    let port = url.port().map(|p| p.to_string()).unwrap_or_default();
    Ok(UrlParts {
        href: url.as_str().to_string(),
        origin: url.origin().ascii_serialization(),
        protocol: format!("{}:", url.scheme()),
        username: url.username().to_string(),
        password: url.password().unwrap_or("").to_string(),
        host: if port.is_empty() {
            hostname.clone()
        } else {
            format!("{hostname}:{port}")
        },
        hostname,
        port,
        pathname: url.path().to_string(),
        search: nonempty("?", url.query()),
        hash: nonempty("#", url.fragment()),
    })
}

#[op2(fast)]
pub(super) fn op_sandbox_random_fill(#[buffer] data: &mut [u8]) -> Result<(), JsErrorBox> {
    getrandom::fill(data)
        .map_err(|e| JsErrorBox::generic(format!("OS randomness unavailable: {e}")))
}

#[op2(fast)]
pub(super) fn op_sandbox_now(op_state: &mut OpState) -> f64 {
    op_state
        .borrow::<WebState>()
        .started
        .elapsed()
        .as_secs_f64()
        * 1000.0
}

/// The `web` op group's state: the sandbox's time origin and whether it may still download.
pub(crate) struct WebState {
    /// `performance.now()`'s origin.
    pub started: std::time::Instant,
    /// Whether wheels and HTTPS downloads may still be fetched (false once runtime installation is
    /// disabled and initialisation is over).
    pub downloads_enabled: bool,
}

impl WebState {
    pub fn new() -> Self {
        Self {
            started: std::time::Instant::now(),
            downloads_enabled: true,
        }
    }
}

/// Resolves on the next turn of the event loop: a zero-delay task (timers have a 1 ms floor).
#[op2(async(deferred), fast)]
pub(super) async fn op_sandbox_yield() {}

/// How long after the call's deadline a user request is cut, if the watchdog has not ended it.
const FETCH_DEADLINE_SLACK: std::time::Duration = std::time::Duration::from_millis(500);

/// One HTTPS request of the call (see `src/fetch/mod.rs` for what is refused and bounded). The body stays in
/// Rust until `op_sandbox_fetch_body` hands it over, charged to the sandbox's memory budget.
#[op2]
#[serde]
pub(super) async fn op_sandbox_fetch(
    op_state: Rc<RefCell<OpState>>,
    #[string] url: String,
    #[string] method: String,
    #[serde] headers: Vec<(String, String)>,
    #[serde] body: Option<deno_core::JsBuffer>,
) -> Result<JsResponse, JsErrorBox> {
    let (fetcher, enabled, deadline) = {
        let op_state = op_state.borrow();
        let s = state(&op_state);
        // The watchdog ends the call at its deadline; the request's own cut comes a little later, so
        // a call blocked on a request always ends as a timeout rather than racing the watchdog to
        // a Python exception. (The request is aborted anyway when the sandbox ends.)
        let deadline = call_state(&op_state)
            .watchdog
            .as_ref()
            .and_then(|w| w.deadline())
            .map(|d| d + FETCH_DEADLINE_SLACK);
        let enabled = op_state.borrow::<WebState>().downloads_enabled;
        (s.shared.fetcher.clone(), enabled, deadline)
    };
    // (The operator's grants hold even where package downloads are disabled.)
    if !enabled && !fetcher.granted(&url) {
        return Err(JsErrorBox::generic(FetchError::Disabled.to_string()));
    }
    let request = SandboxRequest {
        url,
        method,
        headers,
        body: body.map(|b| b.to_vec()),
    };
    // The call's fetch state lives in the OpState; the request borrows it only while it runs.
    let fetches = {
        let op_state = op_state.borrow();
        call_state(&op_state).fetches.clone()
    };
    let r = fetcher
        .fetch(&fetches, request, deadline)
        .await
        .map_err(|e| JsErrorBox::generic(e.to_string()))?;
    // Charged to the sandbox's budget while Rust holds it, as the ArrayBuffer it may become is.
    let body_length = r.body.len();
    let charge = {
        let op_state = op_state.borrow();
        state(&op_state).budget.hold(body_length)
    }
    .ok_or_else(|| {
        JsErrorBox::range_error(format!(
            "{body_length} bytes do not fit the sandbox's memory budget"
        ))
    })?;
    let body = fetches.keep_body(r.body, Box::new(charge));
    Ok(JsResponse {
        status: r.status,
        status_text: r.status_text,
        url: r.url,
        redirected: r.redirected,
        headers: r.headers,
        body,
        body_length,
    })
}

/// The body of a response `op_sandbox_fetch` returned, as an ArrayBuffer charged to the sandbox's
/// memory budget; once.
#[op2]
pub(super) fn op_sandbox_fetch_body<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[smi] id: u32,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let body = call_state(op_state)
        .fetches
        .take_body(id)
        .ok_or_else(|| JsErrorBox::generic("no such response body"))?;
    Ok(state(op_state).budget.array_buffer(scope, body)?.into())
}

/// The body of a response `op_sandbox_fetch` returned copied into `out`, which must be exactly as
/// long (Python's bytes for it, in the WebAssembly memory: see `web.js`'s `takeHeldInto`); once. No
/// ArrayBuffer is made, so nothing is charged: the bytes land in memory the budget already counts.
#[op2(fast)]
pub(super) fn op_sandbox_fetch_body_into(
    op_state: &mut OpState,
    #[smi] id: u32,
    #[buffer] out: &mut [u8],
) -> Result<(), JsErrorBox> {
    call_state(op_state)
        .fetches
        .take_body_into(id, out)
        .map_err(JsErrorBox::type_error)
}

/// A fetch response as handed to JavaScript; the body separately (see `op_sandbox_fetch_body`).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct JsResponse {
    status: u16,
    status_text: String,
    url: String,
    redirected: bool,
    headers: Vec<(String, String)>,
    body: u32,
    body_length: usize,
}
