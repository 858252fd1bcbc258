//! The validated configuration as the application uses it: every value parsed once (addresses,
//! paths, durations, choices), the derived defaults applied, optional parts present only when
//! enabled. `validate.rs` makes it; the application's assembly point (`app.rs`) is the one place that
//! maps it into the running parts, which take these types directly.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use code_interpreter_mcp_protocol::InputLimits;

use crate::model::{BootMode, CodeSnippetsConfig, LogFormat};
use crate::secret::Secret;

/// The whole validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub log_format: LogFormat,
    /// Main runtime threads (`TOKIO_WORKER_THREADS`), when set.
    pub tokio_worker_threads: Option<usize>,
    /// The replica's name (`replica_id`): prefixes session and MCP session ids; empty: none.
    pub replica_id: String,
    pub http: HttpSettings,
    pub engine: EngineSettings,
    pub workers: WorkerSettings,
    /// Sessions, when enabled.
    pub sessions: Option<SessionSettings>,
    /// Tasks, when enabled.
    pub tasks: Option<TaskSettings>,
    /// The snippet catalog and its search, when enabled.
    pub snippets: Option<SnippetSettings>,
    /// Returned images up to this many bytes are inlined as image content.
    pub max_inline_image_bytes: u64,
    /// The text content of a result is at most about this many characters (0: no cap).
    pub max_text_chars: usize,
    /// Results carry structured content where the client's protocol has it.
    pub structured_content: bool,
    /// Interactive results (MCP Apps), when enabled: where the views' scripts are (`None`: the
    /// npm packages under `node_modules`).
    pub apps: Option<AppsSettings>,
    /// Where `/metrics` listens, when the Prometheus integration is enabled.
    pub prometheus: Option<SocketAddr>,
    /// The MCP servers sandboxes may call, by name (`[upstream.NAME]`).
    pub upstream: BTreeMap<String, UpstreamSettings>,
    /// Per-principal quotas.
    pub quotas: QuotaPolicy,
    /// Tool-call metrics carry a `principal` label.
    pub principal_metric_label: bool,
    /// Trace export, when `integrations.opentelemetry.enabled`.
    pub traces: Option<TraceSettings>,
}

/// `[integrations.opentelemetry]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The OTLP/HTTP traces URL.
    pub endpoint: String,
    /// Headers of every export, resolved (values never logged).
    pub headers: Vec<(String, Secret)>,
    pub service_name: String,
    /// Fraction of new traces recorded (0.0 to 1.0).
    pub sample_ratio: f64,
    pub max_queue_spans: usize,
    pub max_batch_spans: usize,
    pub export_interval: Duration,
    pub export_timeout: Duration,
    pub principal_attribute: bool,
}

/// `[quotas]`: what one principal may use; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaSettings {
    pub max_concurrent_calls: Option<u32>,
    /// Sandbox seconds per minute (the bucket's size).
    pub cpu_seconds_per_minute: Option<u32>,
    pub max_tasks: Option<u32>,
    /// Calls waiting for a worker.
    pub max_queued_calls: Option<u32>,
    /// Sessions held (resident or spilled).
    pub max_sessions: Option<u32>,
    /// The share of the workers when several principals wait (1 to 100; 0 counts as 1).
    pub weight: u32,
}

/// The quotas of every principal: `base`, and other values for those an override matches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuotaPolicy {
    pub base: QuotaSettings,
    pub overrides: Vec<QuotaOverride>,
}

/// One `[[quotas.overrides]]` entry, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaOverride {
    pub applies_to: Applies,
    /// The values it sets (`None`: unchanged; `Some(None)`: no limit).
    pub max_concurrent_calls: Option<Option<u32>>,
    pub cpu_seconds_per_minute: Option<Option<u32>>,
    pub max_tasks: Option<Option<u32>>,
    pub max_queued_calls: Option<Option<u32>>,
    pub max_sessions: Option<Option<u32>>,
    pub weight: Option<u32>,
}

/// Which principals an override is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applies {
    /// The named static token of that name.
    Name(String),
    /// OAuth principals whose access token has `claim` equal to (or, an array, holding) `value`.
    Claim { claim: String, value: String },
}

