//! The transports: an axum app serving MCP Streamable HTTP at `/mcp` (both protocol eras, through
//! rmcp) behind the HTTP body ceiling, with Host and Origin verification and optional bearer tokens
//! ([`auth`]: static tokens and OAuth access tokens, [`oauth`]), the checks of a request before rmcp reads it ([`requests`]: body ceiling and framing,
//! x-mcp-header against the body, bounded MCP sessions), legacy-era MCP sessions whose ids name the
//! replica ([`mcp_sessions`]), bound to
//! `bind_addr` and announcing its effective address once it listens, with the probes beside it and
//! the graceful shutdown; and MCP over stdio. Both serve the tool handler the application assembled.

pub mod auth;
pub mod mcp_sessions;
pub mod oauth;
pub mod priming;
pub mod requests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use code_interpreter_mcp_config::OAuthSettings;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use self::auth::{Authenticator, BearerAuth};
use self::mcp_sessions::ReplicaSessionManager;
use self::oauth::ResourceServer;
use crate::pool::{ExecPool, Health};
use crate::sessions::Sessions;
use crate::tools::CodeInterpreter;
use crate::tools::validation::InputLimits;

/// Origins accepted on /mcp when `http_allowed_origins` is empty: pages served from loopback.
const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

/// Total time allowed for a graceful shutdown after SIGTERM or Ctrl-C.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);
/// Running tasks are stopped this long before the shutdown deadline...
const TASK_STOP_BEFORE_DEADLINE: Duration = Duration::from_secs(5);
/// ...and their failure stays readable with tasks/get this long (two poll intervals) before HTTP
/// closes.
const TASK_FAILURE_VISIBLE: Duration = Duration::from_secs(2);
/// After the last call's handler has returned, how long the transport stays open for its reply to
/// be written.
const REPLY_GRACE: Duration = Duration::from_millis(250);

/// What the HTTP transport needs of the configuration.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub bind_addr: SocketAddr,
    /// Inbound Host allowlist; empty keeps the loopback names; `None` accepts any Host.
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser origins allowed on /mcp; empty keeps pages served from loopback.
    pub allowed_origins: Vec<String>,
    /// The input limits (the HTTP body ceiling derives from them).
    pub limits: InputLimits,
    /// Static bearer tokens accepted on /mcp, if configured.
    pub tokens: Option<Arc<BearerAuth>>,
    /// OAuth access tokens accepted on /mcp, if configured.
    pub oauth: Option<OAuthSettings>,
    /// Extra trust roots for the authorization server's metadata and keys.
    pub extra_ca_certs: Vec<PathBuf>,
    /// Prefix of legacy-era MCP session ids (`replica_id`); empty: none.
    pub replica_id: String,
    /// The quotas an authenticated principal gets (overrides by token name or claim).
    pub quotas: crate::config::QuotaPolicy,
}

/// Serves the tools over MCP stdio until the client closes standard input, or SIGTERM or Ctrl-C;
/// then shuts down as the HTTP transport does, within the same deadline: calls running may finish,
/// and every session is saved to the store (hosts that start a process per conversation or per call
/// find their sessions again in the next one; a session that could not be saved says why when its
/// id comes back).
pub async fn serve_stdio(
    interpreter: CodeInterpreter,
    pool: ExecPool,
    sessions: Option<Sessions>,
) -> anyhow::Result<()> {
    use rmcp::ServiceExt as _;
    let service = interpreter.serve(rmcp::transport::stdio()).await?;
    let cancel = service.cancellation_token();
    // (rmcp's read of standard input does not end with a cancellation: on a signal the service is
    // cancelled and left behind.)
    tokio::select! {
        ended = service.waiting() => {
            ended?;
        }
        () = wait_for_signal() => {
            tracing::info!("shutdown requested");
            cancel.cancel();
        }
    }
    let deadline = Instant::now() + SHUTDOWN_DEADLINE;
    exit_at_deadline();
    pool.shutdown();
    if let Some(sessions) = &sessions {
        sessions.shutdown(deadline).await;
    }
    tracing::info!("shutdown complete");
    Ok(())
}

/// Ends the process if a shutdown is still going on at [`SHUTDOWN_DEADLINE`] from now.
fn exit_at_deadline() {
    std::thread::spawn(move || {
        std::thread::sleep(SHUTDOWN_DEADLINE);
        eprintln!("code-interpreter-mcp: shutdown deadline reached; exiting");
        std::process::exit(1);
    });
}

