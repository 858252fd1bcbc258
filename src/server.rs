//! The HTTP transport: an axum app serving MCP Streamable HTTP at `/mcp` (both protocol eras, through
//! rmcp) behind the HTTP body ceiling, with Host and Origin verification, bound to `bind_addr` and
//! announcing its effective address once it listens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::AppConfig;
use crate::pool::{Health, Pool, PoolConfig};
use crate::sandbox::Engine;
use crate::snippets::Catalog;
use crate::tools::CodeInterpreter;
use crate::validation::InputLimits;

/// Origins accepted on /mcp when `http_allowed_origins` is empty: pages served from loopback.
const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

fn input_limits(config: &AppConfig) -> InputLimits {
    InputLimits {
        max_file_kb: config.input_limits.max_file_kb,
        max_total_file_kb: config.input_limits.max_total_file_kb,
    }
}

/// Total time allowed for a graceful shutdown after SIGTERM or Ctrl-C.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);

/// Start-up in the specified order: assets checked (engine), workers started and prewarmed workers'
/// Pyodide initialised and acknowledged (pool). Only then may anything listen.
fn start_pool(config: &AppConfig) -> anyhow::Result<Pool> {
    let started = Instant::now();
    let engine = Engine::new(crate::cli::engine_config(config))?;
    let pool = Pool::start(
        engine,
        PoolConfig {
            max_workers: config.workers.max_workers as usize,
            queue_capacity: config.workers.queue_capacity as usize,
            prewarmed_workers: config.workers.prewarmed_workers as usize,
        },
    )?;
    tracing::info!(
        max_workers = config.workers.max_workers,
        prewarmed_workers = config.workers.prewarmed_workers,
        queue_capacity = config.workers.queue_capacity,
        startup_ms = started.elapsed().as_millis() as u64,
        "workers ready"
    );
    Ok(pool)
}

/// The visible snippet catalog, or `None` when the snippet tools are disabled.
fn catalog(config: &AppConfig) -> Option<Catalog> {
    config
        .code_snippets
        .enabled
        .then(|| Catalog::new(&config.code_snippets, config.search.min_hits))
}

/// Serves the same tools over MCP stdio until the client closes standard input.
pub async fn serve_stdio(config: AppConfig) -> anyhow::Result<()> {
    use rmcp::ServiceExt as _;
    let pool = tokio::task::block_in_place(|| start_pool(&config))?;
    let service = CodeInterpreter::new(pool.clone(), input_limits(&config), catalog(&config))
        .with_packages(
            &config.preinstall_packages,
            config.runtime_package_installation,
        )
        .serve(rmcp::transport::stdio())
        .await?;
    service.waiting().await?;
    pool.shutdown();
    Ok(())
}

/// Starts the pool, binds, announces, and serves until Ctrl-C or SIGTERM, then drains: readiness
/// fails at once, queued calls are cancelled, running calls may finish, probes keep answering until
/// the workers have exited, then HTTP shuts down gracefully. At the deadline the process exits.
pub async fn serve(config: AppConfig) -> anyhow::Result<()> {
    let bind_addr: SocketAddr = config.bind_addr.parse()?;
    let limits = input_limits(&config);
    // The metrics listener starts before Python initialisation; metrics do not imply readiness.
    if config.integrations.prometheus.enabled {
        crate::telemetry::start(
            &config.integrations.prometheus,
            config.workers.queue_capacity,
        )
        .await?;
    }
    let pool = tokio::task::block_in_place(|| start_pool(&config))?;
    let interpreter = CodeInterpreter::new(pool.clone(), limits, catalog(&config)).with_packages(
        &config.preinstall_packages,
        config.runtime_package_installation,
    );

    let in_flight = interpreter.calls_in_flight();
    let shutdown = CancellationToken::new();
    let app = router(
        interpreter,
        pool.health(),
        &config,
        limits,
        shutdown.child_token(),
    );

    let listener = tokio::net::TcpListener::bind(bind_addr).await?;
    let addr = listener.local_addr()?;
    announce(&format!(
        "code-interpreter-mcp listening on port {} at http://{}/mcp",
        addr.port(),
        addr
    ));
    tracing::info!(
        %addr,
        http_body_limit = limits.http_body_limit(),
        max_file_kb = limits.max_file_kb,
        max_total_file_kb = limits.max_total_file_kb,
        "serving MCP"
    );

    let token = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            let deadline = Instant::now() + SHUTDOWN_DEADLINE;
            tracing::info!(
                "shutdown requested: draining (deadline {} s)",
                SHUTDOWN_DEADLINE.as_secs()
            );
            std::thread::spawn(move || {
                std::thread::sleep(SHUTDOWN_DEADLINE);
                eprintln!("code-interpreter-mcp: shutdown deadline reached; exiting");
                std::process::exit(1);
            });
            pool.shutdown();
            while !pool.workers_exited() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // A call that finished while draining must still get its reply: closing the transport
            // while its handler is returning would answer it with an error instead.
            while in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tracing::info!("workers stopped; closing HTTP");
            token.cancel();
        })
        .await?;
    tracing::info!("shutdown complete");
    Ok(())
}