impl QuotaPolicy {
    /// The quotas of a principal named `name` (a named token) whose token's claims `claim` gives
    /// (the string values of one claim; none for a static token).
    pub fn limits_for<'a>(
        &self,
        name: Option<&str>,
        claim: impl Fn(&str) -> Vec<&'a str>,
    ) -> QuotaSettings {
        let matched = self.overrides.iter().find(|o| match &o.applies_to {
            Applies::Name(n) => name == Some(n.as_str()),
            Applies::Claim { claim: c, value } => claim(c).contains(&value.as_str()),
        });
        let Some(o) = matched else {
            return self.base;
        };
        let b = self.base;
        QuotaSettings {
            max_concurrent_calls: o.max_concurrent_calls.unwrap_or(b.max_concurrent_calls),
            cpu_seconds_per_minute: o.cpu_seconds_per_minute.unwrap_or(b.cpu_seconds_per_minute),
            max_tasks: o.max_tasks.unwrap_or(b.max_tasks),
            max_queued_calls: o.max_queued_calls.unwrap_or(b.max_queued_calls),
            max_sessions: o.max_sessions.unwrap_or(b.max_sessions),
            weight: o.weight.unwrap_or(b.weight),
        }
    }

    /// The claims the overrides look at.
    pub fn claims(&self) -> Vec<&str> {
        self.overrides
            .iter()
            .filter_map(|o| match &o.applies_to {
                Applies::Claim { claim, .. } => Some(claim.as_str()),
                Applies::Name(_) => None,
            })
            .collect()
    }
}

/// `[results] apps`: interactive results as MCP Apps.
#[derive(Debug, Clone, PartialEq)]
pub struct AppsSettings {
    /// `apps_asset_dir`, when set.
    pub asset_dir: Option<PathBuf>,
    /// `max_table_rows_app`: rows of a DataFrame sent to the grid (0: none).
    pub grid_rows: u32,
}

/// One HTTPS host granted to sandboxed code (`[[network.hosts]]`), checked. Header values are
/// templates, resolved by the fetcher at start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct HostGrant {
    /// Lowercase; a leading "*." means the subdomains only.
    pub host: String,
    /// Uppercase.
    pub methods: Vec<String>,
    pub paths: Vec<String>,
    pub inject_headers: BTreeMap<String, String>,
    pub max_response_bytes: usize,
    pub allow_private_addresses: bool,
}

/// One upstream MCP server and what the sandbox may do with it.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSettings {
    pub transport: UpstreamTransport,
    /// Tools granted (empty: all the server lists), less `deny_tools`.
    pub tools: Vec<String>,
    pub deny_tools: Vec<String>,
    pub max_calls_per_execution: u32,
    /// Calls in flight at once, from every sandbox.
    pub max_concurrent_calls: u32,
    pub timeout: Duration,
    pub max_result_bytes: usize,
}

/// How an upstream is reached. Header and environment values are templates (`${VAR}`, `@/file`),
/// resolved by the application at start-up.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamTransport {
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

/// The HTTP transport.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSettings {
    pub bind_addr: SocketAddr,
    /// Inbound Host allowlist: empty keeps the loopback names; `None` accepts any Host.
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser origins allowed on /mcp; empty keeps pages served from loopback.
    pub allowed_origins: Vec<String>,
    /// Bearer tokens required on /mcp, when set.
    pub bearer_tokens_file: Option<PathBuf>,
    /// Each token line is `NAME:TOKEN`.
    pub named_tokens: bool,
    /// The input-file allowances (the HTTP body ceiling derives from them).
    pub input_limits: InputLimits,
    /// The OAuth resource server, when `auth.oauth.issuer` is set.
    pub oauth: Option<OAuthSettings>,
}

/// `[auth.oauth]`, checked: JWT access tokens of one issuer, for one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthSettings {
    /// The issuer identifier, exactly as tokens and its metadata carry it.
    pub issuer: String,
    /// This server's resource identifier: the audience required and the metadata's `resource`;
    /// `None`: `http://<bound address>/mcp` (a loopback `bind_addr` only).
    pub resource: Option<String>,
    /// Accepted JWS algorithm names (a subset of RS256, PS256, ES256, EdDSA).
    pub algorithms: Vec<String>,
    pub clock_skew: Duration,
    /// The key set's URL; `None`: discovered from the issuer's metadata.
    pub jwks_uri: Option<String>,
    pub jwks_refresh: Duration,
    pub jwks_min_refresh_interval: Duration,
    pub jwks_timeout: Duration,
    pub jwks_max_bytes: usize,
    pub scopes: OAuthScopes,
    /// RFC 7662 introspection of opaque tokens, when configured.
    pub introspection: Option<IntrospectionSettings>,
}

