//! The HTTP transport: an axum app serving MCP Streamable HTTP at `/mcp` (both protocol eras, through
//! rmcp), bound to `bind_addr`, announcing its effective address once it listens.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::executor::Executor;
use crate::sandbox::{Engine, EngineConfig};
use crate::tools::CodeInterpreter;
use crate::validation::InputLimits;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub bind_addr: SocketAddr,
    pub engine: EngineConfig,
    pub max_workers: usize,
    pub queue_capacity: usize,
    pub input_limits: InputLimits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind_addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            engine: EngineConfig::default(),
            max_workers: 2,
            queue_capacity: 8,
            input_limits: InputLimits::default(),
        }
    }
}

/// Starts the engine and workers, binds, announces, and serves until Ctrl-C or SIGTERM.
pub async fn serve(config: ServerConfig) -> anyhow::Result<()> {
    let engine = Engine::new(config.engine.clone())?;
    let executor = Executor::start(engine, config.max_workers, config.queue_capacity)?;
    let interpreter = CodeInterpreter::new(executor, config.input_limits);

    let shutdown = CancellationToken::new();
    let mcp = StreamableHttpService::new(
        move || Ok(interpreter.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_json_response(true)
            .with_cancellation_token(shutdown.child_token()),
    );
    let body_limit = config.input_limits.http_body_limit() as usize;
    let app = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit));

    let listener = tokio::net::TcpListener::bind(config.bind_addr).await?;
    let addr = listener.local_addr()?;
    println!(
        "code-interpreter-mcp listening on port {} at http://{}/mcp",
        addr.port(),
        addr
    );
    tracing::info!(%addr, body_limit, "serving MCP");

    let token = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            token.cancel();
        })
        .await?;
    Ok(())
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
