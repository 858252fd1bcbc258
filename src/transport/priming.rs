//! SSE priming events (SEP-1699: an event with an `id` and empty `data`, sent first on a stream so
//! the client can resume it) only for clients whose protocol has them (2025-11-25 on). rmcp sends
//! one on every SSE stream; a client of an older version parses its empty `data` as a JSON-RPC
//! message and logs an error on every request (`mcp` 1.9.4). The version is the request's
//! `MCP-Protocol-Version` header, else the version an `initialize` body asks for, else 2025-03-26
//! (what the specification tells a server to assume without the header).

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use http_body_util::BodyExt as _;

use crate::tools::era::Era;

/// The version assumed for a request that names none (MCP 2025-06-18, "Protocol Version Header").
const UNNAMED: &str = "2025-03-26";

/// The era of a request from its headers and, for a body that may be an `initialize` request, that
/// body (no other body is read for it).
pub fn era(headers: &HeaderMap, initialize: Option<&[u8]>) -> Era {
    if let Some(version) = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
    {
        return Era::of_version(Some(version));
    }
    #[derive(serde::Deserialize)]
    struct Initialize {
        method: String,
        params: Params,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        protocol_version: String,
    }
    match initialize.map(serde_json::from_slice::<Initialize>) {
        Some(Ok(init)) if init.method == "initialize" => {
            Era::of_version(Some(&init.params.protocol_version))
        }
        _ => Era::of_version(Some(UNNAMED)),
    }
}

/// `response` without priming events when `era` has none (other responses are left as they are).
pub fn filter(era: Era, response: Response) -> Response {
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if era.priming() || !sse {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = body.map_frame(|frame| match frame.into_data() {
        Ok(data) => http_body::Frame::data(without_priming(data)),
        Err(frame) => frame,
    });
    Response::from_parts(parts, Body::new(body))
}

/// `data` (whole SSE events, as rmcp writes one per frame) without the events that carry an `id`
/// or `retry` and no data; anything else, or a frame that does not end an event, is kept as is.
fn without_priming(data: Bytes) -> Bytes {
    let Ok(text) = std::str::from_utf8(&data) else {
        return data;
    };
    if !text.ends_with("\n\n") {
        return data;
    }
    let kept: Vec<&str> = text
        .split_inclusive("\n\n")
        .filter(|event| !is_priming(event))
        .collect();
    if kept.iter().map(|e| e.len()).sum::<usize>() == text.len() {
        return data;
    }
    Bytes::from(kept.concat())
}

fn is_priming(event: &str) -> bool {
    let mut control = false;
    for line in event.lines().filter(|l| !l.is_empty()) {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        match field {
            "id" | "retry" => control = true,
            "data" if value.trim().is_empty() => {}
            _ => return false,
        }
    }
    control
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priming_events_are_dropped_and_messages_kept() {
        let priming = Bytes::from_static(b"id: 0\nretry: 3000\ndata:\n\n");
        assert!(without_priming(priming).is_empty());
        let retry_only = Bytes::from_static(b"retry: 3000\n\n");
        assert!(without_priming(retry_only).is_empty());
        let message = Bytes::from_static(b"data: {\"jsonrpc\":\"2.0\"}\nid: 1\n\n");
        assert_eq!(without_priming(message.clone()), message);
        let keep_alive = Bytes::from_static(b":\n\n");
        assert_eq!(without_priming(keep_alive.clone()), keep_alive);
        let both = Bytes::from_static(b"id: 0\ndata:\n\ndata: {}\n\n");
        assert_eq!(without_priming(both), Bytes::from_static(b"data: {}\n\n"));
        let partial = Bytes::from_static(b"id: 0\ndata:\n");
        assert_eq!(without_priming(partial.clone()), partial);
    }

    #[test]
    fn the_era_comes_from_the_header_or_the_initialize_body() {
        let mut headers = HeaderMap::new();
        let init = |v: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{v}","capabilities":{{}},"clientInfo":{{"name":"c","version":"1"}}}}}}"#
            )
        };
        assert_eq!(
            era(&headers, Some(init("2025-03-26").as_bytes())),
            Era::Unstructured
        );
        assert_eq!(
            era(&headers, Some(init("2025-11-25").as_bytes())),
            Era::Resumable
        );
        assert_eq!(
            era(&headers, None),
            Era::Unstructured,
            "a body not read for it"
        );
        assert_eq!(
            era(&headers, Some(b"{}")),
            Era::Unstructured,
            "no header: 2025-03-26"
        );
        headers.insert("mcp-protocol-version", "2025-06-18".parse().unwrap());
        assert_eq!(era(&headers, Some(b"{}")), Era::Structured);
    }
}