/// Prints the announcement line on stdout; a closed stdout is not an error.
fn announce(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

/// The axum application.
pub fn router(
    interpreter: CodeInterpreter,
    health: Arc<Health>,
    config: &AppConfig,
    limits: InputLimits,
    shutdown: CancellationToken,
) -> axum::Router {
    let body_limit = limits.http_body_limit() as usize;
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_max_request_body_bytes(body_limit)
        .with_cancellation_token(shutdown);
    mcp_config = if config.skip_host_header_verification {
        mcp_config.disable_allowed_hosts()
    } else if config.http_allowed_hosts.is_empty() {
        mcp_config.with_allowed_hosts(["localhost", "127.0.0.1", "::1"])
    } else {
        mcp_config.with_allowed_hosts(
            config
                .http_allowed_hosts
                .iter()
                .map(|h| h.trim().to_string()),
        )
    };
    mcp_config = if config.http_allowed_origins.is_empty() {
        mcp_config.with_allowed_origins(LOOPBACK_ORIGINS)
    } else {
        mcp_config.with_allowed_origins(config.http_allowed_origins.clone())
    }
    .enforce_origin_validation();

    let mcp = StreamableHttpService::new(
        move || Ok(interpreter.clone()),
        Arc::new(LocalSessionManager::default()),
        mcp_config,
    );
    let mcp = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn(session_delete_status))
        .layer(axum::middleware::from_fn_with_state(
            BodyCeiling {
                bytes: body_limit as u64,
                max_total_file_kb: limits.max_total_file_kb,
            },
            enforce_body_ceiling,
        ));
    // Probes: outside MCP sessions and Host verification, reading atomics only.
    let probes = axum::Router::new()
        .route("/livez", axum::routing::get(livez))
        .route("/readyz", axum::routing::get(readyz))
        .with_state(health);
    mcp.merge(probes)
}

fn probe(ok: bool) -> Response {
    if ok {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable").into_response()
    }
}

async fn livez(State(health): State<Arc<Health>>) -> Response {
    probe(health.live())
}

async fn readyz(State(health): State<Arc<Health>>) -> Response {
    probe(health.ready())
}

/// The derived HTTP body ceiling and the setting it comes from.
#[derive(Clone, Copy)]
struct BodyCeiling {
    bytes: u64,
    max_total_file_kb: u64,
}

/// Refuses bodies declared larger than the ceiling with 413 and a plain-text explanation; bodies without
/// a length are bounded by rmcp's own limit, set to the same ceiling.
async fn enforce_body_ceiling(
    State(ceiling): State<BodyCeiling>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared
        && len > ceiling.bytes
    {
        tracing::warn!(
            content_length = len,
            http_body_limit = ceiling.bytes,
            "rejected an HTTP request body over the limit"
        );
        // Read (and discard) a moderately oversized body before answering, so the client sees the 413
        // instead of a connection reset while it is still sending; far larger bodies are cut off.
        if len <= ceiling.bytes.saturating_mul(2) {
            use futures::StreamExt as _;
            let mut body = request.into_body().into_data_stream();
            while let Some(Ok(_)) = body.next().await {}
        }
        let message = format!(
            "HTTP request body of {len} bytes exceeds the HTTP body limit of {} bytes, which is derived from \
             input_limits.max_total_file_kb = {} (raise that setting to accept larger input files)\n",
            ceiling.bytes, ceiling.max_total_file_kb
        );
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            message,
        )
            .into_response();
    }
    next.run(request).await
}

/// A successful session DELETE answers 204 rather than rmcp's 202: the transport specification leaves
/// the status open, and common clients (the Python SDK) treat only 200/204 as a clean termination.
async fn session_delete_status(request: Request, next: Next) -> Response {
    let is_delete = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    if is_delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
