//! The configuration type as files and environment variables spell it: [`AppConfig`] and its
//! tables, every key with its default (the `Default` impls), its documentation and its environment
//! override (the `Environment:` line of the key's doc comment, read by `reference.rs`).

use std::collections::BTreeMap;

use facet::Facet;
use serde::{Deserialize, Serialize};

use code_interpreter_mcp_protocol::InputLimits;

/// File name of the main configuration file, looked up in the working directory.
pub const CONFIG_FILE: &str = "code-interpreter-mcp.toml";
/// Suffix of the additional configuration files, looked up in the working directory.
pub const AUTO_SUFFIX: &str = ".auto.code-interpreter-mcp.toml";

/// Server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct AppConfig {
    /// HTTP socket address to listen on; port 0 lets the operating system pick a free port.
    /// Environment: CODE_INTERPRETER_MCP_BIND_ADDR
    pub bind_addr: String,
    /// HTTPS hosts sandboxes may download from (subdomains are accepted).
    /// Environment: CODE_INTERPRETER_MCP_ALLOWED_HOSTS (comma-separated)
    pub allowed_hosts: Vec<String>,
    /// Directory with the files of the pinned `pyodide` npm package (empty: node_modules/pyodide).
    /// Environment: CODE_INTERPRETER_MCP_ASSET_DIR
    pub asset_dir: String,
    /// Directory of the durable local package layer.
    /// Environment: CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR
    pub package_cache_dir: String,
    /// Where Pyodide package wheels come from: an https:// mirror of the Pyodide package directory, a
    /// file:// URL or a local directory (empty: the Pyodide CDN directory of the pinned version).
    /// Environment: CODE_INTERPRETER_MCP_PACKAGE_BASE_URL
    pub package_base_url: String,
    /// micropip requirements installed once at start-up into the package layer (version constraints
    /// and wheel URLs allowed); the layer is rebuilt when this list or the Pyodide version changes.
    /// Environment: CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES (whitespace-separated: requirements may contain commas)
    pub preinstall_packages: Vec<String>,
    /// Python modules (of the preinstalled packages, e.g. "pandas", "matplotlib.pyplot") imported
    /// once at start-up into a second memory snapshot that every sandbox restores instead of the plain
    /// one, their shared libraries relinked at the recorded addresses: `import pandas` then costs
    /// nothing in a fresh sandbox, and every sandbox's start-up costs more (see the README). Empty:
    /// none. If that snapshot cannot be made or does not work, sandboxes import as usual (a warning).
    /// Environment: CODE_INTERPRETER_MCP_PREIMPORT_MODULES (comma-separated)
    pub preimport_modules: Vec<String>,
    /// Pre-import the top-level modules of preinstall_packages too (their import names in Pyodide's
    /// lock file, e.g. scikit-learn as sklearn; matplotlib as matplotlib.pyplot; a package outside
    /// the lock by its own name), as if listed in preimport_modules. Only with workers.boot =
    /// "snapshot"; if that snapshot cannot be made, a warning, and sandboxes import as usual.
    /// Environment: CODE_INTERPRETER_MCP_PREIMPORT_PREINSTALLED
    pub preimport_preinstalled: bool,
    /// micropip package index URLs, tried in order: a simple index base (PEP 503/691) or a JSON API
    /// URL containing {package_name}; empty keeps micropip's default (the Python Package Index).
    /// Environment: CODE_INTERPRETER_MCP_PACKAGE_INDEX_URLS (comma-separated)
    pub package_index_urls: Vec<String>,
    /// PEM files with CA certificates trusted for outbound HTTPS in addition to the system and
    /// built-in roots (a private package mirror or index).
    /// Environment: CODE_INTERPRETER_MCP_EXTRA_CA_CERTS (comma-separated)
    pub extra_ca_certs: Vec<String>,
    /// Load packages for recognised imports and allow micropip.install at run time.
    /// Environment: CODE_INTERPRETER_MCP_RUNTIME_PACKAGE_INSTALLATION (true/false)
    pub runtime_package_installation: bool,
    /// Inbound HTTP Host allowlist for /mcp; empty keeps the loopback defaults. `host:port` pins a port.
    /// Environment: CODE_INTERPRETER_MCP_HTTP_ALLOWED_HOSTS (comma-separated)
    pub http_allowed_hosts: Vec<String>,
    /// Browser origins allowed on /mcp (scheme://host[:port]); requests with another Origin get 403.
    /// Environment: CODE_INTERPRETER_MCP_HTTP_ALLOWED_ORIGINS (comma-separated)
    pub http_allowed_origins: Vec<String>,
    /// Accept any inbound Host header (disables DNS-rebinding protection).
    /// Environment: CODE_INTERPRETER_MCP_SKIP_HOST_HEADER_VERIFICATION (true/false)
    pub skip_host_header_verification: bool,
    /// Log line format on stderr: "text" or "json".
    /// Environment: CODE_INTERPRETER_MCP_LOG_FORMAT
    pub log_format: LogFormat,
    /// This replica's name when several serve one endpoint: session ids (and legacy-era MCP session
    /// ids) start with it and a dot, so a load balancer can route a session's calls to its replica
    /// without reading bodies (lower-case letters, digits and '-', at most 63; empty: no prefix).
    /// Environment: CODE_INTERPRETER_MCP_REPLICA_ID
    pub replica_id: String,
    /// Authentication of /mcp requests.
    pub auth: AuthConfig,
    /// Python execution workers.
    pub workers: WorkersConfig,
    /// Decoded input file limits, in KB (1 KB = 1024 bytes).
    pub input_limits: InputLimitsConfig,
    /// Code snippet search.
    pub search: SearchConfig,
    /// Configured code snippets.
    pub code_snippets: CodeSnippetsConfig,
    /// Stateful sessions: one interpreter kept alive across calls.
    pub sessions: SessionsConfig,
    /// run_python_code as an MCP task (the io.modelcontextprotocol/tasks extension).
    pub tasks: TasksConfig,
    /// What results carry besides the JSON.
    pub results: ResultsConfig,
    /// Integrations with other systems.
    pub integrations: IntegrationsConfig,
    /// What one principal (an OAuth subject, a bearer token, or everyone without authentication)
    /// may use of this replica.
    pub quotas: QuotasConfig,
    /// MCP servers whose tools the sandbox may call (`from upstream import NAME`), by name.
    pub upstream: BTreeMap<String, UpstreamConfig>,
    /// Outbound HTTPS the operator grants to sandboxed code beyond the package hosts.
    pub network: NetworkConfig,
}

