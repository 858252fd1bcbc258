//! OpenTelemetry traces as an operator's collector receives them: an OTLP/HTTP receiver in the
//! test decodes the official protobuf messages (`ExportTraceServiceRequest`) the server exports.
//! A tool call continues the caller's trace (W3C `traceparent` from `_meta`, else the HTTP header),
//! its queue wait, sandbox boot, execution, session steps and upstream calls are its children,
//! nothing the code wrote or named reaches an attribute, the configured headers (and only they)
//! go to the collector, and a collector that never answers slows no call and holds no shutdown.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{Value, json};

use crate::fixture::{Background, Server, client, message, send_stateless, tool_call_body};

/// Span kinds as OTLP numbers them.
const INTERNAL: i32 = 1;
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
/// `Status.code` of an error.
const ERROR: i32 = 2;

/// What the receiver got: every span, the `service.name` of each export, each export's headers.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    services: Vec<String>,
    headers: Vec<Vec<(String, String)>>,
}

/// An OTLP/HTTP traces receiver on a port of its own (`hang`: one that never answers).
struct Collector {
    url: String,
    received: Arc<Mutex<Received>>,
    _server: Background,
}

impl Collector {
    fn start(hang: bool) -> Self {
        let server = Background::bind();
        let url = format!("http://127.0.0.1:{}/v1/traces", server.port);
        let received = Arc::new(Mutex::new(Received::default()));
        let r = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let r = r.clone();
                    async move {
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        let export = ExportTraceServiceRequest::decode(body).unwrap();
                        let mut r = r.lock().unwrap();
                        r.headers.push(
                            headers
                                .iter()
                                .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
                                .collect(),
                        );
                        for resource in export.resource_spans {
                            let service = resource
                                .resource
                                .iter()
                                .flat_map(|r| &r.attributes)
                                .find(|a| a.key == "service.name")
                                .map(|a| text(a.value.as_ref()))
                                .unwrap_or_default();
                            for scope in resource.scope_spans {
                                r.services.push(service.clone());
                                r.spans.extend(scope.spans);
                            }
                        }
                        (
                            [("content-type", "application/x-protobuf")],
                            Vec::<u8>::new(),
                        )
                    }
                },
            ),
        );
        Self {
            url,
            received,
            _server: server.serve(app),
        }
    }

    /// The spans of trace `trace_id` once `done` holds for them (within 20 s).
    fn trace(&self, trace_id: &[u8], done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans: Vec<Span> = {
                let r = self.received.lock().unwrap();
                r.spans
                    .iter()
                    .filter(|s| s.trace_id == trace_id)
                    .cloned()
                    .collect()
            };
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "trace {} incomplete: {:#?}",
                hex::encode(trace_id),
                names(&spans)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// An attribute value as text.
fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(n)) => n.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .map(|a| text(a.value.as_ref()))
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", names(spans)))
}

/// Whether `child` is a child of `parent` that ran within it (a millisecond of slack).
fn within(child: &Span, parent: &Span) -> bool {
    const SLACK: u64 = 1_000_000;
    child.parent_span_id == parent.span_id
        && child.trace_id == parent.trace_id
        && child.start_time_unix_nano + SLACK >= parent.start_time_unix_nano
        && child.end_time_unix_nano <= parent.end_time_unix_nano + SLACK
        && child.start_time_unix_nano <= child.end_time_unix_nano
}

fn random_id<const N: usize>() -> [u8; N] {
    let mut id = [0u8; N];
    getrandom::fill(&mut id).unwrap();
    id[0] |= 1;
    id
}

/// A run_python_code call of the 2026-07-28 era, with `traceparent` in `_meta` or in the HTTP
/// header.
fn call(server: &Server, arguments: Value, meta: Option<&str>, header: Option<&str>) -> Value {
    let mut body = tool_call_body("run_python_code", arguments, None);
    if let Some(traceparent) = meta {
        body["params"]["_meta"]["traceparent"] = json!(traceparent);
        body["params"]["_meta"]["tracestate"] = json!("vendor=opaque");
    }
    let http = match header {
        Some(traceparent) => {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert("traceparent", traceparent.parse().unwrap());
            reqwest::blocking::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap()
        }
        None => client(),
    };
    let response = send_stateless(
        &http,
        &server.url,
        "tools/call",
        Some("run_python_code"),
        &body,
    )
    .unwrap();
    assert_eq!(response.status(), 200);
    message(response)
}

/// The marker planted in code, output, upstream arguments and file names.
const MARKER: &str = "MARKER-7f3a";

