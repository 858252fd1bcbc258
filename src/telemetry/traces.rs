//! OpenTelemetry traces: a span per tool call (`tools/call {tool}`, kind server) continuing the
//! caller's W3C trace context, with children for where its time went (`queue.wait`,
//! `sandbox.boot`, `sandbox.execute`, `session.wait`, `session.resume`, `upstream.call {server}`),
//! exported over OTLP/HTTP (protobuf) by the SDK's batch processor on its own thread through
//! [`otlp_client`](super::otlp_client). A facade like the metrics: with tracing off nothing is
//! installed and every call here is a no-op.
//!
//! A call's span is made where the call comes in and scoped to its future as a task-local
//! ([`CallSpan::scope`]); the layers below it add children through [`current`] after the fact,
//! dated with the instants they measured, so the pool and the sessions stay ignorant of
//! OpenTelemetry. Spans carry fixed names, outcomes, durations and sizes: never code, output,
//! file names, session or task ids, tokens or claims. A full export queue drops spans; nothing
//! here waits for the collector.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use code_interpreter_mcp_config::TraceSettings;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt as _, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, Span,
};

use super::otlp_client::OtlpClient;

/// The installed tracer, when tracing is on.
struct Installed {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    principal_attribute: bool,
    export_timeout: Duration,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

tokio::task_local! {
    static CURRENT: CallSpan;
}

/// Starts exporting spans as `settings` say, through `client` (its requests run on `runtime`).
/// Once per process; later calls are ignored.
pub fn install(
    settings: &TraceSettings,
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<()> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OtlpClient::new(client, runtime, settings))
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(settings.export_timeout)
        .build()?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(settings.max_queue_spans)
        .with_max_export_batch_size(settings.max_batch_spans)
        .with_scheduled_delay(settings.export_interval)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sample_ratio,
        ))))
        .with_resource(
            Resource::builder_empty()
                .with_service_name(settings.service_name.clone())
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        )
        .build();
    let tracer = provider.tracer("code-interpreter-mcp");
    let installed = Installed {
        provider,
        tracer,
        principal_attribute: settings.principal_attribute,
        export_timeout: settings.export_timeout,
    };
    if INSTALLED.set(installed).is_ok() {
        tracing::info!(endpoint = %settings.endpoint, "trace export on");
    }
    Ok(())
}

/// Exports the spans still queued, waiting at most `export_timeout` (blocks the calling thread;
/// the exports themselves run on the runtime given to [`install`], which must still run).
pub fn shutdown() {
    if let Some(installed) = INSTALLED.get()
        && let Err(e) = installed
            .provider
            .shutdown_with_timeout(installed.export_timeout)
    {
        tracing::warn!(error = %e, "the last spans were not all exported");
    }
}

/// Whether tool-call spans carry the caller's principal label.
pub fn principal_attribute() -> bool {
    INSTALLED.get().is_some_and(|i| i.principal_attribute)
}

/// A caller's trace context (W3C `traceparent` and `tracestate`), or a span's for its children.
#[derive(Clone, Debug)]
pub struct TraceParent(SpanContext);

impl TraceParent {
    /// The context `traceparent`/`tracestate` name (from a request's `_meta`, else its HTTP
    /// headers); `None` when tracing is off or they are absent or malformed.
    pub fn received(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        INSTALLED.get()?;
        let fields = Fields {
            traceparent: traceparent?,
            tracestate,
        };
        let context = TraceContextPropagator::new().extract(&fields);
        let span = context.span().span_context().clone();
        span.is_valid().then_some(Self(span))
    }

    /// The `traceparent` and `tracestate` (if any) that continue this context elsewhere.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Headers(Vec::new());
        let context = Context::new().with_remote_span_context(self.0.clone());
        TraceContextPropagator::new().inject_context(&context, &mut out);
        out.0
    }
}

/// The two fields a W3C trace context is read from.
struct Fields<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(self.traceparent),
            "tracestate" => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// The fields a W3C trace context is written to.