/// Binds, announces, and serves until Ctrl-C or SIGTERM, then drains: readiness fails at once,
/// queued calls are cancelled, running calls may finish, probes keep answering until the workers have
/// exited, then HTTP shuts down gracefully. At the deadline the process exits.
pub async fn serve_http(
    interpreter: CodeInterpreter,
    pool: ExecPool,
    sessions: Option<Sessions>,
    settings: HttpSettings,
) -> anyhow::Result<()> {
    let limits = settings.limits;
    let in_flight = interpreter.calls_in_flight();
    let tasks = interpreter.tasks().cloned();
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(settings.bind_addr).await?;
    let addr = listener.local_addr()?;
    let auth = Arc::new(authenticator(&settings, addr)?);
    let app = router(
        interpreter,
        pool.health(),
        &settings,
        &auth,
        shutdown.child_token(),
    );
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
            exit_at_deadline();
            pool.shutdown();
            // Tasks still waiting for a running slot fail now; running ones may finish.
            if let Some(tasks) = &tasks {
                tasks.close();
            }
            // Session calls running now may finish; then every session ends.
            let sessions_done = async {
                if let Some(sessions) = &sessions {
                    sessions.shutdown(deadline).await;
                }
            };
            let workers_done = async {
                while !pool.workers_exited() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            // Running tasks may finish until shortly before the deadline; those that cannot are
            // stopped and fail, and the server keeps answering a little longer so that their
            // pollers read why.
            let tasks_done = async {
                let Some(tasks) = &tasks else { return };
                let stop_at = deadline - TASK_STOP_BEFORE_DEADLINE;
                while tasks.working() > 0 && Instant::now() < stop_at {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if tasks.working() > 0 {
                    tasks.stop();
                    while tasks.working() > 0 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    tokio::time::sleep(TASK_FAILURE_VISIBLE).await;
                }
            };
            tokio::join!(sessions_done, workers_done, tasks_done);
            // A call that finished while draining must still get its reply: closing the transport
            // while its handler is returning would answer it with an error instead.
            while in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // A handler that has returned has not always had its reply written yet: under load,
            // cancelling at once answered a call that had finished with HTTP 500 ("failed to send
            // pending response during drain", seen once in tests/it/pool.rs's SIGTERM test).
            let grace = REPLY_GRACE.min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(grace).await;
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
/// The authentication of /mcp, started: the static tokens watched for changes, the OAuth issuer's
/// keys loading. Without `auth.oauth.resource` the resource is the URL the server is bound at.
fn authenticator(settings: &HttpSettings, addr: SocketAddr) -> anyhow::Result<Authenticator> {
    if let Some(tokens) = &settings.tokens {
        tokens.watch();
    }
    let oauth = match &settings.oauth {
        None => None,
        Some(oauth) => {
            let resource = oauth
                .resource
                .clone()
                .unwrap_or_else(|| format!("http://{addr}/mcp"));
            let server = Arc::new(ResourceServer::new(
                oauth,
                &resource,
                &settings.extra_ca_certs,
            )?);
            server.start();
            Some(server)
        }
    };
    Ok(Authenticator {
        tokens: settings.tokens.clone(),
        oauth,
        quotas: settings.quotas.clone(),
    })
}

pub fn router(
    interpreter: CodeInterpreter,
    health: Arc<Health>,
    settings: &HttpSettings,
    auth: &Arc<Authenticator>,
    shutdown: CancellationToken,
) -> axum::Router {
    let limits = settings.limits;
    let body_limit = limits.http_body_limit() as usize;
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_max_request_body_bytes(body_limit)
        .with_cancellation_token(shutdown);
    mcp_config = match &settings.allowed_hosts {
        None => mcp_config.disable_allowed_hosts(),
        Some(hosts) if hosts.is_empty() => {
            mcp_config.with_allowed_hosts(["localhost", "127.0.0.1", "::1"])
        }
        Some(hosts) => mcp_config.with_allowed_hosts(hosts.iter().map(|h| h.trim().to_string())),
    };
    mcp_config = if settings.allowed_origins.is_empty() {
        mcp_config.with_allowed_origins(LOOPBACK_ORIGINS)
    } else {
        mcp_config.with_allowed_origins(settings.allowed_origins.clone())
    }
    .enforce_origin_validation();

    let mcp_sessions = Arc::new(ReplicaSessionManager::new(&settings.replica_id));
    let sessions = interpreter.sessions().cloned();
    let mcp = StreamableHttpService::new(
        move || Ok(interpreter.clone()),
        mcp_sessions.clone(),
        mcp_config,
    );
    let mut mcp = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn(session_delete_status))
        .layer(axum::middleware::from_fn_with_state(
            requests::Checks {
                metadata_url: auth.oauth.as_ref().map(|o| Arc::from(o.metadata_url())),
                ..requests::Checks::new(
                    body_limit as u64,
                    limits.max_total_file_kb,
                    mcp_sessions,
                    sessions,
                )
            },
            requests::check_request,
        ));
    // Outermost: an unauthenticated request is refused before anything reads its body.
    if auth.required() {
        mcp = mcp.layer(axum::middleware::from_fn_with_state(
            Arc::clone(auth),
            auth::require_bearer,
        ));
    }
    // Probes: outside MCP sessions and Host verification, reading atomics only.
    let probes = axum::Router::new()
        .route("/livez", axum::routing::get(livez))
        .route("/readyz", axum::routing::get(readyz))
        .with_state(health);
    // The protected-resource metadata: public, outside authentication and Host verification.
    let metadata = auth
        .oauth
        .as_ref()
        .map(ResourceServer::routes)
        .unwrap_or_default();
    mcp.merge(probes).merge(metadata)
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
