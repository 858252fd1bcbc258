//! Hostile code against the sandbox's outbound requests (continued from adversarial.rs): forbidden
//! headers and methods are refused locally, and what a call may fetch is bounded.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use code_interpreter_mcp::sandbox::{Engine, EngineSettings, ErrorKind, ExecRequest};

use crate::adversarial::{error_of, js_await, still_serves};
use crate::common::{engine, engine_settings, ok, run};

// --- 7. Outbound requests ------------------------------------------------------------------------

#[test]
fn forbidden_request_headers_and_methods_are_refused_locally() {
    for (options, needle) in [
        (
            "{headers: {Host: 'evil.example'}}",
            "\"host\" may not be set",
        ),
        (
            "{headers: {'Transfer-Encoding': 'chunked'}}",
            "may not be set",
        ),
        ("{headers: {Range: 'bytes=0-1'}}", "may not be set"),
        ("{headers: {'Sec-Fetch-Mode': 'cors'}}", "may not be set"),
        ("{method: 'TRACE'}", "is not allowed"),
        ("{method: 'CONNECT'}", "is not allowed"),
    ] {
        let r = run(&js_await(&format!(
            "fetch('https://cdn.jsdelivr.net/x.whl', {options}).then(() => 'sent', e => e.message)"
        )));
        let out = ok(&r).result.clone().unwrap();
        assert!(out.contains(needle), "{options}: {out}");
    }
    still_serves(engine());
}

/// An engine that trusts a loopback HTTPS server which counts requests, answers `/slow` never, and
/// `/artifact.whl` with a small body.
fn with_fetch_server() -> (
    Engine,
    crate::tls::TlsServer,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let dir = crate::common::temp_dir("adversarial-fetch");
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    let server = crate::tls::TlsServer::start(&dir, move |_| {
        axum::Router::new()
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    "late"
                }),
            )
            .route(
                "/artifact.whl",
                axum::routing::get(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { "artifact bytes" }
                }),
            )
    });
    let engine = Engine::new(EngineSettings {
        allowed_hosts: vec!["localhost".into()],
        extra_ca_certs: vec![server.ca_pem_path.clone()],
        ..engine_settings()
    })
    .expect("engine");
    (engine, server, hits)
}

#[test]
fn requests_never_outlive_their_call_and_are_bounded_per_call() {
    let (engine, server, hits) = with_fetch_server();
    let base = server.base();
    // A request that never answers is cut at the call's deadline, and the call ends on time.
    let started = Instant::now();
    let r = engine.execute(ExecRequest {
        code: format!("import js\nawait js.fetch('{base}/slow')"),
        files: Vec::new(),
        timeout: Duration::from_millis(1000),
        ..Default::default()
    });
    assert_eq!(error_of(&r).kind, ErrorKind::Timeout, "{r:#?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Eight at once at most.
    let r = engine.execute(ExecRequest {
        code: format!(
            "import js\nfor i in range(8):\n    js.fetch('{base}/slow')\ntry:\n    await js.fetch('{base}/slow')\nexcept Exception as e:\n    print(e)"
        ),
        files: Vec::new(),
        timeout: Duration::from_millis(2000),
        ..Default::default()
    });
    assert!(r.stdout.contains("too many requests in flight"), "{r:#?}");
    // Header-less GETs of artifacts are cached; requests with headers (credentials) are not.
    let get = format!("await (await js.fetch('{base}/artifact.whl')).text()");
    for _ in 0..2 {
        let r = engine.execute(crate::common::request(&format!("import js\n{get}")));
        assert_eq!(ok(&r).result.as_deref(), Some("artifact bytes"));
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the second GET came from the cache"
    );
    let with_auth = format!(
        "import js\nfrom pyodide.ffi import to_js\nopts = to_js({{'headers': {{'Authorization': 'Bearer secret'}}}}, dict_converter=js.Object.fromEntries)\nawait (await js.fetch('{base}/artifact.whl', opts)).text()"
    );
    for _ in 0..2 {
        let r = engine.execute(crate::common::request(&with_auth));
        assert_eq!(ok(&r).result.as_deref(), Some("artifact bytes"));
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        3,
        "requests with headers are never cached"
    );
    still_serves(&engine);
}