/// `[network]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// `[[network.hosts]]`: HTTPS hosts sandboxed code may call (requests, httpx, urllib,
    /// pandas.read_csv, pyfetch), each with its methods, path prefixes and headers added in this
    /// server (credentials the code never sees).
    pub hosts: Vec<HostGrantConfig>,
}

/// `[[network.hosts]]`: one HTTPS host granted to sandboxed code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct HostGrantConfig {
    /// The host: a name ("api.example.com"), "*.example.com" (its subdomains, not itself), or an
    /// IP address.
    pub host: String,
    /// HTTP methods allowed to it.
    pub methods: Vec<String>,
    /// URL path prefixes allowed ("/v1/"); "/" is every path.
    pub paths: Vec<String>,
    /// Headers this server adds to every request to the host, after it leaves the sandbox; values
    /// as in upstream headers ("Bearer ${TOKEN}", "@/run/secrets/token"). The code cannot read them
    /// or set them itself; they never follow a redirect to another host, and a response that
    /// contains one verbatim is refused.
    pub inject_headers: BTreeMap<String, String>,
    /// Largest response body from the host, in MB (at most 100).
    pub max_response_mb: u64,
    /// Allow the host to resolve to private, loopback or link-local addresses (refused by default,
    /// checked after DNS resolution, so a name cannot be rebound to one).
    pub allow_private_addresses: bool,
}

impl Default for HostGrantConfig {
    fn default() -> Self {
        Self {
            host: String::new(),
            methods: vec!["GET".into(), "HEAD".into()],
            paths: vec!["/".into()],
            inject_headers: BTreeMap::new(),
            max_response_mb: 100,
            allow_private_addresses: false,
        }
    }
}

/// `[quotas]`: per principal, on this replica; 0 is no limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct QuotasConfig {
    /// Calls a principal may have in progress at once, queued or running, run_python_code and its
    /// tasks alike (0 to 10000; 0: no limit). One more is refused with QuotaExceeded.
    /// Environment: CODE_INTERPRETER_MCP_QUOTAS_MAX_CONCURRENT_CALLS
    pub max_concurrent_calls: u64,
    /// Sandbox seconds a principal may use per minute (0 to 86400; 0: no limit): a bucket of that
    /// many seconds, refilled continuously, charged with each call's execution time (time a worker
    /// is held, sleeps included). A call is admitted while the bucket is not empty.
    /// Environment: CODE_INTERPRETER_MCP_QUOTAS_CPU_SECONDS_PER_MINUTE
    pub cpu_seconds_per_minute: u64,
    /// Tasks a principal may hold (working or kept for their result; 0 to 100000; 0: no limit).
    /// Environment: CODE_INTERPRETER_MCP_QUOTAS_MAX_TASKS
    pub max_tasks: u64,
    /// Calls a principal may have waiting for a worker at once (0 to 10000; 0: no limit): one more
    /// is refused with QuotaExceeded, so one principal cannot fill workers.queue_capacity.
    /// Environment: CODE_INTERPRETER_MCP_QUOTAS_MAX_QUEUED_CALLS
    pub max_queued_calls: u64,
    /// Sessions a principal may hold on this replica, resident or spilled (0 to 100000; 0: no
    /// limit): creating or forking one more is refused with QuotaExceeded until one is cleared or
    /// expires.
    /// Environment: CODE_INTERPRETER_MCP_QUOTAS_MAX_SESSIONS
    pub max_sessions: u64,
    /// A principal's share of the workers when several wait (1 to 100): the queue serves each
    /// principal in proportion to its weight, first come first served within one.
    /// Environment: CODE_INTERPRETER_MCP_QUOTAS_WEIGHT
    pub weight: u64,
    /// `[[quotas.overrides]]`: other quotas for some principals, the first entry that matches
    /// wins; a key an entry leaves out keeps the value above.
    pub overrides: Vec<QuotaOverrideConfig>,
}

impl Default for QuotasConfig {
    fn default() -> Self {
        Self {
            max_concurrent_calls: 0,
            cpu_seconds_per_minute: 0,
            max_tasks: 0,
            max_queued_calls: 0,
            max_sessions: 0,
            weight: 1,
            overrides: Vec::new(),
        }
    }
}

