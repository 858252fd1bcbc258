//! Upstream MCP servers the sandbox may call (`[upstream.NAME]`): the operator's grant and every
//! connection, held here in Rust. One supervisor per server (supervise.rs) keeps it connected (a
//! stdio server is started once and restarted when it exits, with backoff) and its tool list current;
//! [`Upstreams::call`] is the one door a sandbox's call goes through: server and tool in the grant,
//! arguments checked against the tool's input schema, the execution's budget and the server's slots,
//! the deadline, cancellation, the result's size. Credentials (header values, a child's environment)
//! never leave this module: what the server sends back holding one is withheld.
//!
//! The sandbox side is src/sandbox/isolate/ops/upstream.rs and src/sandbox/isolate/ops/upstream.py.

mod call;
mod check;
mod child;
mod http;
mod supervise;

pub use call::CallUpstream;
use supervise::{Running, Watcher, supervise};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::service::{Peer, RoleClient};
use serde_json::{Value, json};

use crate::config::secret::{self, Secret};
use crate::config::{UpstreamSettings, UpstreamTransport};
use crate::telemetry::traces::{ClientSpan, TraceParent};
use crate::telemetry::{self, UpstreamOutcome};

/// How a sandbox's call goes out: its number in the sandbox, the execution's deadline, and the
/// trace context of the call's span.
struct Sent {
    id: u32,
    deadline: Option<Instant>,
    trace: Option<TraceParent>,
}

/// How long start-up waits for every upstream's first connection before going on without it.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// The first and the longest pause before a server is connected again.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A connection that lasted this long starts the backoff over.
const BACKOFF_RESET: Duration = Duration::from_secs(60);
/// How long one connection attempt (start, initialize) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Room for the JSON-RPC envelope around a result, in a line or a message.
const ENVELOPE_BYTES: usize = 64 * 1024;

/// Every configured upstream server, by name.
pub struct Upstreams {
    servers: BTreeMap<String, Arc<Server>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams")
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        // (Ends every connection; children are killed with their process groups.)
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One server: its grant, its resolved credentials and its connection.
struct Server {
    name: String,
    settings: UpstreamSettings,
    connect: Connect,
    /// What the credentials took from the environment or files: never passed on from the server
    /// (a result holding one is withheld, its standard error redacted).
    needles: Arc<[String]>,
    /// `max_concurrent_calls` permits, shared by every sandbox.
    slots: Arc<tokio::sync::Semaphore>,
    /// A listing after `tools/list_changed` is running; another was asked for meanwhile.
    relisting: AtomicBool,
    relist_again: AtomicBool,
    link: Mutex<Link>,
}

/// How a server is reached, its credentials resolved.
enum Connect {
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, Secret)>,
    },
    Http {
        url: String,
        headers: Vec<(String, Secret)>,
        client: reqwest::Client,
    },
}

/// Whether a server can be called now.
enum Link {
    Connecting,
    Up {
        peer: Peer<RoleClient>,
        /// The granted tools the server lists, by name.
        tools: Arc<BTreeMap<String, Tool>>,
    },
    Down {
        reason: String,
    },
}

