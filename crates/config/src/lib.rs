//! The configuration of code-interpreter-mcp, in a crate of its own so that reading it (and generating
//! its reference) needs no V8.
//!
//! The one configuration type, [`AppConfig`]: every key with its default (the `Default` impls below),
//! its documentation and its environment override (the `Environment:` line of the key's doc comment,
//! read through `facet` reflection). Loading discovers or takes the TOML files, merges them (tables by
//! key, arrays replaced whole), applies environment variables, deserialises, validates, and remembers
//! where each value came from for `--print-config`. The fixed per-request limits live in [`limits`].
//! Nothing here knows the engine: the application turns this type into the running parts.

pub mod limits;
pub mod request;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use facet::Facet;
use serde::{Deserialize, Serialize};

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
    /// What results carry besides the JSON.
    pub results: ResultsConfig,
    /// Integrations with other systems.
    pub integrations: IntegrationsConfig,
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
}

/// `[sessions]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Offer sessions: run_python_code's session_id, list_session_files, clear_session and the
    /// session:// resources.
    /// Environment: CODE_INTERPRETER_MCP_SESSIONS_ENABLED (true/false)
    pub enabled: bool,
    /// Live sessions at most; creating one more fails at once (1 to 10000).
    /// Environment: CODE_INTERPRETER_MCP_MAX_SESSIONS
    pub max_sessions: u64,
    /// Calls that may wait for one busy session behind its running call (0 to 64); one more is
    /// refused at once with the overload error.
    /// Environment: CODE_INTERPRETER_MCP_SESSION_QUEUE_CAPACITY
    pub queue_capacity: u64,
    /// A session unused for this many seconds ends (at least 1).
    /// Environment: CODE_INTERPRETER_MCP_SESSION_IDLE_TIMEOUT_S
    pub idle_timeout_s: u64,
    /// A session ends this many seconds after it was created, used or not (at least 1).
    /// Environment: CODE_INTERPRETER_MCP_SESSION_MAX_LIFETIME_S
    pub max_lifetime_s: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_sessions: 8,
            queue_capacity: 4,
            idle_timeout_s: 1800,
            max_lifetime_s: 86400,
        }
    }
}

/// `[results]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct ResultsConfig {
    /// Returned images up to this size (KB) are also inlined as MCP image content; larger ones are
    /// only returned as files (0: never inline).
    /// Environment: CODE_INTERPRETER_MCP_MAX_INLINE_IMAGE_KB
    pub max_inline_image_kb: u64,
}

impl Default for ResultsConfig {
    fn default() -> Self {
        Self {
            max_inline_image_kb: 1024,
        }
    }
}

/// `[workers]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    /// Maximum simultaneous executions.
    /// Environment: CODE_INTERPRETER_MCP_MAX_WORKERS
    pub max_workers: u64,
    /// Maximum number of requests waiting for a worker.
    /// Environment: CODE_INTERPRETER_MCP_QUEUE_CAPACITY
    pub queue_capacity: u64,
    /// Workers that initialise Pyodide before the server accepts requests and keep a stock of ready
    /// sandboxes (at most max_workers; the default, 2, is cut to max_workers when that is lower).
    /// Environment: CODE_INTERPRETER_MCP_PREWARMED_WORKERS
    pub prewarmed_workers: u64,
    /// Sandboxes each prewarmed worker keeps booted and ready (1 to 64). A call takes one; the
    /// worker boots replacements while no call waits, so up to this many calls back to back per
    /// prewarmed worker start without waiting for a boot. Each ready sandbox holds about 30 MB
    /// (more with pre-imported modules).
    /// Environment: CODE_INTERPRETER_MCP_READY_SANDBOXES
    pub ready_sandboxes: u64,
    /// V8 heap budget per isolate in MB (1 MB = 1,048,576 bytes).
    /// Environment: CODE_INTERPRETER_MCP_MEMORY_LIMIT_MB
    pub memory_limit_mb: u64,
    /// Cap on one WebAssembly linear memory (Python's heap) in MB, 16 to 4096.
    /// Environment: CODE_INTERPRETER_MCP_WASM_MEMORY_LIMIT_MB
    pub wasm_memory_limit_mb: u64,
    /// How sandboxes start: "snapshot" restores a Pyodide memory snapshot taken once at start-up
    /// (fast), "full" boots Pyodide from scratch every time (slow; the fallback).
    /// Environment: CODE_INTERPRETER_MCP_BOOT
    pub boot: BootMode,
    /// Memory budget per sandbox outside the V8 heap, in MB: ArrayBuffers and typed arrays, in-memory
    /// file data, network responses and Python's WebAssembly memory, together. Exceeding it ends the
    /// call with MemoryLimitExceeded (a file write past it fails with ENOSPC first). A sandbox uses at
    /// most this plus memory_limit_mb (64 to 1048576).
    /// Environment: CODE_INTERPRETER_MCP_SANDBOX_MEMORY_LIMIT_MB
    pub sandbox_memory_limit_mb: u64,
    /// Time allowed per call for its set-up, in seconds: writing the input files and loading the
    /// packages its imports need, before timeout_ms starts (1 to 3600).
    /// Environment: CODE_INTERPRETER_MCP_SETUP_TIMEOUT_S
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
    /// Environment: CODE_INTERPRETER_MCP_MAX_FILE_KB
    pub max_file_kb: u64,
    /// Decoded KB allowed across the input files of one request (1 to 1048576).
    /// Environment: CODE_INTERPRETER_MCP_MAX_TOTAL_FILE_KB
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