/// `[[quotas.overrides]]`: which principals it applies to (`name`, or `claim` and `value`), and
/// their quotas.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaOverrideConfig {
    /// A named static token's name (auth.named_tokens).
    pub name: String,
    /// An access token claim (string, or array of strings: one element must equal `value`), e.g.
    /// "tier"; OAuth principals only.
    pub claim: String,
    /// The value `claim` must have.
    pub value: String,
    /// As quotas.max_concurrent_calls (absent: unchanged).
    pub max_concurrent_calls: Option<u64>,
    /// As quotas.cpu_seconds_per_minute (absent: unchanged).
    pub cpu_seconds_per_minute: Option<u64>,
    /// As quotas.max_tasks (absent: unchanged).
    pub max_tasks: Option<u64>,
    /// As quotas.max_queued_calls (absent: unchanged).
    pub max_queued_calls: Option<u64>,
    /// As quotas.max_sessions (absent: unchanged).
    pub max_sessions: Option<u64>,
    /// As quotas.weight (absent: unchanged).
    pub weight: Option<u64>,
}

/// `[auth]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// File of accepted bearer tokens, one per line (blank lines and # comments ignored); when set,
    /// every /mcp request needs `Authorization: Bearer <token>` (probes and /metrics do not). Reloaded
    /// when it changes or on SIGHUP. Empty: no authentication.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE
    pub bearer_tokens_file: String,
    /// Each line of bearer_tokens_file is `NAME:TOKEN`: the name (letters, digits, '.', '_', '-';
    /// at most 64) is the principal, so a token can be replaced without losing its sessions and
    /// tasks, and logs, quota overrides and the principal metric label use it.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_NAMED_TOKENS (true/false)
    pub named_tokens: bool,
    /// `[auth.oauth]`: /mcp as an OAuth 2.1 resource server (JWT access tokens from one issuer).
    pub oauth: OAuthConfig,
}

/// `[auth.oauth]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthConfig {
    /// The authorization server's issuer identifier (https, or http on a loopback address); when
    /// set, /mcp accepts JWT access tokens it signed (RFC 9068) for this server's `resource`, serves
    /// RFC 9728 metadata at /.well-known/oauth-protected-resource, and names it in every 401.
    /// Static tokens of `auth.bearer_tokens_file` keep working beside it. Empty: off.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_ISSUER (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_ISSUER)
    pub issuer: String,
    /// This server's resource identifier (RFC 8707): the `aud` every token must carry and the
    /// `resource` of the metadata, e.g. https://mcp.example.com/mcp. Empty: http://<bind_addr>/mcp,
    /// allowed only when bind_addr is a loopback address.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_RESOURCE (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_RESOURCE)
    pub resource: String,
    /// Signature algorithms accepted, among RS256, PS256, ES256 and EdDSA (`none` and HS* never).
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_ALGORITHMS (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_ALGORITHMS) (comma-separated)
    pub algorithms: Vec<String>,
    /// Seconds of clock difference allowed on `exp` and `nbf` (0 to 300).
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_CLOCK_SKEW_S (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_CLOCK_SKEW_S)
    pub clock_skew_s: u64,
    /// Where the issuer's signing keys are; empty: the `jwks_uri` of its metadata
    /// (/.well-known/oauth-authorization-server, then /.well-known/openid-configuration).
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_URI (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_JWKS_URI)
    pub jwks_uri: String,
    /// Seconds between refreshes of the signing keys (1 to 86400); a token with an unknown key id
    /// refreshes them sooner, at most once per `jwks_min_refresh_interval_s`.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_REFRESH_S (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_JWKS_REFRESH_S)
    pub jwks_refresh_s: u64,
    /// Seconds at least between two fetches of the signing keys (1 to 3600), whatever tokens arrive.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_MIN_REFRESH_INTERVAL_S (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_JWKS_MIN_REFRESH_INTERVAL_S)
    pub jwks_min_refresh_interval_s: u64,
    /// Time allowed for one fetch of the metadata or the keys, in milliseconds (100 to 30000).
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_TIMEOUT_MS (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_JWKS_TIMEOUT_MS)
    pub jwks_timeout_ms: u64,
    /// Largest key set or metadata document read, in KB (1 to 4096); a larger one is refused and the
    /// current keys kept.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_MAX_KB (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_JWKS_MAX_KB)
    pub jwks_max_kb: u64,
    /// The scope a token needs to run code: run_python_code, the snippet and upstream tools, and
    /// tasks. Empty: none needed.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_SCOPE_RUN (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_SCOPE_RUN)
    pub scope_run: String,
    /// The scope a token needs to read sessions: list_session_files and session:// resources
    /// (`scope_sessions_write` implies it). Empty: none needed.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_SCOPE_SESSIONS_READ (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_SCOPE_SESSIONS_READ)
    pub scope_sessions_read: String,
    /// The scope a token needs to create or change sessions: run_python_code with a session_id,
    /// clear_session and fork_session. Empty: none needed.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_SCOPE_SESSIONS_WRITE (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_SCOPE_SESSIONS_WRITE)
    pub scope_sessions_write: String,
    /// This server's client id at the issuer's introspection endpoint (RFC 7662); when set, bearer
    /// tokens that are not JWTs (opaque tokens) are checked there. Empty: only JWTs are accepted.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_ID (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_INTROSPECTION_CLIENT_ID)
    pub introspection_client_id: String,
    /// Its client secret, sent as HTTP Basic authentication: a template, `${NAME}` (an environment
    /// variable) or `@/path` (a file's contents), resolved at start and never logged.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_SECRET (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_INTROSPECTION_CLIENT_SECRET)
    pub introspection_client_secret: String,
    /// The introspection endpoint; empty: the `introspection_endpoint` of the issuer's metadata.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_ENDPOINT (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_INTROSPECTION_ENDPOINT)
    pub introspection_endpoint: String,
    /// Seconds an active token's introspection is reused (0 to 3600; never past the token's `exp`):
    /// a revoked token keeps working this long.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CACHE_S (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_INTROSPECTION_CACHE_S)
    pub introspection_cache_s: u64,
    /// Tokens whose introspection is kept at most (1 to 1000000), as digests.
    /// Environment: CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CACHE_ENTRIES (deprecated alias: CODE_INTERPRETER_MCP_OAUTH_INTROSPECTION_CACHE_ENTRIES)
    pub introspection_cache_entries: u64,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        Self {
            issuer: String::new(),
            resource: String::new(),
            algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
            clock_skew_s: 30,
            jwks_uri: String::new(),
            jwks_refresh_s: 300,
            jwks_min_refresh_interval_s: 10,
            jwks_timeout_ms: 3000,
            jwks_max_kb: 256,
            scope_run: "code:run".into(),
            scope_sessions_read: "sessions:read".into(),
            scope_sessions_write: "sessions:write".into(),
            introspection_client_id: String::new(),
            introspection_client_secret: String::new(),
            introspection_endpoint: String::new(),
            introspection_cache_s: 60,
            introspection_cache_entries: 10_000,
        }
    }
}