#[test]
fn a_tool_call_is_a_span_of_the_callers_trace_with_its_steps_as_children() {
    let collector = Collector::start(false);
    let dir = crate::common::temp_dir("traces");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[integrations.opentelemetry.headers]\nx-collector-key = \"${{TRACES_TEST_KEY}}\"\n\n\
[upstream.everything]\ncommand = {:?}\nargs = [{:?}, \"stdio\"]\ntools = [\"echo\"]\n",
            crate::upstream::node(),
            crate::upstream::everything()
        ),
    )
    .unwrap();
    let server = Server::start_with_args(
        &["--config", config.to_str().unwrap()],
        &[
            exporting_to(&collector.url).as_slice(),
            &[
                ("TRACES_TEST_KEY", "key-123"),
                // Ignored: the configuration is the source of truth.
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-from-env=leak"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://127.0.0.1:9/v1/traces",
                ),
            ],
        ]
        .concat(),
    );

    // 1. `traceparent` in `_meta`: a first call boots its sandbox, runs, calls an upstream tool.
    let (trace_1, parent_1) = (random_id::<16>(), random_id::<8>());
    let traceparent = format!("00-{}-{}-01", hex::encode(trace_1), hex::encode(parent_1));
    let code = format!(
        "print({MARKER:?})\nfrom upstream import everything\nr = await everything.echo(message={MARKER:?})\n\
open('{MARKER}.txt', 'w').write('x')\nprint('Echo' in str(r))"
    );
    let input = base64::engine::general_purpose::STANDARD.encode(MARKER);
    let reply = call(
        &server,
        json!({"code": code, "files": [{"path": format!("{MARKER}.csv"), "content_base64": input}]}),
        Some(&traceparent),
        None,
    );
    assert_eq!(
        reply["result"]["structuredContent"]["stdout"],
        format!("{MARKER}\nTrue\n"),
        "{reply}"
    );
    let spans = collector.trace(&trace_1, |s| {
        s.iter().any(|s| s.name == "tools/call run_python_code")
            && s.iter().any(|s| s.name == "sandbox.execute")
            && s.iter().any(|s| s.name == "upstream.call everything")
    });
    let root = named(&spans, "tools/call run_python_code");
    assert_eq!(
        root.parent_span_id, parent_1,
        "the caller's span is the parent"
    );
    assert_eq!(root.kind, SERVER);
    assert_eq!(attr(root, "mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(
        attr(root, "gen_ai.tool.name").as_deref(),
        Some("run_python_code")
    );
    assert_eq!(attr(root, "jsonrpc.request.id").as_deref(), Some("7"));
    assert_eq!(
        attr(root, "code_interpreter.outcome").as_deref(),
        Some("success")
    );
    assert_eq!(
        attr(root, "code_interpreter.code_bytes"),
        Some(code.len().to_string())
    );
    assert_eq!(
        attr(root, "code_interpreter.input_files").as_deref(),
        Some("1")
    );
    assert_eq!(
        attr(root, "code_interpreter.output_files").as_deref(),
        Some("1")
    );
    assert_eq!(
        attr(root, "code_interpreter.stdout_bytes"),
        Some((MARKER.len() + 6).to_string())
    );
    assert!(
        root.trace_state.contains("vendor=opaque"),
        "{}",
        root.trace_state
    );
    for step in ["queue.wait", "sandbox.boot", "sandbox.execute"] {
        let child = named(&spans, step);
        assert!(within(child, root), "{step} is not a child within the call");
        assert_eq!(child.kind, INTERNAL, "{step}");
    }
    let upstream = named(&spans, "upstream.call everything");
    assert_eq!(upstream.kind, CLIENT);
    assert!(
        within(upstream, root),
        "the upstream call is a child of the call"
    );
    assert_eq!(attr(upstream, "gen_ai.tool.name").as_deref(), Some("echo"));
    assert_eq!(
        attr(upstream, "code_interpreter.outcome").as_deref(),
        Some("ok")
    );
    // The queue wait comes before the boot, the boot before the execution.
    let start = |name| named(&spans, name).start_time_unix_nano;
    assert!(start("queue.wait") <= start("sandbox.boot"));
    assert!(start("sandbox.boot") <= start("sandbox.execute"));

    // 2. `traceparent` as an HTTP header only; a Python error is the span's error.
    let (trace_2, parent_2) = (random_id::<16>(), random_id::<8>());
    let header = format!("00-{}-{}-01", hex::encode(trace_2), hex::encode(parent_2));
    let reply = call(&server, json!({"code": "1/0"}), None, Some(&header));
    assert!(reply.to_string().contains("ZeroDivisionError"), "{reply}");
    let spans = collector.trace(&trace_2, |s| {
        s.iter().any(|s| s.name == "tools/call run_python_code")
    });
    let root = named(&spans, "tools/call run_python_code");
    assert_eq!(root.parent_span_id, parent_2);
    assert_eq!(
        attr(root, "code_interpreter.outcome").as_deref(),
        Some("python_error")
    );
    assert_eq!(root.status.as_ref().map(|s| s.code), Some(ERROR));

    // 3. `_meta` wins over the header; a session call has its own steps.
    let (trace_3, parent_3) = (random_id::<16>(), random_id::<8>());
    let meta = format!("00-{}-{}-01", hex::encode(trace_3), hex::encode(parent_3));
    call(
        &server,
        json!({"code": "x = 1", "session_id": "new"}),
        Some(&meta),
        Some(&header),
    );
    let spans = collector.trace(&trace_3, |s| {
        s.iter().any(|s| s.name == "tools/call run_python_code")
            && s.iter().any(|s| s.name == "sandbox.execute")
    });
    let root = named(&spans, "tools/call run_python_code");
    assert_eq!(root.parent_span_id, parent_3);
    assert_eq!(
        attr(root, "code_interpreter.session").as_deref(),
        Some("true")
    );
    for step in ["session.create", "session.wait", "sandbox.execute"] {
        assert!(within(named(&spans, step), root), "{step}");
    }

    // 4. Without a trace context, a call starts a trace of its own.
    call(&server, json!({"code": "2 + 2"}), None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    let roots = loop {
        let r = collector.received.lock().unwrap();
        let roots: Vec<Span> = r
            .spans
            .iter()
            .filter(|s| s.name == "tools/call run_python_code" && s.parent_span_id.is_empty())
            .cloned()
            .collect();
        if !roots.is_empty() || Instant::now() > deadline {
            break roots;
        }
        drop(r);
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        roots.len(),
        1,
        "one root span for the call without a context"
    );
    assert!(
        ![trace_1, trace_2, trace_3].contains(&roots[0].trace_id.as_slice().try_into().unwrap())
    );

    // Nothing the code wrote, sent or named is in a span; the collector got the configured
    // header and not the environment's.
    let r = collector.received.lock().unwrap();
    for span in &r.spans {
        assert!(!span.name.contains(MARKER), "{}", span.name);
        for a in &span.attributes {
            let value = text(a.value.as_ref());
            assert!(!value.contains(MARKER), "{} = {value}", a.key);
        }
    }
    assert!(
        r.services.iter().all(|s| s == "code-interpreter-mcp"),
        "{:?}",
        r.services
    );
    for headers in &r.headers {
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("x-collector-key"), Some("key-123"));
        assert_eq!(get("x-from-env"), None);
        assert_eq!(get("content-type"), Some("application/x-protobuf"));
    }
}