/// `[integrations]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct IntegrationsConfig {
    /// Prometheus metrics on a dedicated listener.
    pub prometheus: PrometheusConfig,
}

/// `[integrations.prometheus]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Facet)]
#[serde(deny_unknown_fields, default)]
pub struct PrometheusConfig {
    /// Serve /metrics.
    /// Environment: CODE_INTERPRETER_MCP_PROMETHEUS_ENABLED (true/false)
    pub enabled: bool,
    /// IP address of the metrics listener.
    /// Environment: CODE_INTERPRETER_MCP_PROMETHEUS_HOST
    pub host: String,
    /// Port of the metrics listener (1 to 65535, not bind_addr's port).
    /// Environment: CODE_INTERPRETER_MCP_PROMETHEUS_PORT
    pub port: u64,
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
            results: ResultsConfig::default(),
            integrations: IntegrationsConfig::default(),
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
            memory_limit_mb: 512,
            wasm_memory_limit_mb: 2048,
            boot: BootMode::Snapshot,
            sandbox_memory_limit_mb: 2560,
            setup_timeout_s: 60,
        }
    }
}

impl Default for InputLimitsConfig {
    fn default() -> Self {
        Self {
            max_file_kb: 10240,
            max_total_file_kb: 51200,
        }
    }
}

impl InputLimitsConfig {
    /// The HTTP body ceiling derived from the aggregate allowance T:
    /// 4 * ceil(T / 3) + 4 * (64 - 1) + 8 MiB.
    pub fn http_body_limit(&self) -> u64 {
        let t = self.max_total_file_kb * 1024;
        4 * t.div_ceil(3) + 4 * (limits::MAX_INPUT_FILES as u64 - 1) + 8 * 1024 * 1024
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
        }
    }
}

// -------------------------------------------------------------------------------------------------
// Keys, documentation and environment overrides, read from the type
// -------------------------------------------------------------------------------------------------

/// One configuration key as described by the type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyInfo {
    /// Dotted key path, e.g. `workers.max_workers`.
    pub key: String,
    /// Value type: `string`, `boolean`, `integer`, `array of strings`, `table`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The default, as JSON.
    pub default: serde_json::Value,
    /// What the key does.
    pub doc: String,
    /// Environment variable overriding the key, if any.
    pub env: Option<String>,
    /// Whether a list in the environment variable is whitespace-separated (else comma-separated).
    #[serde(skip)]
    pub env_whitespace: bool,
}

/// Every leaf key of [`AppConfig`] (tables of user-named entries, like snippets, are one key).
pub fn keys() -> Vec<KeyInfo> {
    let defaults = serde_json::to_value(AppConfig::default()).expect("defaults serialise");
    let mut out = Vec::new();
    collect_keys(AppConfig::SHAPE, "", &defaults, &mut out);
    out
}