/// `auth.oauth.introspection_*`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct IntrospectionSettings {
    pub client_id: String,
    pub client_secret: Secret,
    /// `None`: the issuer metadata's `introspection_endpoint`.
    pub endpoint: Option<String>,
    pub cache_for: Duration,
    pub cache_entries: usize,
}

/// The scope names each kind of request needs (empty: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthScopes {
    pub run: String,
    pub sessions_read: String,
    pub sessions_write: String,
}

/// The engine: where Pyodide and packages come from, and each sandbox's budgets.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// The pinned Pyodide files; `None`: node_modules/pyodide.
    pub asset_dir: Option<PathBuf>,
    pub allowed_hosts: Vec<String>,
    /// The package directory (an https:// mirror, a file:// URL or a directory); `None`: the
    /// Pyodide CDN of the pinned version.
    pub package_base_url: Option<String>,
    pub package_cache_dir: PathBuf,
    pub preinstall_packages: Vec<String>,
    pub preimport_modules: Vec<String>,
    pub preimport_preinstalled: bool,
    pub package_index_urls: Vec<String>,
    pub extra_ca_certs: Vec<PathBuf>,
    /// `[[network.hosts]]`: HTTPS hosts granted to sandboxed code.
    pub host_grants: Vec<HostGrant>,
    pub runtime_package_installation: bool,
    pub boot: BootMode,
    /// Map the pre-imported snapshot's memory into sandboxes copy-on-write instead of copying it.
    pub map_snapshot_memory: bool,
    /// Keep the pre-imported snapshot in a sealed file when its memory is copied too, so that idle
    /// ready sandboxes can give back what they hold unchanged (`workers.idle_give_back_s` > 0).
    pub give_back_idle_memory: bool,
    pub memory_limit_mb: u64,
    pub wasm_memory_limit_mb: u64,
    pub sandbox_memory_limit_mb: u64,
    pub setup_timeout: Duration,
    /// DataFrames displayed as Markdown tables show at most this many rows and columns.
    pub table_rows: u64,
    pub table_columns: u64,
    /// `results.figure_plotly_js`: "cdn", "inline", or a URL of plotly.js.
    pub figure_plotly_js: String,
}

/// The worker pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSettings {
    pub max_workers: usize,
    pub queue_capacity: usize,
    /// Workers prewarmed (the default cut to `max_workers`).
    pub prewarmed_workers: usize,
    /// Sandboxes each prewarmed worker keeps ready (at least 1).
    pub ready_sandboxes: usize,
    /// Of those, when they are of the kind with pre-imported modules (at least 1).
    pub ready_preimported_sandboxes: usize,
    /// How long a worker stays idle before its ready sandboxes give back the memory they hold
    /// unchanged (`Backend::give_back`); `None` for never.
    pub idle_give_back: Option<std::time::Duration>,
}

/// Stateful sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// Sessions at most, in memory or saved.
    pub max_sessions: usize,
    /// Sessions in memory at most.
    pub max_resident: usize,
    /// An idle session is spilled to the store after this long (`None`: only past `max_resident`
    /// and at shutdown).
    pub spill_after: Option<Duration>,
    /// `sessions.store_url` as configured (empty: the default directory; `off`: no store).
    pub store_url: String,
    /// Calls that may wait for a busy session behind its running one.
    pub queue_capacity: usize,
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
    /// Sessions one principal may hold (`quotas.max_sessions`); `None`: no limit.
    pub max_per_principal: Option<usize>,
}

/// run_python_code as an MCP task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSettings {
    /// Tasks running at once at most (the default derived from max_workers already applied).
    pub max_running: usize,
    /// Tasks that may wait for a running slot.
    pub queue_capacity: usize,
    /// How long a task and its result are kept after it was created.
    pub ttl: Duration,
    /// The largest timeout_ms a task may set.
    pub max_timeout_ms: u64,
    /// A call that ends within this is answered inline (zero: every call is a task at once).
    pub immediate_result: Duration,
}

/// The snippet catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct SnippetSettings {
    pub catalog: CodeSnippetsConfig,
    /// Fewer matches than this are filled up with other snippets.
    pub min_hits: usize,
}