impl Upstreams {
    /// Connects to every server of `configs` (none: `None`), waiting up to 10 s for all of them;
    /// one that cannot be reached yet is a warning, and is tried again in the background. An error
    /// only for credentials that cannot be resolved (a variable not set, a file not readable).
    pub fn start(
        configs: &BTreeMap<String, UpstreamSettings>,
        extra_ca_certs: &[PathBuf],
    ) -> anyhow::Result<Option<Arc<Self>>> {
        if configs.is_empty() {
            return Ok(None);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("upstream-io")
            .enable_all()
            .build()?;
        let mut servers = BTreeMap::new();
        for (name, settings) in configs {
            let connect = match &settings.transport {
                UpstreamTransport::Stdio { command, args, env } => Connect::Stdio {
                    command: command.clone(),
                    args: args.clone(),
                    env: secret::resolve_all(&format!("upstream.{name}.env"), env)
                        .map_err(anyhow::Error::msg)?,
                },
                UpstreamTransport::Http { url, headers } => Connect::Http {
                    url: url.clone(),
                    headers: secret::resolve_all(&format!("upstream.{name}.headers"), headers)
                        .map_err(anyhow::Error::msg)?,
                    client: http::client(extra_ca_certs)?,
                },
            };
            let needles: Vec<String> = match &connect {
                Connect::Stdio { env: secrets, .. }
                | Connect::Http {
                    headers: secrets, ..
                } => secrets
                    .iter()
                    .flat_map(|(_, s)| s.needles(false))
                    .map(str::to_string)
                    .collect(),
            };
            let server = Arc::new(Server {
                name: name.clone(),
                settings: settings.clone(),
                connect,
                needles: needles.into(),
                slots: Arc::new(tokio::sync::Semaphore::new(
                    settings.max_concurrent_calls as usize,
                )),
                relisting: AtomicBool::new(false),
                relist_again: AtomicBool::new(false),
                link: Mutex::new(Link::Connecting),
            });
            servers.insert(name.clone(), server);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        for server in servers.values() {
            runtime.spawn(supervise(server.clone(), tx.clone()));
        }
        drop(tx);
        let deadline = Instant::now() + CONNECT_WAIT;
        for _ in 0..servers.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if rx.recv_timeout(left).is_err() {
                break;
            }
        }
        for server in servers.values() {
            match &*server.link() {
                Link::Up { tools, .. } => {
                    tracing::info!(upstream = %server.name, tools = tools.len(), "upstream connected")
                }
                Link::Connecting => tracing::warn!(
                    upstream = %server.name,
                    "upstream not connected within 10 s; its tools are unavailable until it is"
                ),
                Link::Down { reason } => tracing::warn!(
                    upstream = %server.name,
                    error = %reason,
                    "upstream not connected; its tools are unavailable until it is"
                ),
            }
        }
        Ok(Some(Arc::new(Self {
            servers,
            runtime: Some(runtime),
        })))
    }

    /// The configured servers' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// The granted tools of `server` the server lists now (empty while it is not connected).
    pub fn tool_names(&self, server: &str) -> Vec<String> {
        match self.servers.get(server).map(|s| s.link()).as_deref() {
            Some(Link::Up { tools, .. }) => tools.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// What the sandbox may call, as JSON: `{"servers": [{"name", "available", "reason"?, "tools":
    /// [{"name", "description", "inputSchema"}]}]}`.
    pub fn catalog_json(&self) -> String {
        self.catalog(None).to_string()
    }

    /// The catalog (see [`Self::catalog_json`]), of one server or all.
    pub fn catalog(&self, only: Option<&str>) -> Value {
        let servers: Vec<Value> = self
            .servers
            .values()
            .filter(|server| only.is_none_or(|name| name == server.name))
            .map(|server| match &*server.link() {
                Link::Up { tools, .. } => json!({
                    "name": server.name,
                    "available": true,
                    "tools": tools.values().map(|t| json!({
                        "name": t.name,
                        "description": t.description.as_deref().unwrap_or(""),
                        "inputSchema": &*t.input_schema,
                    })).collect::<Vec<_>>(),
                }),
                Link::Connecting => json!({
                    "name": server.name, "available": false, "tools": [],
                    "reason": "the server is still connecting",
                }),
                Link::Down { reason } => json!({
                    "name": server.name, "available": false, "tools": [], "reason": reason,
                }),
            })
            .collect();
        json!({ "servers": servers })
    }

    /// One call from a sandbox: `server`'s `tool` with `args` (a JSON object), the sandbox's call
    /// number `id`, cut at `deadline` (the execution's) if that comes before the server's own
    /// timeout. The reply is JSON: `{"ok": CallToolResult}` or `{"error": {"kind", "message"}}`.
    pub async fn call(
        &self,
        call: Arc<CallUpstream>,
        server: &str,
        tool: &str,
        args: &str,
        id: u32,
        deadline: Option<Instant>,
    ) -> String {
        let started = Instant::now();
        let (server_label, tool_label) = match self.servers.get(server) {
            Some(s) if s.granted(tool) => (server, tool),
            Some(_) => (server, "other"),
            None => ("other", "other"),
        };
        // Only configured and granted names: the sandbox chooses the others.
        let span = ClientSpan::start(
            call.trace(),
            format!("upstream.call {server_label}"),
            vec![
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("code_interpreter.upstream", server_label.to_string()),
                KeyValue::new("gen_ai.tool.name", tool_label.to_string()),
            ],
        );
        let trace = span.context();
        let (outcome, reply) = match self
            .call_checked(
                call,
                server,
                tool,
                args,
                Sent {
                    id,
                    deadline,
                    trace,
                },
            )
            .await
        {
            Ok((outcome, result)) => (outcome, format!(r#"{{"ok":{result}}}"#)),
            Err((outcome, message)) => (
                outcome,
                json!({"error": {"kind": outcome.label(), "message": message}}).to_string(),
            ),
        };
        let elapsed = started.elapsed();
        span.end(outcome.label(), matches!(outcome, UpstreamOutcome::Ok));
        telemetry::upstream_call(server_label, tool_label, outcome, elapsed);
        let ms = elapsed.as_millis() as u64;
        // Refusals made before anything is sent are counted, and logged only at debug level: a
        // loop of them would flood the log.
        let refused = matches!(
            outcome,
            UpstreamOutcome::Budget | UpstreamOutcome::Denied | UpstreamOutcome::InvalidArguments
        );
        if refused {
            tracing::debug!(
                upstream = server_label,
                tool = tool_label,
                outcome = outcome.label(),
                ms,
                "upstream call"
            );
        } else {
            tracing::info!(
                upstream = server_label,
                tool = tool_label,
                outcome = outcome.label(),
                ms,
                "upstream call"
            );
        }
        reply
    }

    async fn call_checked(
        &self,
        call: Arc<CallUpstream>,
        server: &str,
        tool: &str,
        args: &str,
        sent: Sent,
    ) -> Result<(UpstreamOutcome, String), (UpstreamOutcome, String)> {
        let Sent {
            id,
            deadline,
            trace,
        } = sent;
        use UpstreamOutcome as O;
        let s = self.servers.get(server).ok_or_else(|| {
            (
                O::Denied,
                format!(
                    "no upstream server named {}",
                    crate::protocol::limits::shown(server)
                ),
            )
        })?;
        if !s.granted(tool) {
            return Err((
                O::Denied,
                format!(
                    "the tool {} of {server} is not granted to the sandbox",
                    crate::protocol::limits::shown(tool)
                ),
            ));
        }
        let (peer, schema) = match &*s.link() {
            Link::Up { peer, tools } => match tools.get(tool) {
                Some(t) => (peer.clone(), t.input_schema.clone()),
                None => {
                    return Err((
                        O::Unavailable,
                        format!("{server} does not list the tool {tool}"),
                    ));
                }
            },
            Link::Connecting => {
                return Err((O::Unavailable, format!("{server} is still connecting")));
            }
            Link::Down { reason } => {
                return Err((
                    O::Unavailable,
                    format!("{server} is not connected: {reason}"),
                ));
            }
        };
        let arguments = check::arguments(&schema, args)
            .map_err(|e| (O::InvalidArguments, format!("{server}.{tool}: {e}")))?;
        let max = s.settings.max_calls_per_execution;
        if !call.take(server, max) {
            return Err((
                O::Budget,
                format!(
                    "{server} allows {max} calls per execution; this execution has made them all"
                ),
            ));
        }
        let Some((token, running)) = call.start(id) else {
            return Err((
                O::Budget,
                format!(
                    "at most {} upstream calls may be in flight at once",
                    call::MAX_IN_FLIGHT
                ),
            ));
        };
        let timeout = s.settings.timeout;
        let own = Instant::now() + timeout;
        let deadline = deadline.map_or(own, |d| d.min(own));
        let max_bytes = s.settings.max_result_bytes;
        let mut request = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        // The trace goes on in the upstream server (SEP-414: W3C trace context in `_meta`).
        if let Some(trace) = trace {
            let meta: serde_json::Map<_, _> = trace
                .headers()
                .into_iter()
                .map(|(name, value)| (name.to_string(), value.into()))
                .collect();
            request.meta = Some(meta.into());
        }
        let (slots, needles) = (s.slots.clone(), s.needles.clone());
        let at = tokio::time::Instant::from_std(deadline);
        let timed_out = move || {
            if deadline < own {
                "the execution's time ran out during the call".to_string()
            } else {
                format!("no answer within {} ms", timeout.as_millis())
            }
        };
        let call = async move {
            // Every sandbox's calls to the server share its slots; waiting for one is part of the
            // call's time.
            let _slot = match tokio::time::timeout_at(at, slots.acquire_owned()).await {
                Err(_) => {
                    return Err((
                        O::Timeout,
                        format!(
                            "{} (every call slot of the server stayed busy)",
                            timed_out()
                        ),
                    ));
                }
                Ok(Err(_)) => {
                    return Err((O::Unavailable, "the server is shutting down".to_string()));
                }
                Ok(Ok(slot)) => slot,
            };
            match tokio::time::timeout_at(at, peer.call_tool(request)).await {
                Err(_) => Err((O::Timeout, timed_out())),
                Ok(Err(e)) => Err((
                    O::Error,
                    withheld(format!("the call failed: {e}"), &needles),
                )),
                Ok(Ok(result)) => {
                    let text =
                        serde_json::to_string(&result).map_err(|e| (O::Error, e.to_string()))?;
                    if text.len() > max_bytes {
                        Err((
                            O::TooLarge,
                            format!(
                                "the result is {} bytes, over the limit of {max_bytes}",
                                text.len()
                            ),
                        ))
                    } else if holds_credential(&text, &needles) {
                        Err((
                            O::Error,
                            "the result holds one of the server's credentials; it was withheld"
                                .to_string(),
                        ))
                    } else if result.is_error == Some(true) {
                        Ok((O::ToolError, text))
                    } else {
                        Ok((O::Ok, text))
                    }
                }
            }
        };
        let task = async move {
            tokio::select! {
                _ = token.cancelled() => Err((O::Cancelled, "the call was cancelled".to_string())),
                r = call => r,
            }
        };
        let handle = self
            .runtime
            .as_ref()
            .map(|rt| rt.handle().clone())
            .ok_or_else(|| (O::Unavailable, "the server is shutting down".to_string()))?;
        let reply = handle
            .spawn(task)
            .await
            .unwrap_or_else(|_| Err((O::Cancelled, "the call was cancelled".to_string())));
        drop(running);
        reply
    }
}

impl Server {
    fn link(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, link: Link) {
        *self.link() = link;
    }

    /// Whether the operator grants `tool` (whether or not the server lists it).
    fn granted(&self, tool: &str) -> bool {
        (self.settings.tools.is_empty() || self.settings.tools.iter().any(|t| t == tool))
            && !self.settings.deny_tools.iter().any(|t| t == tool)
    }

    /// Largest message taken from the server: the result limit and its envelope.
    fn max_message_bytes(&self) -> usize {
        self.settings.max_result_bytes + ENVELOPE_BYTES
    }

    /// The granted tools `peer` lists now.
    async fn granted_tools(
        &self,
        peer: &Peer<RoleClient>,
    ) -> Result<BTreeMap<String, Tool>, rmcp::ServiceError> {
        Ok(peer
            .list_all_tools()
            .await?
            .into_iter()
            .filter(|t| self.granted(&t.name))
            .map(|t| (t.name.to_string(), t))
            .collect())
    }
}

/// Whether `text` (from the server) holds one of `needles`, the server's credentials.
fn holds_credential(text: &str, needles: &[String]) -> bool {
    needles
        .iter()
        .any(|n| memchr::memmem::find(text.as_bytes(), n.as_bytes()).is_some())
}

/// `message` (from the server), or a refusal if it holds one of the server's credentials.
fn withheld(message: String, needles: &[String]) -> String {
    if holds_credential(&message, needles) {
        "the server's answer held one of its credentials; it was withheld".into()
    } else {
        message
    }
}