/// `[sessions]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Offer sessions: run_python_code's session_id, list_session_files, clear_session and the
    /// session:// resources.
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_ENABLED (true/false)
    pub enabled: bool,
    /// Sessions at most, in memory or saved in the store (1 to 100000); creating one more fails at
    /// once.
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_MAX_SESSIONS (deprecated alias: CODE_INTERPRETER_MCP_MAX_SESSIONS)
    pub max_sessions: u64,
    /// Sessions in memory at most (1 to 1024): past it, the least recently used idle session that
    /// can be saved is spilled to the store; when none can, creating or resuming one more fails at
    /// once.
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_MAX_RESIDENT
    pub max_resident: u64,
    /// A session idle for this many seconds is saved to the store and its sandbox freed; its next
    /// call resumes it (same id, state intact). 0: spill only past max_resident and at shutdown.
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_SPILL_AFTER_S
    pub spill_after_s: u64,
    /// Where sessions are saved (encrypted with a key derived from the session id, under names
    /// derived from its hash): empty for the directory `<package_cache_dir>/sessions`, an absolute
    /// path or file:///path, `s3://bucket/prefix` for S3-compatible storage shared by replicas
    /// (configured by the usual AWS_* environment variables: AWS_ENDPOINT_URL, AWS_REGION,
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP), or `off` (sessions live in memory
    /// only and end with the process). A URL that names no usable store stops start-up.
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_STORE_URL
    pub store_url: String,
    /// Calls that may wait for one busy session behind its running call (0 to 64); one more is
    /// refused at once with the overload error.
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_QUEUE_CAPACITY (deprecated alias: CODE_INTERPRETER_MCP_SESSION_QUEUE_CAPACITY)
    pub queue_capacity: u64,
    /// A session unused for this many seconds ends (at least 1).
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_IDLE_TIMEOUT_S (deprecated alias: CODE_INTERPRETER_MCP_SESSION_IDLE_TIMEOUT_S)
    pub idle_timeout_s: u64,
    /// A session ends this many seconds after it was created, used or not (at least 1).
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_MAX_LIFETIME_S (deprecated alias: CODE_INTERPRETER_MCP_SESSION_MAX_LIFETIME_S)
    pub max_lifetime_s: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_sessions: 1000,
            max_resident: 8,
            spill_after_s: 60,
            store_url: String::new(),
            queue_capacity: 4,
            idle_timeout_s: 1800,
            max_lifetime_s: 86400,
        }
    }
}

/// `[tasks]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    /// Offer tasks: a client that declares the io.modelcontextprotocol/tasks extension gets a task
    /// handle for each run_python_code call at once and polls tasks/get for the result.
    /// Environment: CODE_INTERPRETER_MCP_TASKS_ENABLED (true/false)
    pub enabled: bool,
    /// Tasks running at once at most; the others wait in the tasks' own queue (0: one less than
    /// workers.max_workers, at least 1, so that long tasks never take every worker from synchronous
    /// calls).
    /// Environment: CODE_INTERPRETER_MCP_TASKS_MAX_RUNNING
    pub max_running: u64,
    /// Tasks that may wait for a running slot (0 to 10000); one more is refused with the overload
    /// error.
    /// Environment: CODE_INTERPRETER_MCP_TASKS_QUEUE_CAPACITY
    pub queue_capacity: u64,
    /// A task and its result are kept this many seconds after it was created (a task still running
    /// then fails; a finished one is dropped one more such period after it finished).
    /// Environment: CODE_INTERPRETER_MCP_TASKS_TTL_S
    pub ttl_s: u64,
    /// The largest timeout_ms a task may set (a synchronous call keeps the 120,000 ms cap), at most
    /// 86,400,000 (24 h).
    /// Environment: CODE_INTERPRETER_MCP_TASKS_MAX_TIMEOUT_MS
    pub max_timeout_ms: u64,
    /// A call from a client that declared tasks is answered inline when it ends within this many
    /// milliseconds (0 to 120000), and becomes a task past them; 0: every such call is a task at
    /// once. A call whose timeout_ms exceeds the synchronous cap is a task at once.
    /// Environment: CODE_INTERPRETER_MCP_TASKS_IMMEDIATE_RESULT_MS
    pub immediate_result_ms: u64,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_running: 0,
            queue_capacity: 16,
            ttl_s: 3600,
            max_timeout_ms: 1_800_000,
            immediate_result_ms: 1000,
        }
    }
}