fn collect_keys(
    shape: &'static facet::Shape,
    prefix: &str,
    defaults: &serde_json::Value,
    out: &mut Vec<KeyInfo>,
) {
    let facet::Type::User(facet::UserType::Struct(st)) = shape.ty else {
        return;
    };
    for field in st.fields {
        let key = if prefix.is_empty() {
            field.name.to_string()
        } else {
            format!("{prefix}.{}", field.name)
        };
        let field_shape = field.shape.get();
        let default = defaults
            .get(field.name)
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        let is_section = matches!(
            field_shape.ty,
            facet::Type::User(facet::UserType::Struct(_))
        ) && !matches!(field_shape.def, facet::Def::Scalar);
        if is_section && default.is_object() {
            collect_keys(field_shape, &key, &default, out);
            continue;
        }
        let mut doc_lines = Vec::new();
        let mut env = None;
        let mut env_whitespace = false;
        for line in field.doc {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("Environment:") {
                env = rest.split_whitespace().next().map(String::from);
                env_whitespace = rest.contains("(whitespace-separated");
            } else if !line.is_empty() {
                doc_lines.push(line);
            }
        }
        out.push(KeyInfo {
            kind: kind_of(&default),
            key,
            default,
            doc: doc_lines.join(" "),
            env,
            env_whitespace,
        });
    }
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "integer",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array of strings",
        serde_json::Value::Object(_) => "table",
        serde_json::Value::Null => "null",
    }
}

/// The configuration key reference as pretty JSON (what `gen-config-reference` writes).
pub fn reference_json() -> String {
    let mut text = serde_json::to_string_pretty(&serde_json::json!({
        "generated_by": "cargo run --bin gen-config-reference",
        "files": format!("{CONFIG_FILE} and *{AUTO_SUFFIX} in the working directory, or --config FILE ..."),
        "keys": keys(),
        "fixed_limits": limits::all(),
    }))
    .expect("reference serialises");
    text.push('\n');
    text
}

// -------------------------------------------------------------------------------------------------
// Loading
// -------------------------------------------------------------------------------------------------

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    Env(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "environment variable {v}"),
        }
    }
}

/// A configuration that cannot be used; the message names the key, where it came from and what is
/// allowed. The process exits with status 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// The loaded configuration and the source of every value.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: AppConfig,
    pub sources: BTreeMap<String, Source>,
    pub files: Vec<PathBuf>,
    /// TOKIO_WORKER_THREADS, when set.
    pub tokio_worker_threads: Option<usize>,
}

/// Loads the configuration: `explicit` files (each must exist) or discovery in `dir`, then `env`.
pub fn load(
    explicit: &[PathBuf],
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    let files = if explicit.is_empty() {
        discover(dir)?
    } else {
        for f in explicit {
            if !f.is_file() {
                return Err(ConfigError(format!(
                    "configuration file {} given with --config does not exist",
                    f.display()
                )));
            }
        }
        explicit.to_vec()
    };
    let mut texts = Vec::with_capacity(files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            ConfigError(format!(
                "cannot read configuration file {}: {e}",
                file.display()
            ))
        })?;
        texts.push((file, text));
    }
    parse(&texts, env)
}

/// The configuration of these files' texts (in order, later ones winning) and `env`: merged,
/// overridden, deserialised and validated as [`load`] does.
pub fn parse(
    files: &[(PathBuf, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    let mut merged = toml::Table::new();
    let mut sources = BTreeMap::new();
    for (file, text) in files {
        let table: toml::Table = text.parse().map_err(|e| {
            ConfigError(format!(
                "configuration file {} is not valid TOML: {e}",
                file.display()
            ))
        })?;
        merge(
            &mut merged,
            table,
            "",
            &Source::File(file.clone()),
            &mut sources,
        );
    }

    for info in keys() {
        let Some(var) = &info.env else { continue };
        let Some(raw) = env(var) else { continue };
        let value = env_value(&info, var, &raw)?;
        set_path(&mut merged, &info.key, value);
        sources.insert(info.key.clone(), Source::Env(var.clone()));
    }

    let config: AppConfig =
        serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
            let path = e.path().to_string();
            let source = source_of(&sources, &path);
            ConfigError(format!("key {path} ({source}): {}", e.inner()))
        })?;

    let tokio_worker_threads = match env("TOKIO_WORKER_THREADS") {
        None => None,
        Some(raw) => Some(
            raw.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    ConfigError(format!(
                        "environment variable TOKIO_WORKER_THREADS = {raw:?}: must be a positive integer"
                    ))
                })?,
        ),
    };

    validate(&config, &sources)?;
    Ok(Loaded {
        config,
        sources,
        files: files.iter().map(|(file, _)| file.clone()).collect(),
        tokio_worker_threads,
    })
}

