//! A Streamable HTTP upstream: rmcp's client transport over our own reqwest client (the same
//! trust roots as the fetcher, `extra_ca_certs` included; no redirects), with every response bounded
//! before it is parsed. Only requests and their answers travel: no standalone event stream is
//! opened (the sandbox takes no server-initiated messages). Header values are credentials: they go
//! only into the requests, marked sensitive.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};

use super::{Running, Watcher};
use crate::config::Secret;

/// The client every HTTP upstream shares: trusted roots, no redirects, a connect timeout (calls
/// have their own deadlines).
pub(super) fn client(extra_ca_certs: &[PathBuf]) -> anyhow::Result<reqwest::Client> {
    Ok(crate::fetch::trusting(extra_ca_certs)?
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("code-interpreter-mcp/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// Connects to `url` as `watcher` with `headers` on every request; no message larger than
/// `max_bytes` is read.
pub(super) async fn connect(
    watcher: Watcher,
    client: reqwest::Client,
    url: &str,
    headers: &[(String, Secret)],
    max_bytes: usize,
) -> Result<Running, String> {
    let mut custom = HashMap::new();
    for (name, value) in headers {
        let name = HeaderName::try_from(name.as_str())
            .map_err(|_| format!("{name} is not a header name"))?;
        let mut value = HeaderValue::try_from(value.expose())
            .map_err(|_| format!("the value of the header {name} is not a valid header value"))?;
        value.set_sensitive(true);
        custom.insert(name, value);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string())
        .custom_headers(custom)
        .max_json_response_size(max_bytes)
        .max_sse_event_size(max_bytes)
        .reinit_on_expired_session(true);
    let transport = StreamableHttpClientTransport::with_client(Bounded(client), config);
    watcher
        .serve(transport)
        .await
        .map_err(|e| format!("the server did not complete the MCP initialization: {e}"))
}

/// Our reqwest client as rmcp's HTTP backend.
#[derive(Clone)]
struct Bounded(reqwest::Client);

type Error = StreamableHttpError<reqwest::Error>;

const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";
const SESSION_ID: &str = "mcp-session-id";

fn content_type_is(response: &reqwest::Response, expected: &str) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(expected))
}

/// The body, at most `max` bytes (else an error, having read no more than that).
async fn bounded_body(response: reqwest::Response, max: usize) -> Result<Vec<u8>, Error> {
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(StreamableHttpError::Client)?;
        if body.len() + chunk.len() > max {
            return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An event stream whose bytes together stay within `max` (one answer and its progress
/// notifications); past it the stream fails.
fn bounded_events(
    response: reqwest::Response,
    max: usize,
) -> BoxStream<'static, Result<Sse, sse_stream::Error>> {
    let mut seen = 0usize;
    let bytes = response.bytes_stream().map(move |chunk| {
        let chunk: Bytes = chunk.map_err(std::io::Error::other)?;
        seen += chunk.len();
        if seen > max {
            return Err(std::io::Error::other(format!(
                "the event stream passed {max} bytes"
            )));
        }
        Ok(chunk)
    });
    SseStream::from_bytes_stream(bytes).boxed()
}

impl StreamableHttpClient for Bounded {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        limits.max_json_response_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut request = self
            .0
            .post(uri.as_ref())
            .header(http::header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        let had_session = session_id.is_some();
        if let Some(id) = session_id {
            request = request.header(SESSION_ID, id.as_ref());
        }
        let awaits_nothing = !matches!(message, ClientJsonRpcMessage::Request(_));
        let response = request
            .json(&message)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = response.status();
        if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == reqwest::StatusCode::NOT_FOUND && had_session {
            return Err(StreamableHttpError::SessionExpired);
        }
        if !status.is_success() {
            // (The body is not read: an error page may echo what was sent.)
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}"),
            )));
        }
        let session = response
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if content_type_is(&response, EVENT_STREAM) {
            return Ok(StreamableHttpPostResponse::Sse(
                bounded_events(response, limits.max_sse_event_size.saturating_mul(4)),
                session,
            ));
        }
        if content_type_is(&response, JSON) {
            let body = bounded_body(response, limits.max_json_response_size).await?;
            return match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, session)),
                Err(_) if awaits_nothing => Ok(StreamableHttpPostResponse::Accepted),
                Err(e) => Err(StreamableHttpError::Deserialize(e)),
            };
        }
        if awaits_nothing {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(
            response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        ))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let mut request = self
            .0
            .delete(uri.as_ref())
            .header(SESSION_ID, session_id.as_ref());
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        // (Best effort: the server forgets the session on its own too.)
        let _ = request.send().await;
        Ok(())
    }

    async fn get_stream(
        &self,
        _uri: Arc<str>,
        _session_id: Option<Arc<str>>,
        _last_event_id: Option<String>,
        _auth_header: Option<String>,
        _custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, sse_stream::Error>>, Error> {
        Err(StreamableHttpError::ServerDoesNotSupportSse)
    }
}