/// `[results]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct ResultsConfig {
    /// Returned images up to this size (KB) are also inlined as MCP image content; larger ones are
    /// only returned as files (0: never inline).
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_MAX_INLINE_IMAGE_KB (deprecated alias: CODE_INTERPRETER_MCP_MAX_INLINE_IMAGE_KB)
    pub max_inline_image_kb: u64,
    /// The text content a model reads of a result is at most about this many characters: long
    /// stdout, stderr, result and displays keep their head and tail with a marker saying how much was
    /// cut and where the whole is (the structured content keeps the per-request caps). 0: no cap.
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_MAX_TEXT_CHARS (deprecated alias: CODE_INTERPRETER_MCP_MAX_TEXT_CHARS)
    pub max_text_chars: u64,
    /// DataFrames and Series displayed (or left as the final expression) also come as a Markdown
    /// table of at most this many rows, the first and last ones (2 to 1000).
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_MAX_TABLE_ROWS (deprecated alias: CODE_INTERPRETER_MCP_MAX_TABLE_ROWS)
    pub max_table_rows: u64,
    /// ... and at most this many columns (2 to 1000).
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_MAX_TABLE_COLUMNS (deprecated alias: CODE_INTERPRETER_MCP_MAX_TABLE_COLUMNS)
    pub max_table_columns: u64,
    /// Results carry structured content and tools their output schemas (MCP 2025-06-18 on). false
    /// serves every client as a 2025-03-26 client is served: the text and content blocks only,
    /// returned files as embedded resources. For clients that hand a model the structured content
    /// whole (pydantic-ai's MCP toolsets), where returned files' Base64 would reach it as text.
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_STRUCTURED_CONTENT (deprecated alias: CODE_INTERPRETER_MCP_STRUCTURED_CONTENT)
    pub structured_content: bool,
    /// Interactive results as MCP Apps (the `io.modelcontextprotocol/ui` extension): for a client
    /// that declares the extension, run_python_code names a `ui://` view that renders its plotly
    /// figures, images and output in the client. Clients without the extension see no change. The
    /// views' scripts (plotly.js and the extension's app library, from npm) are read at start-up from
    /// apps_asset_dir and checked against pinned sha256 digests.
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_APPS (deprecated alias: CODE_INTERPRETER_MCP_APPS)
    pub apps: bool,
    /// The directory holding the views' scripts `plotly-cartesian.min.js` (npm
    /// plotly.js-cartesian-dist-min) and `app-with-deps.js` (npm @modelcontextprotocol/ext-apps);
    /// empty: the npm packages under `node_modules` (`npm ci` installs them).
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_APPS_ASSET_DIR (deprecated alias: CODE_INTERPRETER_MCP_APPS_ASSET_DIR)
    pub apps_asset_dir: String,
    /// For a client with interactive results: a DataFrame or Series displayed (or left as the
    /// final expression) also travels as data for the view's grid (sort, filter, pages), its
    /// first rows up to this many (0 to 100000; 0: no grid data). It goes in the result's `_meta`,
    /// never in the text or structured content the model reads, which keep the Markdown table.
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_MAX_TABLE_ROWS_APP (deprecated alias: CODE_INTERPRETER_MCP_MAX_TABLE_ROWS_APP)
    pub max_table_rows_app: u64,
    /// Where a plotly figure's figure-N.html gets plotly.js: "cdn" (plotly's CDN, a small file that
    /// needs the network when opened), "inline" (the whole plotly.js in the file, ~4.8 MB, opens
    /// offline), or the URL of a plotly.js the operator hosts (https://..., http://... or /...,
    /// ending in .js).
    /// Environment: CODE_INTERPRETER_MCP_RESULTS_FIGURE_PLOTLY_JS (deprecated alias: CODE_INTERPRETER_MCP_FIGURE_PLOTLY_JS)
    pub figure_plotly_js: String,
}

impl Default for ResultsConfig {
    fn default() -> Self {
        Self {
            max_inline_image_kb: 1024,
            max_text_chars: 20_000,
            max_table_rows: 20,
            max_table_columns: 20,
            structured_content: true,
            apps: true,
            apps_asset_dir: String::new(),
            max_table_rows_app: 10_000,
            figure_plotly_js: "cdn".into(),
        }
    }
}