/// `code-interpreter-mcp.toml` and `*.auto.code-interpreter-mcp.toml` in `dir`, in file-name order.
pub fn discover(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        ConfigError(format!(
            "cannot list the working directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| !t.is_dir()).unwrap_or(false))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n == CONFIG_FILE || (n.ends_with(AUTO_SUFFIX) && n.len() > AUTO_SUFFIX.len()))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Merges `from` into `into`: tables by key, everything else (arrays included) replaced whole.
fn merge(
    into: &mut toml::Table,
    from: toml::Table,
    prefix: &str,
    source: &Source,
    sources: &mut BTreeMap<String, Source>,
) {
    for (key, value) in from {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(incoming)) => {
                merge(existing, incoming, &path, source, sources);
            }
            (_, toml::Value::Table(incoming)) => {
                let mut fresh = toml::Table::new();
                merge(&mut fresh, incoming, &path, source, sources);
                into.insert(key, toml::Value::Table(fresh));
            }
            (_, value) => {
                sources.retain(|k, _| !(k == &path || k.starts_with(&format!("{path}."))));
                sources.insert(path, source.clone());
                into.insert(key, value);
            }
        }
    }
}

fn set_path(table: &mut toml::Table, path: &str, value: toml::Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().expect("non-empty path");
    let mut cur = table;
    for part in parts {
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        cur = entry.as_table_mut().expect("just made a table");
    }
    cur.insert(last.to_string(), value);
}

fn env_value(info: &KeyInfo, var: &str, raw: &str) -> Result<toml::Value, ConfigError> {
    let bad = |allowed: &str| {
        ConfigError(format!(
            "environment variable {var} = {raw:?} (for key {}): {allowed}",
            info.key
        ))
    };
    Ok(match info.kind {
        "boolean" => match raw.trim() {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            _ => return Err(bad("must be true or false")),
        },
        "integer" => {
            toml::Value::Integer(raw.trim().parse().map_err(|_| bad("must be an integer"))?)
        }
        "array of strings" if info.env_whitespace => toml::Value::Array(
            raw.split_whitespace()
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        ),
        "array of strings" => toml::Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        ),
        _ => toml::Value::String(raw.to_string()),
    })
}

/// The source of `path`: its own, else that of a key below it (for a table), else that of the nearest
/// key above it; a key no file or variable set is a default.
fn source_of(sources: &BTreeMap<String, Source>, path: &str) -> Source {
    if let Some(s) = sources.get(path) {
        return s.clone();
    }
    let below = format!("{path}.");
    if let Some((_, s)) = sources.iter().find(|(k, _)| k.starts_with(&below)) {
        return s.clone();
    }
    let mut p = path;
    while let Some(i) = p.rfind('.') {
        p = &p[..i];
        if let Some(s) = sources.get(p) {
            return s.clone();
        }
    }
    Source::Default
}

