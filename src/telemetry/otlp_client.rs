//! The HTTP client trace exports go through: the server's own reqwest client (rustls, the
//! operator's CA files, no redirects) on the main runtime, so no second reqwest major and no
//! blocking client. Each export is a POST of the exporter's protobuf body with its content type
//! and encoding and the configured headers only: the exporter's other headers, which include
//! `OTEL_EXPORTER_OTLP_*HEADERS` from the environment, are dropped, as the configuration is the
//! source of truth. A deadline bounds each request and at most 64 KiB of a response is read.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use code_interpreter_mcp_config::TraceSettings;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// Most of a collector's answer that is read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Sends OTLP exports (see the module doc).
pub(super) struct OtlpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
    timeout: Duration,
}

impl std::fmt::Debug for OtlpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are secrets: only their names.
        let names: Vec<_> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("OtlpClient")
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl OtlpClient {
    pub(super) fn new(
        client: reqwest::Client,
        runtime: tokio::runtime::Handle,
        settings: &TraceSettings,
    ) -> Self {
        let headers = settings
            .headers
            .iter()
            .filter_map(|(name, value)| {
                let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
                let mut value = HeaderValue::from_str(value.expose()).ok()?;
                value.set_sensitive(true);
                Some((name, value))
            })
            .collect();
        Self {
            client,
            runtime,
            headers: Arc::new(headers),
            timeout: settings.export_timeout,
        }
    }
}

#[async_trait]
impl HttpClient for OtlpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut post = self
            .client
            .post(parts.uri.to_string())
            .timeout(self.timeout)
            .body(body);
        for name in [CONTENT_TYPE, CONTENT_ENCODING] {
            if let Some(value) = parts.headers.get(&name) {
                post = post.header(name, value.clone());
            }
        }
        for (name, value) in self.headers.iter() {
            post = post.header(name.clone(), value.clone());
        }
        // The SDK's export thread polls this outside tokio: the request runs on the runtime.
        let sent = self.runtime.spawn(async move {
            let mut response = post.send().await?;
            let mut answer = Response::builder().status(response.status());
            if let Some(retry_after) = response.headers().get(RETRY_AFTER) {
                answer = answer.header(RETRY_AFTER, retry_after.clone());
            }
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                let room = MAX_RESPONSE_BYTES - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() == MAX_RESPONSE_BYTES {
                    break;
                }
            }
            Ok::<_, HttpError>(answer.body(Bytes::from(body))?)
        });
        sent.await?
    }
}