/// `[workers]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    /// Maximum simultaneous executions.
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS (deprecated alias: CODE_INTERPRETER_MCP_MAX_WORKERS)
    pub max_workers: u64,
    /// Maximum number of requests waiting for a worker.
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY (deprecated alias: CODE_INTERPRETER_MCP_QUEUE_CAPACITY)
    pub queue_capacity: u64,
    /// Workers that initialise Pyodide before the server accepts requests and keep a stock of ready
    /// sandboxes (at most max_workers; the default, 2, is cut to max_workers when that is lower).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS (deprecated alias: CODE_INTERPRETER_MCP_PREWARMED_WORKERS)
    pub prewarmed_workers: u64,
    /// Sandboxes each prewarmed worker keeps booted and ready (1 to 64). A call takes one; the
    /// worker boots replacements while no call waits, so up to this many calls back to back per
    /// prewarmed worker start without waiting for a boot. Each ready sandbox holds about 30 MB
    /// (more with pre-imported modules).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_READY_SANDBOXES (deprecated alias: CODE_INTERPRETER_MCP_READY_SANDBOXES)
    pub ready_sandboxes: u64,
    /// Of those, how many a prewarmed worker keeps when they are sandboxes with pre-imported
    /// modules (1 to 64; at most ready_sandboxes). Each holds about 90 MB with pandas and
    /// matplotlib (45 MB with map_snapshot_memory; ~20 MB once idle_give_back_s has passed),
    /// against 26 MB for a plain one; two per worker
    /// serve a burst's first four data-science calls without a wait (docs/performance.md).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_READY_PREIMPORTED_SANDBOXES (deprecated alias: CODE_INTERPRETER_MCP_READY_PREIMPORTED_SANDBOXES)
    pub ready_preimported_sandboxes: u64,
    /// V8 heap budget per isolate in MB (1 MB = 1,048,576 bytes).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_MEMORY_LIMIT_MB (deprecated alias: CODE_INTERPRETER_MCP_MEMORY_LIMIT_MB)
    pub memory_limit_mb: u64,
    /// Cap on one WebAssembly linear memory (Python's heap) in MB, 16 to 4096.
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_WASM_MEMORY_LIMIT_MB (deprecated alias: CODE_INTERPRETER_MCP_WASM_MEMORY_LIMIT_MB)
    pub wasm_memory_limit_mb: u64,
    /// How sandboxes start: "snapshot" restores a Pyodide memory snapshot taken once at start-up
    /// (fast), "full" boots Pyodide from scratch every time (slow; the fallback).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_BOOT (deprecated alias: CODE_INTERPRETER_MCP_BOOT)
    pub boot: BootMode,
    /// Map the memory of the snapshot with pre-imported modules into each sandbox copy-on-write
    /// (Linux), copying up front only the pages that everyday steps at start-up wrote, instead of
    /// copying all of it: a ready sandbox with pandas and matplotlib holds ~45 MB instead of ~88 MB
    /// (the server ~75 MB less idle, ~150 MB less after a load) and is made ~13 % faster, while a
    /// call takes ~1-5 ms longer (a page first written in a call costs a fault) and pandas
    /// throughput at concurrency 8 is ~0.9x (docs/performance.md). For memory-bound deployments:
    /// with it, ready_preimported_sandboxes = 2 costs what 1 does without.
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_MAP_SNAPSHOT_MEMORY (deprecated alias: CODE_INTERPRETER_MCP_MAP_SNAPSHOT_MEMORY)
    pub map_snapshot_memory: bool,
    /// Seconds a worker stays idle before its ready pre-imported sandboxes give back the pages of
    /// their memory that still hold the snapshot's bytes, 0 for never (0 to 86400). A copied memory
    /// becomes a copy-on-write mapping of the snapshot (kept in a sealed in-memory file, which
    /// costs no more than the copy the engine keeps otherwise) with only the pages that differ its
    /// own; a mapped one drops the pages copied up front and not written since. A ready sandbox
    /// with pandas and matplotlib then holds ~20 MB instead of ~90 MB (copied) or ~50 MB (mapped);
    /// the first call on it after that takes a few ms longer (print(1) ~4, a pandas groupby ~10),
    /// as it copies the pages it writes when it writes them (docs/performance.md).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_IDLE_GIVE_BACK_S (deprecated alias: CODE_INTERPRETER_MCP_IDLE_GIVE_BACK_S)
    pub idle_give_back_s: u64,
    /// Memory budget per sandbox outside the V8 heap, in MB: ArrayBuffers and typed arrays, in-memory
    /// file data, network responses and Python's WebAssembly memory, together. Exceeding it ends the
    /// call with MemoryLimitExceeded (a file write past it fails with ENOSPC first). A sandbox uses at
    /// most this plus memory_limit_mb (64 to 1048576).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_SANDBOX_MEMORY_LIMIT_MB (deprecated alias: CODE_INTERPRETER_MCP_SANDBOX_MEMORY_LIMIT_MB)
    pub sandbox_memory_limit_mb: u64,
    /// Time allowed per call for its set-up, in seconds: writing the input files and loading the
    /// packages its imports need, before timeout_ms starts (1 to 3600).
    /// Environment: CODE_INTERPRETER_MCP_WORKERS_SETUP_TIMEOUT_S (deprecated alias: CODE_INTERPRETER_MCP_SETUP_TIMEOUT_S)
    pub setup_timeout_s: u64,
}

/// `workers.boot`: how sandboxes start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Facet)]
#[serde(rename_all = "lowercase", try_from = "String")]
#[repr(u8)]
pub enum BootMode {
    /// Restore the Pyodide memory snapshot taken once at start-up.
    Snapshot,
    /// Run CPython's whole start-up in every sandbox.
    Full,
}

impl TryFrom<String> for BootMode {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.as_str() {
            "snapshot" => Ok(Self::Snapshot),
            "full" => Ok(Self::Full),
            _ => Err(format!("{value:?} must be \"snapshot\" or \"full\"")),
        }
    }
}

/// `log_format`: how log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Facet)]
#[serde(rename_all = "lowercase", try_from = "String")]
#[repr(u8)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

impl TryFrom<String> for LogFormat {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(format!("{value:?} must be \"text\" or \"json\"")),
        }
    }
}