struct Headers(Vec<(&'static str, String)>);

impl Injector for Headers {
    fn set(&mut self, key: &str, value: String) {
        let key = match key {
            "traceparent" => "traceparent",
            "tracestate" => "tracestate",
            _ => return,
        };
        if !value.is_empty() {
            self.0.push((key, value));
        }
    }
}

/// A tool call's span (a no-op when tracing is off or the call is not sampled); clones share it.
/// It ends when [`CallSpan::end`] is called or the last clone is dropped.
#[derive(Clone, Default)]
pub struct CallSpan(Option<Arc<Live>>);

struct Live {
    span: Mutex<Span>,
    /// One instant and the wall-clock time it stands for: children measured with `Instant`s are
    /// dated from it.
    anchor: (Instant, SystemTime),
}

impl CallSpan {
    /// Starts `name` (e.g. `tools/call run_python_code`) as a child of `parent` (a new trace
    /// without one), with `attributes`.
    pub fn start(name: String, parent: Option<&TraceParent>, attributes: Vec<KeyValue>) -> Self {
        let Some(installed) = INSTALLED.get() else {
            return Self(None);
        };
        let span = open(installed, name, SpanKind::Server, parent, attributes, None);
        if !span.span_context().is_sampled() {
            return Self(None);
        }
        Self(Some(Arc::new(Live {
            span: Mutex::new(span),
            anchor: (Instant::now(), SystemTime::now()),
        })))
    }

    /// Runs `future` with this span as the [`current`] one.
    pub async fn scope<F: Future>(self, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }

    /// This span's context, for children made elsewhere (`None` when it records nothing).
    pub fn context(&self) -> Option<TraceParent> {
        let live = self.0.as_ref()?;
        let span = live.span.lock().unwrap_or_else(|e| e.into_inner());
        Some(TraceParent(span.span_context().clone()))
    }

    /// Adds a finished child `name` that ran from `from` to `to`.
    pub fn child(&self, name: &'static str, from: Instant, to: Instant, attributes: Vec<KeyValue>) {
        let (Some(live), Some(parent)) = (&self.0, self.context()) else {
            return;
        };
        finished(&parent, name, (from, to), attributes, live.anchor);
    }

    /// Sets attributes on the span.
    pub fn set(&self, attributes: Vec<KeyValue>) {
        if let Some(live) = &self.0 {
            let mut span = live.span.lock().unwrap_or_else(|e| e.into_inner());
            span.set_attributes(attributes);
        }
    }

    /// Ends the span with `outcome` (`code_interpreter.outcome`), an error status and
    /// `error.type` when `error` names one.
    pub fn end(&self, outcome: &'static str, error: Option<&str>) {
        let Some(live) = &self.0 else {
            return;
        };
        let mut span = live.span.lock().unwrap_or_else(|e| e.into_inner());
        close(&mut span, outcome, error);
    }
}

/// The span of the call whose future this runs in (a no-op one outside any).
pub fn current() -> CallSpan {
    CURRENT.try_with(CallSpan::clone).unwrap_or_default()
}

/// A call this server makes for a traced execution (kind client), e.g. to an upstream server.
pub struct ClientSpan(Option<Span>);

impl ClientSpan {
    /// Starts `name` now, as a child of `parent` (a no-op without one).
    pub fn start(parent: Option<&TraceParent>, name: String, attributes: Vec<KeyValue>) -> Self {
        let (Some(installed), Some(parent)) = (INSTALLED.get(), parent) else {
            return Self(None);
        };
        let span = open(
            installed,
            name,
            SpanKind::Client,
            Some(parent),
            attributes,
            None,
        );
        Self(Some(span))
    }

    /// The context that continues this span at the callee.
    pub fn context(&self) -> Option<TraceParent> {
        self.0
            .as_ref()
            .map(|s| TraceParent(s.span_context().clone()))
    }

    /// Ends the span with `outcome`, an error status unless `ok`.
    pub fn end(mut self, outcome: &'static str, ok: bool) {
        if let Some(span) = &mut self.0 {
            close(span, outcome, (!ok).then_some(outcome));
        }
    }
}

/// Starts span `name` of `kind` under `parent` (a new trace without one), at `start` (now when
/// `None`).
fn open(
    installed: &Installed,
    name: impl Into<std::borrow::Cow<'static, str>>,
    kind: SpanKind,
    parent: Option<&TraceParent>,
    attributes: Vec<KeyValue>,
    start: Option<SystemTime>,
) -> Span {
    let context = parent.map_or_else(Context::new, |TraceParent(span)| {
        Context::new().with_remote_span_context(span.clone())
    });
    let mut builder = installed
        .tracer
        .span_builder(name)
        .with_kind(kind)
        .with_attributes(attributes);
    if let Some(start) = start {
        builder = builder.with_start_time(start);
    }
    builder.start_with_context(&installed.tracer, &context)
}

/// Ends `span` with `outcome` (`code_interpreter.outcome`), an error status and `error.type`
/// when `error` names one.
fn close(span: &mut Span, outcome: &'static str, error: Option<&str>) {
    span.set_attribute(KeyValue::new("code_interpreter.outcome", outcome));
    if let Some(error) = error {
        span.set_attribute(KeyValue::new("error.type", error.to_string()));
        span.set_status(Status::error(error.to_string()));
    }
    span.end();
}

/// A finished internal span under `parent` that ran from `when.0` to `when.1`, dated from
/// `anchor` (an instant and the wall-clock time it stands for).
fn finished(
    parent: &TraceParent,
    name: &'static str,
    when: (Instant, Instant),
    attributes: Vec<KeyValue>,
    anchor: (Instant, SystemTime),
) {
    let Some(installed) = INSTALLED.get() else {
        return;
    };
    let start = Some(wall(anchor, when.0));
    let mut span = open(
        installed,
        name,
        SpanKind::Internal,
        Some(parent),
        attributes,
        start,
    );
    span.end_with_timestamp(wall(anchor, when.1.max(when.0)));
}

/// The wall-clock time of `at`, given that `anchor.0` was `anchor.1`.
fn wall(anchor: (Instant, SystemTime), at: Instant) -> SystemTime {
    match at.checked_duration_since(anchor.0) {
        Some(after) => anchor.1 + after,
        None => anchor.1 - anchor.0.duration_since(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_date_from_the_anchor_both_ways() {
        let now = Instant::now();
        let then = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let later = now + Duration::from_millis(1500);
        assert_eq!(wall((now, then), later), then + Duration::from_millis(1500));
        assert_eq!(wall((later, then), now), then - Duration::from_millis(1500));
    }

    #[test]
    fn everything_is_a_no_op_while_tracing_is_off() {
        assert!(
            TraceParent::received(
                Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
                None
            )
            .is_none()
        );
        let span = CallSpan::start("tools/call x".into(), None, Vec::new());
        assert!(span.context().is_none());
        span.child("queue.wait", Instant::now(), Instant::now(), Vec::new());
        span.end("success", None);
        assert!(current().context().is_none());
    }
}