/// Every rule of the specification, checked before anything binds or starts.
pub fn validate(c: &AppConfig, sources: &BTreeMap<String, Source>) -> Result<(), ConfigError> {
    let fail = |key: &str, allowed: String| -> Result<(), ConfigError> {
        Err(ConfigError(format!(
            "key {key} ({}): {allowed}",
            source_of(sources, key)
        )))
    };
    let in_range = |key: &str, value: u64, range: std::ops::RangeInclusive<u64>, unit: &str| {
        if range.contains(&value) {
            Ok(())
        } else {
            fail(
                key,
                format!(
                    "{value} is outside {}..={}{unit}",
                    range.start(),
                    range.end()
                ),
            )
        }
    };
    let bind: SocketAddr = match c.bind_addr.parse() {
        Ok(a) => a,
        Err(_) => {
            return fail(
                "bind_addr",
                format!(
                    "{:?} is not a socket address such as 127.0.0.1:8000",
                    c.bind_addr
                ),
            );
        }
    };
    const MAX_KB: u64 = 1_048_576;
    let il = &c.input_limits;
    in_range(
        "input_limits.max_file_kb",
        il.max_file_kb,
        1..=MAX_KB,
        " KB",
    )?;
    in_range(
        "input_limits.max_total_file_kb",
        il.max_total_file_kb,
        1..=MAX_KB,
        " KB",
    )?;
    if il.max_file_kb > il.max_total_file_kb {
        return fail(
            "input_limits.max_file_kb",
            format!(
                "{} must not exceed input_limits.max_total_file_kb ({})",
                il.max_file_kb, il.max_total_file_kb
            ),
        );
    }
    let w = &c.workers;
    if w.memory_limit_mb == 0
        || w.memory_limit_mb
            .checked_mul(1_048_576)
            .is_none_or(|b| usize::try_from(b).is_err())
    {
        return fail(
            "workers.memory_limit_mb",
            format!(
                "{} must be a positive number of MB whose size in bytes fits this platform's address size",
                w.memory_limit_mb
            ),
        );
    }
    in_range(
        "workers.wasm_memory_limit_mb",
        w.wasm_memory_limit_mb,
        16..=4096,
        " MB",
    )?;
    in_range(
        "workers.sandbox_memory_limit_mb",
        w.sandbox_memory_limit_mb,
        64..=1_048_576,
        " MB",
    )?;
    in_range("workers.setup_timeout_s", w.setup_timeout_s, 1..=3600, " s")?;
    in_range("workers.max_workers", w.max_workers, 1..=1024, "")?;
    in_range("workers.ready_sandboxes", w.ready_sandboxes, 1..=64, "")?;
    let replica = &c.replica_id;
    if replica.len() > 63
        || !replica
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        fail(
            "replica_id",
            format!(
                "\"{}\" must be at most 63 lower-case letters, digits and '-' (empty: no prefix)",
                limits::shown(replica)
            ),
        )?;
    }
    if c.auth.bearer_tokens_file.trim() != c.auth.bearer_tokens_file {
        fail(
            "auth.bearer_tokens_file",
            "must not start or end with whitespace".into(),
        )?;
    }
    let sessions = &c.sessions;
    in_range(
        "sessions.max_sessions",
        sessions.max_sessions,
        1..=10_000,
        "",
    )?;
    in_range(
        "sessions.queue_capacity",
        sessions.queue_capacity,
        0..=64,
        "",
    )?;
    in_range(
        "sessions.idle_timeout_s",
        sessions.idle_timeout_s,
        1..=u64::MAX / 2,
        " s",
    )?;
    in_range(
        "sessions.max_lifetime_s",
        sessions.max_lifetime_s,
        1..=u64::MAX / 2,
        " s",
    )?;
    in_range(
        "results.max_inline_image_kb",
        c.results.max_inline_image_kb,
        0..=1_048_576,
        " KB",
    )?;
    in_range(
        "workers.queue_capacity",
        w.queue_capacity,
        0..=1_000_000,
        "",
    )?;
    // The default is cut to max_workers (see `WorkersConfig::prewarmed`); a set value must fit.
    if w.prewarmed_workers > w.max_workers
        && source_of(sources, "workers.prewarmed_workers") != Source::Default
    {
        return fail(
            "workers.prewarmed_workers",
            format!(
                "{} must not exceed workers.max_workers ({})",
                w.prewarmed_workers, w.max_workers
            ),
        );
    }
    for host in &c.allowed_hosts {
        if host.trim().is_empty() || host.contains('/') || host.contains(':') {
            return fail(
                "allowed_hosts",
                format!("{host:?} must be a bare host name such as pypi.org"),
            );
        }
    }
    for requirement in &c.preinstall_packages {
        if requirement.trim().is_empty() {
            return fail(
                "preinstall_packages",
                "entries must be micropip requirements such as \"pandas\" or \"snowballstemmer==3.0.1\", not empty strings".to_string(),
            );
        }
    }
    for module in &c.preimport_modules {
        let valid = !module.is_empty()
            && module.split('.').all(|part| {
                part.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
                    && part.chars().all(|c| c.is_alphanumeric() || c == '_')
            });
        if !valid {
            return fail(
                "preimport_modules",
                format!(
                    "{module:?} must be a Python module name such as \"pandas\" or \"matplotlib.pyplot\""
                ),
            );
        }
    }
    if !c.preimport_modules.is_empty() && c.workers.boot == BootMode::Full {
        return fail(
            "preimport_modules",
            "needs workers.boot = \"snapshot\" (modules are pre-imported into the memory snapshot)"
                .to_string(),
        );
    }
    for url in &c.package_index_urls {
        if !url.starts_with("https://") {
            return fail(
                "package_index_urls",
                format!("{url:?} must be an https:// URL (sandboxes fetch over HTTPS only)"),
            );
        }
    }
    for path in &c.extra_ca_certs {
        if path.trim().is_empty() {
            return fail(
                "extra_ca_certs",
                "entries must be paths of PEM files, not empty strings".to_string(),
            );
        }
    }
    for host in &c.http_allowed_hosts {
        if host.trim().is_empty() || host.contains('/') {
            return fail(
                "http_allowed_hosts",
                format!("{host:?} must be a host name or host:port such as mcp.example.com:8443"),
            );
        }
    }
    for origin in &c.http_allowed_origins {
        if !(origin == "null" || origin.starts_with("http://") || origin.starts_with("https://")) {
            return fail(
                "http_allowed_origins",
                format!("{origin:?} must be an origin such as https://app.example.com or null"),
            );
        }
    }
    let p = &c.integrations.prometheus;
    if p.enabled {
        if p.host.parse::<IpAddr>().is_err() {
            return fail(
                "integrations.prometheus.host",
                format!(
                    "{:?} must be an IPv4 or IPv6 address such as 127.0.0.1 or ::1",
                    p.host
                ),
            );
        }
        in_range("integrations.prometheus.port", p.port, 1..=65535, "")?;
        if p.port == u64::from(bind.port()) {
            return fail(
                "integrations.prometheus.port",
                format!(
                    "{} must differ from bind_addr's port ({}, {})",
                    p.port,
                    bind.port(),
                    source_of(sources, "bind_addr")
                ),
            );
        }
    }
    Ok(())
}

