//! Keeping one upstream connected: the supervisor (connect, list the granted tools, wait for the
//! connection to end, connect again after a backoff), the connection itself (a stdio child or
//! Streamable HTTP), and the client side that follows the server's `tools/list_changed`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rmcp::service::{Peer, RoleClient};

use super::{
    BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_RESET, CONNECT_TIMEOUT, Connect, Link, Server, child, http,
    withheld,
};

impl Server {
    /// Lists the tools again (after `tools/list_changed`).
    async fn relist(&self, peer: &Peer<RoleClient>) {
        match self.granted_tools(peer).await {
            Ok(listed) => {
                if let Link::Up { tools, .. } = &mut *self.link() {
                    tracing::info!(upstream = %self.name, tools = listed.len(), "upstream tools changed");
                    *tools = Arc::new(listed);
                }
            }
            Err(e) => {
                let error = withheld(e.to_string(), &self.needles);
                tracing::warn!(upstream = %self.name, %error, "listing the upstream's changed tools failed")
            }
        }
    }
}

/// The client side of one connection: follows the server's `notifications/tools/list_changed`
/// (a stdio server's at any time; a Streamable HTTP server's within its answers, as no standalone
/// stream is opened), so a tool it adds becomes callable and one it drops stops being offered.
#[derive(Clone)]
pub(super) struct Watcher {
    server: std::sync::Weak<Server>,
}

impl Watcher {
    pub(super) fn name(&self) -> String {
        self.server
            .upgrade()
            .map(|s| s.name.clone())
            .unwrap_or_default()
    }
}

impl rmcp::ClientHandler for Watcher {
    async fn on_tool_list_changed(&self, context: rmcp::service::NotificationContext<RoleClient>) {
        let Some(server) = self.server.upgrade() else {
            return;
        };
        // One listing at a time however many notifications come; one asked for during a listing
        // runs after it.
        server.relist_again.store(true, Ordering::SeqCst);
        if server.relisting.swap(true, Ordering::SeqCst) {
            return;
        }
        loop {
            while server.relist_again.swap(false, Ordering::SeqCst) {
                server.relist(&context.peer).await;
            }
            server.relisting.store(false, Ordering::SeqCst);
            if !server.relist_again.load(Ordering::SeqCst)
                || server.relisting.swap(true, Ordering::SeqCst)
            {
                break;
            }
        }
    }
}

/// Keeps `server` connected: connects, lists its tools, waits for the connection to end, and
/// connects again after a pause that doubles up to 30 s. `first` hears of the first attempt.
pub(super) async fn supervise(server: Arc<Server>, first: std::sync::mpsc::Sender<()>) {
    let mut first = Some(first);
    let mut backoff = BACKOFF_FIRST;
    loop {
        let started = Instant::now();
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, connect(&server)).await;
        match attempt.unwrap_or_else(|_| Err("no answer to initialize within 30 s".into())) {
            Ok((running, guard)) => {
                let peer = running.peer().clone();
                match server.granted_tools(&peer).await {
                    Ok(tools) => {
                        if first.is_none() {
                            tracing::info!(upstream = %server.name, tools = tools.len(), "upstream connected again");
                        }
                        server.set(Link::Up {
                            peer,
                            tools: Arc::new(tools),
                        });
                        if let Some(tx) = first.take() {
                            let _ = tx.send(());
                        }
                        let quit = running.waiting().await;
                        server.set(Link::Down {
                            reason: withheld(
                                format!("the connection ended ({quit:?})"),
                                &server.needles,
                            ),
                        });
                        tracing::warn!(upstream = %server.name, "upstream connection ended; connecting again");
                    }
                    Err(e) => {
                        let reason =
                            withheld(format!("listing its tools failed: {e}"), &server.needles);
                        tracing::warn!(upstream = %server.name, error = %reason, "listing the upstream's tools failed");
                        server.set(Link::Down { reason });
                    }
                }
                drop(guard);
            }
            Err(reason) => {
                let reason = withheld(reason, &server.needles);
                if first.is_none() {
                    tracing::warn!(upstream = %server.name, error = %reason, "upstream connection failed");
                }
                server.set(Link::Down { reason });
            }
        }
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
        if started.elapsed() >= BACKOFF_RESET {
            backoff = BACKOFF_FIRST;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// What keeps a connection's other end alive: a stdio server's process.
type Guard = Option<child::Child>;

pub(super) type Running = rmcp::service::RunningService<RoleClient, Watcher>;

async fn connect(server: &Arc<Server>) -> Result<(Running, Guard), String> {
    let max = server.max_message_bytes();
    let watcher = Watcher {
        server: Arc::downgrade(server),
    };
    match &server.connect {
        Connect::Stdio { command, args, env } => {
            let (running, child) =
                child::connect(watcher, command, args, env, max, server.needles.clone()).await?;
            Ok((running, Some(child)))
        }
        Connect::Http {
            url,
            headers,
            client,
        } => {
            let running = http::connect(watcher, client.clone(), url, headers, max).await?;
            Ok((running, None))
        }
    }
}