/// The median of `n` back-to-back calls of `1 + 1`, in milliseconds.
fn median_call_ms(server: &Server, n: usize) -> f64 {
    let mut ms: Vec<f64> = (0..n)
        .map(|_| {
            let started = Instant::now();
            let reply = call(server, json!({"code": "1 + 1"}), None, None);
            assert_ne!(reply["result"]["isError"], true, "{reply}");
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[n / 2]
}

/// The environment that has a server export its spans to `url` every 100 ms.
fn exporting_to(url: &str) -> [(&'static str, &str); 3] {
    [
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_ENABLED",
            "true",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_ENDPOINT",
            url,
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_EXPORT_INTERVAL_MS",
            "100",
        ),
    ]
}

#[test]
fn a_collector_that_never_answers_slows_no_call_and_holds_no_shutdown() {
    let collector = Collector::start(true);
    let envs = [
        ("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
    ];
    let plain = Server::start(&envs);
    let traced = Server::start(
        &[
            envs.as_slice(),
            exporting_to(&collector.url).as_slice(),
            &[
                (
                    "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_EXPORT_TIMEOUT_MS",
                    "1000",
                ),
                (
                    "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_MAX_QUEUE_SPANS",
                    "64",
                ),
                (
                    "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_MAX_BATCH_SPANS",
                    "8",
                ),
            ],
        ]
        .concat(),
    );
    median_call_ms(&plain, 5);
    median_call_ms(&traced, 5);
    let (a, b) = (median_call_ms(&plain, 30), median_call_ms(&traced, 30));
    println!("median call: {a:.1} ms without tracing, {b:.1} ms exporting to a dead collector");
    assert!(
        b <= a * 1.5 + 20.0,
        "tracing to a collector that never answers slowed calls: {a:.1} -> {b:.1} ms"
    );
    // The shutdown waits for the last export at most export_timeout_ms.
    let mut traced = traced;
    let started = Instant::now();
    // SAFETY: signalling a child process this test started.
    unsafe { libc::kill(traced.child.id() as i32, libc::SIGTERM) };
    let status = traced.child.wait().unwrap();
    let took = started.elapsed();
    println!("shutdown with a dead collector: {took:?}");
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
}