/// The effective configuration as TOML, each value annotated with where it came from.
pub fn print_config(loaded: &Loaded) -> String {
    let value = toml::Value::try_from(&loaded.config).expect("configuration serialises");
    let mut out = String::new();
    if loaded.files.is_empty() {
        out.push_str("# no configuration files\n");
    } else {
        for f in &loaded.files {
            let _ = writeln!(out, "# loaded {}", f.display());
        }
    }
    if let toml::Value::Table(table) = value {
        write_table(&mut out, &table, "", &loaded.sources);
    }
    out
}

fn write_table(
    out: &mut String,
    table: &toml::Table,
    prefix: &str,
    sources: &BTreeMap<String, Source>,
) {
    for (key, value) in table {
        if value.is_table() {
            continue;
        }
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let rendered = toml::Value::to_string(value);
        let _ = writeln!(out, "{key} = {rendered}  # {}", source_of(sources, &path));
    }
    for (key, value) in table {
        if let toml::Value::Table(inner) = value {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let _ = writeln!(out, "\n[{path}]");
            write_table(out, inner, &path, sources);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_environment_variable_is_found() {
        let env: Vec<_> = keys()
            .into_iter()
            .filter_map(|k| k.env.map(|e| (k.key, e)))
            .collect();
        assert!(env.contains(&(
            "workers.max_workers".into(),
            "CODE_INTERPRETER_MCP_MAX_WORKERS".into()
        )));
        assert!(env.contains(&(
            "integrations.prometheus.port".into(),
            "CODE_INTERPRETER_MCP_PROMETHEUS_PORT".into()
        )));
        assert!(env.contains(&(
            "input_limits.max_file_kb".into(),
            "CODE_INTERPRETER_MCP_MAX_FILE_KB".into()
        )));
    }

    #[test]
    fn defaults_are_valid() {
        validate(&AppConfig::default(), &BTreeMap::new()).unwrap();
    }
}