/// `[input_limits]`
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct InputLimitsConfig {
    /// Decoded KB allowed per input file (1 to 1048576).
    /// Environment: CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_FILE_KB (deprecated alias: CODE_INTERPRETER_MCP_MAX_FILE_KB)
    pub max_file_kb: u64,
    /// Decoded KB allowed across the input files of one request (1 to 1048576).
    /// Environment: CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_TOTAL_FILE_KB (deprecated alias: CODE_INTERPRETER_MCP_MAX_TOTAL_FILE_KB)
    pub max_total_file_kb: u64,
}

/// `[search]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Minimum number of snippets a search returns, filled with the next best ones (0: only matches).
    pub min_hits: u64,
}

/// `[code_snippets]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct CodeSnippetsConfig {
    /// Offer list_code_snippets and get_code_snippet.
    pub enabled: bool,
    /// When this or include_snippet_tags is non-empty, only listed ids (or tagged snippets) are visible.
    pub include_snippet_ids: Vec<String>,
    /// When this or include_snippet_ids is non-empty, only snippets with a listed tag (or id) are visible.
    pub include_snippet_tags: Vec<String>,
    /// Snippet ids that are never visible (wins over the include lists).
    pub exclude_snippet_ids: Vec<String>,
    /// The snippets, by id.
    pub snippets: BTreeMap<String, Snippet>,
}

/// `[code_snippets.snippets.ID]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields)]
pub struct Snippet {
    /// Short title.
    pub title: String,
    /// What the snippet does.
    pub description: String,
    /// Packages the snippet imports.
    #[serde(default)]
    pub required_python_packages: Vec<String>,
    /// Tags for include filters.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The Python source.
    pub code_snippet: String,
}

/// `[upstream.NAME]`: an MCP server whose tools the sandbox's code may call as Python functions
/// (`from upstream import NAME`). NAME is a Python identifier. The connection, the grant and every
/// credential stay in the server process: code in the sandbox reaches only the granted tools, through
/// one checked operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Streamable HTTP endpoint of the server (https://, or http:// to a loopback address); exactly
    /// one of url and command.
    pub url: String,
    /// HTTP headers sent with every request to url. A value may name environment variables
    /// ("Bearer ${GITHUB_TOKEN}") or be read from a file ("@/run/secrets/token"); values never reach
    /// the sandbox, results, logs or metrics.
    pub headers: BTreeMap<String, String>,
    /// Program of a stdio server, started once by this server and restarted when it exits.
    pub command: String,
    /// Arguments of command.
    pub args: Vec<String>,
    /// Environment of command (values as in headers); it inherits only PATH and HOME.
    pub env: BTreeMap<String, String>,
    /// Tools the sandbox may call (empty: every tool the server lists).
    pub tools: Vec<String>,
    /// Tools the sandbox may never call (wins over tools).
    pub deny_tools: Vec<String>,
    /// Calls to this server one execution may make.
    pub max_calls_per_execution: u64,
    /// Calls to this server in flight at once from all sandboxes together; a call over it waits for
    /// a slot within its own timeout.
    pub max_concurrent_calls: u64,
    /// Longest one call may take (the execution's own timeout still applies).
    pub timeout_ms: u64,
    /// Largest result one call may return, in KB (larger ones fail without being read whole).
    pub max_result_kb: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            headers: BTreeMap::new(),
            command: String::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            tools: Vec::new(),
            deny_tools: Vec::new(),
            max_calls_per_execution: 100,
            max_concurrent_calls: 16,
            timeout_ms: 30_000,
            max_result_kb: 1024,
        }
    }
}

/// `[integrations]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct IntegrationsConfig {
    /// Prometheus metrics on a dedicated listener.
    pub prometheus: PrometheusConfig,
    /// OpenTelemetry traces of tool calls, exported over OTLP.
    pub opentelemetry: OpenTelemetryConfig,
}

/// `[integrations.opentelemetry]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct OpenTelemetryConfig {
    /// Export a trace span for every tool call (children: queue wait, sandbox start, execution,
    /// session resume, upstream calls), continuing the caller's `traceparent` (from the request's
    /// `_meta`, else its HTTP header). Spans carry outcomes, durations and sizes: never code,
    /// output, file names, session ids, tokens or claims.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_ENABLED (deprecated alias: CODE_INTERPRETER_MCP_OTEL_ENABLED) (true/false)
    pub enabled: bool,
    /// The OTLP/HTTP traces endpoint (protobuf), e.g. http://otel-collector:4318/v1/traces
    /// (https, or http on any address: collectors usually sit beside the server).
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_ENDPOINT (deprecated alias: CODE_INTERPRETER_MCP_OTEL_ENDPOINT)
    pub endpoint: String,
    /// HTTP headers sent with every export (e.g. an API key). A value may name environment
    /// variables or a file as in upstream headers ("Bearer ${TOKEN}", "@/run/secrets/token");
    /// `OTEL_EXPORTER_OTLP_*HEADERS` are not read.
    pub headers: BTreeMap<String, String>,
    /// `service.name` of the spans' resource.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_SERVICE_NAME (deprecated alias: CODE_INTERPRETER_MCP_OTEL_SERVICE_NAME)
    pub service_name: String,
    /// Percent of the calls that start a trace (0 to 100) that are recorded; a caller's sampled
    /// flag is followed whatever this says.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_SAMPLE_PERCENT (deprecated alias: CODE_INTERPRETER_MCP_OTEL_SAMPLE_PERCENT)
    pub sample_percent: u64,
    /// Spans waiting for export at most (64 to 65536); more are dropped (and counted), never
    /// waited for.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_MAX_QUEUE_SPANS (deprecated alias: CODE_INTERPRETER_MCP_OTEL_MAX_QUEUE_SPANS)
    pub max_queue_spans: u64,
    /// Spans sent in one export at most (1 to max_queue_spans).
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_MAX_BATCH_SPANS (deprecated alias: CODE_INTERPRETER_MCP_OTEL_MAX_BATCH_SPANS)
    pub max_batch_spans: u64,
    /// Milliseconds between two exports (100 to 60000).
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_EXPORT_INTERVAL_MS (deprecated alias: CODE_INTERPRETER_MCP_OTEL_EXPORT_INTERVAL_MS)
    pub export_interval_ms: u64,
    /// Milliseconds one export may take, retries included (100 to 60000); also the most the
    /// shutdown waits for the last spans.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_EXPORT_TIMEOUT_MS (deprecated alias: CODE_INTERPRETER_MCP_OTEL_EXPORT_TIMEOUT_MS)
    pub export_timeout_ms: u64,
    /// Add the caller's principal label (`p-` and 12 hex digits of a hash, as in the logs) to
    /// each tool-call span.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_PRINCIPAL_ATTRIBUTE (deprecated alias: CODE_INTERPRETER_MCP_OTEL_PRINCIPAL_ATTRIBUTE) (true/false)
    pub principal_attribute: bool,
}

