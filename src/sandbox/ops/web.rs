//! The ops behind web.js's Web APIs: text decoding, Base64, URL parsing (the `url` crate), OS
//! randomness, the clock, a zero-delay yield, and HTTPS fetch to allowlisted hosts (performed by the
//! engine's `Fetcher`).

use std::cell::RefCell;
use std::rc::Rc;

use base64::Engine as _;
use deno_core::{OpState, ToJsBuffer, op2};
use deno_error::JsErrorBox;

use super::state;

#[op2]
#[string]
pub(super) fn op_sandbox_decode(
    #[string] label: String,
    #[buffer] data: &[u8],
    fatal: bool,
    ignore_bom: bool,
) -> Result<String, JsErrorBox> {
    let encoding = encoding_rs::Encoding::for_label(label.as_bytes()).ok_or_else(|| {
        JsErrorBox::range_error(format!("the encoding label {label:?} is not supported"))
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
    let invalid = || JsErrorBox::type_error(format!("Invalid URL: {href:?}"));
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
    state(op_state).started.elapsed().as_secs_f64() * 1000.0
}

/// Resolves on the next turn of the event loop: a zero-delay task (timers have a 1 ms floor).
#[op2(async(deferred), fast)]
pub(super) async fn op_sandbox_yield() {}

#[op2]
#[serde]
pub(super) async fn op_sandbox_fetch(
    op_state: Rc<RefCell<OpState>>,
    #[string] url: String,
    #[string] method: String,
    #[serde] headers: Vec<(String, String)>,
    #[serde] body: Option<deno_core::JsBuffer>,
) -> Result<JsResponse, JsErrorBox> {
    let (fetcher, enabled) = {
        let op_state = op_state.borrow();
        let s = state(&op_state);
        (s.shared.fetcher.clone(), s.downloads_enabled)
    };
    if !enabled {
        return Err(JsErrorBox::generic(
            crate::fetch::FetchError::Disabled.to_string(),
        ));
    }
    let r = fetcher
        .fetch(url, method, headers, body.map(|b| b.to_vec()))
        .await
        .map_err(|e| JsErrorBox::generic(e.to_string()))?;
    Ok(JsResponse {
        status: r.status,
        status_text: r.status_text,
        url: r.url,
        redirected: r.redirected,
        headers: r.headers,
        body: r.body.into(),
    })
}

/// A fetch response as handed to JavaScript.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct JsResponse {
    status: u16,
    status_text: String,
    url: String,
    redirected: bool,
    headers: Vec<(String, String)>,
    body: ToJsBuffer,
}