impl Default for OpenTelemetryConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            headers: BTreeMap::new(),
            service_name: "code-interpreter-mcp".into(),
            sample_percent: 100,
            max_queue_spans: 2048,
            max_batch_spans: 512,
            export_interval_ms: 5000,
            export_timeout_ms: 10_000,
            principal_attribute: false,
        }
    }
}

/// `[integrations.prometheus]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct PrometheusConfig {
    /// Serve /metrics.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED (deprecated alias: CODE_INTERPRETER_MCP_PROMETHEUS_ENABLED) (true/false)
    pub enabled: bool,
    /// IP address of the metrics listener.
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_HOST (deprecated alias: CODE_INTERPRETER_MCP_PROMETHEUS_HOST)
    pub host: String,
    /// Port of the metrics listener (1 to 65535, not bind_addr's port).
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT (deprecated alias: CODE_INTERPRETER_MCP_PROMETHEUS_PORT)
    pub port: u64,
    /// Label the tool-call metrics by principal: a named token's name, else "token", "oauth" or
    /// "anonymous" (bounded: names come only from the operator's token file).
    /// Environment: CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PRINCIPAL_LABEL (deprecated alias: CODE_INTERPRETER_MCP_PROMETHEUS_PRINCIPAL_LABEL) (true/false)
    pub principal_label: bool,
}

impl Default for AppConfig {
    fn default() -> Self {
        Self {
            bind_addr: "127.0.0.1:8000".into(),
            allowed_hosts: default_allowed_hosts(),
            asset_dir: String::new(),
            package_cache_dir: ".code-interpreter-mcp-package-cache".into(),
            package_base_url: String::new(),
            preinstall_packages: Vec::new(),
            preimport_modules: Vec::new(),
            preimport_preinstalled: true,
            package_index_urls: Vec::new(),
            extra_ca_certs: Vec::new(),
            runtime_package_installation: true,
            http_allowed_hosts: Vec::new(),
            http_allowed_origins: Vec::new(),
            skip_host_header_verification: false,
            log_format: LogFormat::Text,
            replica_id: String::new(),
            auth: AuthConfig::default(),
            workers: WorkersConfig::default(),
            input_limits: InputLimitsConfig::default(),
            search: SearchConfig::default(),
            code_snippets: CodeSnippetsConfig::default(),
            sessions: SessionsConfig::default(),
            tasks: TasksConfig::default(),
            results: ResultsConfig::default(),
            integrations: IntegrationsConfig::default(),
            quotas: QuotasConfig::default(),
            upstream: BTreeMap::new(),
            network: NetworkConfig::default(),
        }
    }
}

/// The outbound HTTPS hosts allowed by default: the Pyodide CDN and the Python Package Index's API and
/// file hosts.
pub fn default_allowed_hosts() -> Vec<String> {
    ["cdn.jsdelivr.net", "pypi.org", "files.pythonhosted.org"]
        .into_iter()
        .map(String::from)
        .collect()
}

impl WorkersConfig {
    /// The workers that prewarm: `prewarmed_workers`, at most `max_workers`.
    pub fn prewarmed(&self) -> u64 {
        self.prewarmed_workers.min(self.max_workers)
    }
}

impl Default for WorkersConfig {
    fn default() -> Self {
        Self {
            max_workers: 2,
            queue_capacity: 8,
            prewarmed_workers: 2,
            ready_sandboxes: 4,
            ready_preimported_sandboxes: 1,
            memory_limit_mb: 512,
            wasm_memory_limit_mb: 2048,
            boot: BootMode::Snapshot,
            map_snapshot_memory: false,
            idle_give_back_s: 30,
            sandbox_memory_limit_mb: 2560,
            setup_timeout_s: 60,
        }
    }
}

impl Default for InputLimitsConfig {
    fn default() -> Self {
        let d = InputLimits::default();
        Self {
            max_file_kb: d.max_file_kb,
            max_total_file_kb: d.max_total_file_kb,
        }
    }
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self { min_hits: 3 }
    }
}

impl Default for CodeSnippetsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            include_snippet_ids: Vec::new(),
            include_snippet_tags: Vec::new(),
            exclude_snippet_ids: Vec::new(),
            snippets: BTreeMap::new(),
        }
    }
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            host: "127.0.0.1".into(),
            port: 3131,
            principal_label: false,
        }
    }
}
