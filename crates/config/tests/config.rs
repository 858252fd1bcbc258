//! Configuration: discovery and merge order, array replacement versus table merge, explicit --config
//! lists, environment overrides, every validation rule and the generated reference (without V8: the
//! configuration crate alone). The server binary's handling of it is tested in tests/it/config.rs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use code_interpreter_mcp_config::{
    self as config, AppConfig, BootMode, ConfigError, Loaded, LogFormat, Source,
};

/// A fresh temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cim-config-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn load_with(
    dir: &Path,
    explicit: &[PathBuf],
    env: &[(&str, &str)],
) -> Result<Loaded, ConfigError> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config::load(explicit, dir, &|k| env.get(k).cloned())
}

fn load(dir: &Path) -> Loaded {
    load_with(dir, &[], &[]).expect("valid configuration")
}

fn error(dir: &Path, env: &[(&str, &str)]) -> String {
    load_with(dir, &[], env)
        .expect_err("invalid configuration")
        .0
}

#[test]
fn no_files_gives_the_defaults() {
    let dir = temp_dir("defaults");
    let loaded = load(&dir);
    assert_eq!(loaded.config, AppConfig::default());
    assert!(loaded.files.is_empty());
    assert_eq!(loaded.config.bind_addr, "127.0.0.1:8000");
    assert_eq!(loaded.config.workers.max_workers, 2);
    assert_eq!(loaded.config.workers.queue_capacity, 8);
    assert_eq!(loaded.config.workers.prewarmed_workers, 2);
    assert_eq!(loaded.config.workers.ready_sandboxes, 4);
    assert_eq!(loaded.config.workers.ready_preimported_sandboxes, 1);
    assert_eq!(loaded.config.workers.memory_limit_mb, 512);
    assert_eq!(loaded.config.input_limits.max_file_kb, 10240);
    assert_eq!(loaded.config.input_limits.max_total_file_kb, 51200);
    assert_eq!(loaded.config.search.min_hits, 3);
    assert!(loaded.config.code_snippets.enabled);
    assert_eq!(loaded.config.integrations.prometheus.port, 3131);
}

#[test]
fn auto_files_merge_in_file_name_order() {
    let dir = temp_dir("order");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        "bind_addr = \"127.0.0.1:9000\"\n[workers]\nmax_workers = 4\n",
    );
    write(
        &dir,
        "b.auto.code-interpreter-mcp.toml",
        "[workers]\nmax_workers = 6\n",
    );
    write(
        &dir,
        "a.auto.code-interpreter-mcp.toml",
        "[workers]\nmax_workers = 5\nqueue_capacity = 3\n",
    );
    write(&dir, "unrelated.toml", "this is not loaded = [");
    let loaded = load(&dir);
    let names: Vec<_> = loaded
        .files
        .iter()
        .map(|f| f.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "a.auto.code-interpreter-mcp.toml",
            "b.auto.code-interpreter-mcp.toml",
            "code-interpreter-mcp.toml"
        ]
    );
    // code-interpreter-mcp.toml sorts last and wins for max_workers; queue_capacity survives from a.
    assert_eq!(loaded.config.workers.max_workers, 4);
    assert_eq!(loaded.config.workers.queue_capacity, 3);
    assert_eq!(loaded.config.bind_addr, "127.0.0.1:9000");
    assert_eq!(
        loaded.sources["workers.queue_capacity"],
        Source::File(dir.join("a.auto.code-interpreter-mcp.toml"))
    );
}

#[test]
fn arrays_are_replaced_and_tables_merged() {
    let dir = temp_dir("arrays");
    write(
        &dir,
        "a.auto.code-interpreter-mcp.toml",
        "allowed_hosts = [\"one.example\", \"two.example\"]\n[input_limits]\nmax_file_kb = 100\n",
    );
    write(
        &dir,
        "b.auto.code-interpreter-mcp.toml",
        "allowed_hosts = [\"three.example\"]\n[input_limits]\nmax_total_file_kb = 200\n",
    );
    let loaded = load(&dir);
    assert_eq!(loaded.config.allowed_hosts, ["three.example"]);
    assert_eq!(loaded.config.input_limits.max_file_kb, 100);
    assert_eq!(loaded.config.input_limits.max_total_file_kb, 200);
}

#[test]
fn explicit_config_files_replace_discovery_and_must_exist() {
    let dir = temp_dir("explicit");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        "[workers]\nmax_workers = 9\n",
    );
    let one = write(
        &dir,
        "one.toml",
        "[workers]\nmax_workers = 3\nqueue_capacity = 1\n",
    );
    let two = write(&dir, "two.toml", "[workers]\nmax_workers = 4\n");
    let loaded = load_with(&dir, &[one.clone(), two.clone()], &[]).unwrap();
    assert_eq!(loaded.files, [one.clone(), two]);
    assert_eq!(
        loaded.config.workers.max_workers, 4,
        "later --config wins; discovery is off"
    );
    assert_eq!(loaded.config.workers.queue_capacity, 1);

    let missing = dir.join("missing.toml");
    let err = load_with(&dir, &[one, missing.clone()], &[]).unwrap_err().0;
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn every_environment_override_applies_after_files() {
    let dir = temp_dir("env");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        "bind_addr = \"127.0.0.1:9000\"\n[workers]\nmax_workers = 4\n",
    );
    let env = [
        ("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0"),
        (
            "CODE_INTERPRETER_MCP_ALLOWED_HOSTS",
            "a.example, ,b.example",
        ),
        ("CODE_INTERPRETER_MCP_ASSET_DIR", "/opt/pyodide"),
        ("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR", "/var/cache/cim"),
        ("CODE_INTERPRETER_MCP_PACKAGE_BASE_URL", "/srv/wheels"),
        (
            "CODE_INTERPRETER_MCP_PACKAGE_INDEX_URLS",
            "https://pypi.internal/simple,https://mirror.internal/pypi/{package_name}/json",
        ),
        (
            "CODE_INTERPRETER_MCP_EXTRA_CA_CERTS",
            "/etc/ssl/private-ca.pem",
        ),
        ("CODE_INTERPRETER_MCP_RUNTIME_PACKAGE_INSTALLATION", "false"),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "3"),
        ("CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY", "5"),
        ("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "2"),
        ("CODE_INTERPRETER_MCP_WORKERS_READY_SANDBOXES", "3"),
        (
            "CODE_INTERPRETER_MCP_WORKERS_READY_PREIMPORTED_SANDBOXES",
            "3",
        ),
        ("CODE_INTERPRETER_MCP_PREIMPORT_PREINSTALLED", "false"),
        ("CODE_INTERPRETER_MCP_WORKERS_MEMORY_LIMIT_MB", "256"),
        ("CODE_INTERPRETER_MCP_WORKERS_WASM_MEMORY_LIMIT_MB", "1024"),
        // (snapshot, not the default's spelling of it: preimport_modules below needs it)
        ("CODE_INTERPRETER_MCP_WORKERS_BOOT", "snapshot"),
        ("CODE_INTERPRETER_MCP_WORKERS_MAP_SNAPSHOT_MEMORY", "true"),
        ("CODE_INTERPRETER_MCP_WORKERS_IDLE_GIVE_BACK_S", "45"),
        (
            "CODE_INTERPRETER_MCP_WORKERS_SANDBOX_MEMORY_LIMIT_MB",
            "1500",
        ),
        ("CODE_INTERPRETER_MCP_WORKERS_SETUP_TIMEOUT_S", "20"),
        ("CODE_INTERPRETER_MCP_SESSIONS_ENABLED", "false"),
        ("CODE_INTERPRETER_MCP_SESSIONS_MAX_SESSIONS", "3"),
        ("CODE_INTERPRETER_MCP_SESSIONS_MAX_RESIDENT", "2"),
        ("CODE_INTERPRETER_MCP_SESSIONS_SPILL_AFTER_S", "0"),
        (
            "CODE_INTERPRETER_MCP_SESSIONS_STORE_URL",
            "s3://bucket/prefix",
        ),
        ("CODE_INTERPRETER_MCP_SESSIONS_QUEUE_CAPACITY", "0"),
        ("CODE_INTERPRETER_MCP_SESSIONS_IDLE_TIMEOUT_S", "60"),
        ("CODE_INTERPRETER_MCP_SESSIONS_MAX_LIFETIME_S", "600"),
        ("CODE_INTERPRETER_MCP_TASKS_ENABLED", "false"),
        ("CODE_INTERPRETER_MCP_TASKS_MAX_RUNNING", "2"),
        ("CODE_INTERPRETER_MCP_TASKS_QUEUE_CAPACITY", "7"),
        ("CODE_INTERPRETER_MCP_TASKS_TTL_S", "90"),
        ("CODE_INTERPRETER_MCP_TASKS_MAX_TIMEOUT_MS", "600000"),
        ("CODE_INTERPRETER_MCP_TASKS_IMMEDIATE_RESULT_MS", "250"),
        ("CODE_INTERPRETER_MCP_RESULTS_MAX_INLINE_IMAGE_KB", "0"),
        ("CODE_INTERPRETER_MCP_RESULTS_MAX_TEXT_CHARS", "5000"),
        ("CODE_INTERPRETER_MCP_RESULTS_MAX_TABLE_ROWS", "10"),
        ("CODE_INTERPRETER_MCP_RESULTS_MAX_TABLE_COLUMNS", "8"),
        ("CODE_INTERPRETER_MCP_RESULTS_STRUCTURED_CONTENT", "false"),
        ("CODE_INTERPRETER_MCP_RESULTS_APPS", "false"),
        ("CODE_INTERPRETER_MCP_RESULTS_APPS_ASSET_DIR", "/srv/ui"),
        ("CODE_INTERPRETER_MCP_RESULTS_MAX_TABLE_ROWS_APP", "500"),
        ("CODE_INTERPRETER_MCP_RESULTS_FIGURE_PLOTLY_JS", "inline"),
        (
            "CODE_INTERPRETER_MCP_HTTP_ALLOWED_HOSTS",
            " mcp.example.com ,, proxy.example.com:8443 ",
        ),
        (
            "CODE_INTERPRETER_MCP_HTTP_ALLOWED_ORIGINS",
            "https://app.example.com",
        ),
        ("CODE_INTERPRETER_MCP_SKIP_HOST_HEADER_VERIFICATION", "true"),
        ("CODE_INTERPRETER_MCP_LOG_FORMAT", "json"),
        (
            "CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES",
            " numpy>=2,<3  snowballstemmer==3.0.1\n",
        ),
        (
            "CODE_INTERPRETER_MCP_PREIMPORT_MODULES",
            "pandas, matplotlib.pyplot,",
        ),
        ("CODE_INTERPRETER_MCP_REPLICA_ID", "pod-7"),
        (
            "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
            "/run/secrets/tokens",
        ),
        ("CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_FILE_KB", "2048"),
        (
            "CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_TOTAL_FILE_KB",
            "4096",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_HOST", "::1"),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", "9100"),
        ("TOKIO_WORKER_THREADS", "2"),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_ISSUER",
            "https://idp.example.com/realms/mcp",
        ),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_RESOURCE",
            "https://mcp.example.com/mcp",
        ),
        ("CODE_INTERPRETER_MCP_AUTH_OAUTH_ALGORITHMS", "ES256, EdDSA"),
        ("CODE_INTERPRETER_MCP_AUTH_OAUTH_CLOCK_SKEW_S", "5"),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_URI",
            "https://idp.example.com/keys",
        ),
        ("CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_REFRESH_S", "600"),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_MIN_REFRESH_INTERVAL_S",
            "20",
        ),
        ("CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_TIMEOUT_MS", "1500"),
        ("CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_MAX_KB", "64"),
        ("CODE_INTERPRETER_MCP_AUTH_OAUTH_SCOPE_RUN", "mcp.run"),
        ("CODE_INTERPRETER_MCP_QUOTAS_MAX_CONCURRENT_CALLS", "4"),
        ("CODE_INTERPRETER_MCP_QUOTAS_CPU_SECONDS_PER_MINUTE", "120"),
        ("CODE_INTERPRETER_MCP_QUOTAS_MAX_TASKS", "0"),
        ("CODE_INTERPRETER_MCP_QUOTAS_MAX_QUEUED_CALLS", "6"),
        ("CODE_INTERPRETER_MCP_QUOTAS_MAX_SESSIONS", "3"),
        ("CODE_INTERPRETER_MCP_QUOTAS_WEIGHT", "4"),
        ("CODE_INTERPRETER_MCP_AUTH_NAMED_TOKENS", "true"),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PRINCIPAL_LABEL",
            "true",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_ENABLED",
            "true",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_ENDPOINT",
            "http://otel-collector:4318/v1/traces",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_SERVICE_NAME",
            "mcp-eu",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_SAMPLE_PERCENT",
            "25",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_MAX_QUEUE_SPANS",
            "4096",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_MAX_BATCH_SPANS",
            "256",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_EXPORT_INTERVAL_MS",
            "1000",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_EXPORT_TIMEOUT_MS",
            "2000",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_OPENTELEMETRY_PRINCIPAL_ATTRIBUTE",
            "true",
        ),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_ID",
            "mcp-rs",
        ),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_SECRET",
            "s3cret-value",
        ),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_ENDPOINT",
            "https://idp.example.com/introspect",
        ),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CACHE_S",
            "30",
        ),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CACHE_ENTRIES",
            "500",
        ),
        ("CODE_INTERPRETER_MCP_AUTH_OAUTH_SCOPE_SESSIONS_READ", ""),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_SCOPE_SESSIONS_WRITE",
            "api://mcp/sessions.write",
        ),
    ];
    let loaded = load_with(&dir, &[], &env).unwrap();
    let c = &loaded.config;
    assert_eq!(c.bind_addr, "127.0.0.1:0");
    assert_eq!(c.allowed_hosts, ["a.example", "b.example"]);
    assert_eq!(c.asset_dir, "/opt/pyodide");
    assert_eq!(c.package_cache_dir, "/var/cache/cim");
    assert_eq!(c.package_base_url, "/srv/wheels");
    assert_eq!(
        c.package_index_urls,
        [
            "https://pypi.internal/simple",
            "https://mirror.internal/pypi/{package_name}/json"
        ]
    );
    assert_eq!(c.extra_ca_certs, ["/etc/ssl/private-ca.pem"]);
    assert!(!c.runtime_package_installation);
    assert_eq!(c.workers.max_workers, 3);
    assert_eq!(c.workers.queue_capacity, 5);
    assert_eq!(c.workers.prewarmed_workers, 2);
    assert_eq!(c.workers.ready_sandboxes, 3);
    assert_eq!(c.workers.ready_preimported_sandboxes, 3);
    assert!(!c.preimport_preinstalled);
    assert_eq!(c.workers.memory_limit_mb, 256);
    assert_eq!(c.workers.wasm_memory_limit_mb, 1024);
    assert_eq!(c.workers.boot, BootMode::Snapshot);
    assert!(c.workers.map_snapshot_memory);
    assert_eq!(c.workers.idle_give_back_s, 45);
    assert_eq!(
        loaded.sources["workers.boot"],
        Source::Env("CODE_INTERPRETER_MCP_WORKERS_BOOT".into())
    );
    assert_eq!(
        c.http_allowed_hosts,
        ["mcp.example.com", "proxy.example.com:8443"]
    );
    assert_eq!(c.http_allowed_origins, ["https://app.example.com"]);
    assert!(c.skip_host_header_verification);
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(
        c.preinstall_packages,
        ["numpy>=2,<3", "snowballstemmer==3.0.1"],
        "whitespace-separated: requirements keep their commas"
    );
    assert_eq!(c.preimport_modules, ["pandas", "matplotlib.pyplot"]);
    assert_eq!(c.replica_id, "pod-7");
    assert_eq!(c.auth.bearer_tokens_file, "/run/secrets/tokens");
    let oauth = loaded.settings.http.oauth.as_ref().unwrap();
    assert_eq!(oauth.issuer, "https://idp.example.com/realms/mcp");
    assert_eq!(
        oauth.resource.as_deref(),
        Some("https://mcp.example.com/mcp")
    );
    assert_eq!(oauth.algorithms, ["ES256", "EdDSA"]);
    assert_eq!(oauth.clock_skew, Duration::from_secs(5));
    assert_eq!(
        oauth.jwks_uri.as_deref(),
        Some("https://idp.example.com/keys")
    );
    assert_eq!(oauth.jwks_refresh, Duration::from_secs(600));
    assert_eq!(oauth.jwks_min_refresh_interval, Duration::from_secs(20));
    assert_eq!(oauth.jwks_timeout, Duration::from_millis(1500));
    assert_eq!(oauth.jwks_max_bytes, 64 * 1024);
    assert_eq!(
        (
            oauth.scopes.run.as_str(),
            oauth.scopes.sessions_read.as_str(),
            oauth.scopes.sessions_write.as_str()
        ),
        ("mcp.run", "", "api://mcp/sessions.write")
    );
    let traces = loaded.settings.traces.as_ref().unwrap();
    assert_eq!(traces.endpoint, "http://otel-collector:4318/v1/traces");
    assert_eq!(traces.service_name, "mcp-eu");
    assert_eq!(traces.sample_ratio, 0.25);
    assert_eq!(
        (traces.max_queue_spans, traces.max_batch_spans),
        (4096, 256)
    );
    assert_eq!(traces.export_interval, Duration::from_millis(1000));
    assert_eq!(traces.export_timeout, Duration::from_millis(2000));
    assert!(traces.principal_attribute && traces.headers.is_empty());
    assert_eq!(
        loaded.settings.quotas.base,
        config::QuotaSettings {
            max_concurrent_calls: Some(4),
            cpu_seconds_per_minute: Some(120),
            max_tasks: None,
            max_queued_calls: Some(6),
            max_sessions: Some(3),
            weight: 4,
        }
    );
    assert_eq!(c.quotas.max_sessions, 3);
    assert_eq!(loaded.settings.quotas.base.weight, 4);
    assert!(loaded.settings.http.named_tokens);
    assert!(c.integrations.prometheus.principal_label);
    let introspection = oauth.introspection.as_ref().unwrap();
    assert_eq!(introspection.client_id, "mcp-rs");
    assert_eq!(introspection.client_secret.expose(), "s3cret-value");
    assert_eq!(
        introspection.endpoint.as_deref(),
        Some("https://idp.example.com/introspect")
    );
    assert_eq!(introspection.cache_for, Duration::from_secs(30));
    assert_eq!(introspection.cache_entries, 500);
    assert_eq!(c.workers.sandbox_memory_limit_mb, 1500);
    assert_eq!(c.workers.setup_timeout_s, 20);
    assert!(!c.sessions.enabled);
    assert_eq!(c.sessions.max_sessions, 3);
    assert_eq!(c.sessions.max_resident, 2);
    assert_eq!(c.sessions.spill_after_s, 0);
    assert_eq!(c.sessions.store_url, "s3://bucket/prefix");
    assert_eq!(c.sessions.queue_capacity, 0);
    assert_eq!(c.sessions.idle_timeout_s, 60);
    assert_eq!(c.sessions.max_lifetime_s, 600);
    assert!(!c.tasks.enabled);
    assert_eq!(c.tasks.max_running, 2);
    assert_eq!(c.tasks.queue_capacity, 7);
    assert_eq!(c.tasks.ttl_s, 90);
    assert_eq!(c.tasks.max_timeout_ms, 600_000);
    assert_eq!(c.tasks.immediate_result_ms, 250);
    assert_eq!(c.results.max_inline_image_kb, 0);
    assert_eq!(c.results.max_text_chars, 5000);
    assert_eq!(c.results.max_table_rows, 10);
    assert_eq!(c.results.max_table_columns, 8);
    assert!(!c.results.structured_content);
    assert!(!c.results.apps);
    assert_eq!(c.results.apps_asset_dir, "/srv/ui");
    assert_eq!(c.results.max_table_rows_app, 500);
    assert_eq!(c.results.figure_plotly_js, "inline");
    assert_eq!(loaded.settings.apps, None);
    assert_eq!(c.input_limits.max_file_kb, 2048);
    assert_eq!(c.input_limits.max_total_file_kb, 4096);
    assert!(c.integrations.prometheus.enabled);
    assert_eq!(c.integrations.prometheus.host, "::1");
    assert_eq!(c.integrations.prometheus.port, 9100);
    assert_eq!(loaded.settings.tokio_worker_threads, Some(2));
    assert_eq!(
        loaded.sources["workers.max_workers"],
        Source::Env("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS".into())
    );
    // Every variable named by the key reference was exercised here.
    for key in config::keys() {
        if let Some(var) = key.env {
            assert!(
                env.iter().any(|(k, _)| *k == var),
                "{var} is not covered by this test"
            );
        }
    }
}

/// The earlier environment names (each key's before #49 derived them from the key path), frozen:
/// a new key gets the derived name only.
const DEPRECATED_ENV_NAMES: usize = 57;

#[test]
fn every_environment_name_is_derived_from_its_key_and_earlier_names_still_work_with_a_warning() {
    let mut deprecated = 0;
    for key in config::keys() {
        if let Some(var) = &key.env {
            assert_eq!(
                *var,
                config::reference::env_name(&key.key),
                "{}'s variable",
                key.key
            );
        }
        deprecated += key.env_deprecated.len();
    }
    assert_eq!(
        deprecated, DEPRECATED_ENV_NAMES,
        "a new key's variable is the derived name, without an alias"
    );

    let dir = temp_dir("env-alias");
    // An earlier name alone applies, with a warning naming the new one.
    let old = load_with(
        &dir,
        &[],
        &[
            ("CODE_INTERPRETER_MCP_MAX_WORKERS", "3"),
            ("CODE_INTERPRETER_MCP_OTEL_SAMPLE_PERCENT", "50"),
        ],
    )
    .unwrap();
    assert_eq!(old.config.workers.max_workers, 3);
    assert_eq!(
        old.sources["workers.max_workers"],
        Source::Env("CODE_INTERPRETER_MCP_MAX_WORKERS".into())
    );
    assert_eq!(old.warnings.len(), 2, "{:?}", old.warnings);
    assert!(
        old.warnings.iter().any(|w| w
            == "environment variable CODE_INTERPRETER_MCP_MAX_WORKERS is deprecated: name it CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS (for key workers.max_workers)"),
        "{:?}",
        old.warnings
    );
    assert!(config::print_config(&old).contains(
        "# warning: environment variable CODE_INTERPRETER_MCP_OTEL_SAMPLE_PERCENT is deprecated"
    ));
    // Both: the new name wins, and the old one is said to be ignored.
    let both = load_with(
        &dir,
        &[],
        &[
            ("CODE_INTERPRETER_MCP_MAX_WORKERS", "3"),
            ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "5"),
        ],
    )
    .unwrap();
    assert_eq!(both.config.workers.max_workers, 5);
    assert!(both.warnings[0].contains("is deprecated and ignored"));
    // The new name alone: no warning.
    let new = load_with(
        &dir,
        &[],
        &[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "5")],
    )
    .unwrap();
    assert!(new.warnings.is_empty());
    // A bad value under an earlier name is an error naming that variable.
    let err = error(&dir, &[("CODE_INTERPRETER_MCP_MAX_WORKERS", "many")]);
    assert!(
        err.contains("CODE_INTERPRETER_MCP_MAX_WORKERS = \"many\""),
        "{err}"
    );
}

#[test]
fn validation_rules_name_the_key_the_source_and_what_is_allowed() {
    let dir = temp_dir("rules");
    let file = dir.join("code-interpreter-mcp.toml");
    let cases: &[(&str, &[&str])] = &[
        (
            "[input_limits]\nmax_file_kb = 0\n",
            &["input_limits.max_file_kb", "1..=1048576"],
        ),
        (
            "[auth.oauth]\nissuer = \"http://idp.example.com\"\n",
            &["auth.oauth.issuer", "https URL"],
        ),
        (
            "[auth.oauth]\nissuer = \"https://idp.example.com\"\nalgorithms = [\"HS256\"]\n",
            &["auth.oauth.algorithms", "HS256", "never"],
        ),
        (
            "[auth.oauth]\nissuer = \"https://idp.example.com\"\nalgorithms = [\"none\"]\n",
            &["auth.oauth.algorithms", "none"],
        ),
        (
            "bind_addr = \"0.0.0.0:8000\"\n[auth.oauth]\nissuer = \"https://idp.example.com\"\n",
            &["auth.oauth.issuer", "auth.oauth.resource set"],
        ),
        (
            "[auth.oauth]\nissuer = \"https://idp.example.com\"\nresource = \"https://a/mcp\\\" x\"\n",
            &["auth.oauth.resource", "quotes"],
        ),
        (
            "[auth.oauth]\nissuer = \"https://idp.example.com\"\nscope_run = \"code:run sessions:read\"\n",
            &["auth.oauth.scope_run", "not one scope"],
        ),
        (
            "[auth.oauth]\nissuer = \"https://idp.example.com\"\nintrospection_client_id = \"rs\"\nintrospection_client_secret = \"${CIM_CONFIG_TEST_UNSET_SECRET}\"\n",
            &[
                "auth.oauth.introspection_client_secret",
                "CIM_CONFIG_TEST_UNSET_SECRET",
            ],
        ),
        (
            "[auth.oauth]\nissuer = \"https://idp.example.com\"\njwks_timeout_ms = 50\n",
            &["auth.oauth.jwks_timeout_ms", "100..=30000"],
        ),
        (
            "[quotas]\nmax_concurrent_calls = 10001\n",
            &["quotas.max_concurrent_calls", "0..=10000"],
        ),
        (
            "[tasks]\nmax_timeout_ms = 86400001\n",
            &["tasks.max_timeout_ms", "1000..=86400000"],
        ),
        ("[tasks]\nttl_s = 0\n", &["tasks.ttl_s"]),
        (
            "[input_limits]\nmax_total_file_kb = 1048577\n",
            &["input_limits.max_total_file_kb", "1..=1048576"],
        ),
        (
            "[input_limits]\nmax_file_kb = 300\nmax_total_file_kb = 200\n",
            &[
                "input_limits.max_file_kb",
                "must not exceed input_limits.max_total_file_kb",
            ],
        ),
        (
            "[workers]\nmemory_limit_mb = 0\n",
            &["workers.memory_limit_mb", "positive"],
        ),
        (
            "[workers]\nmemory_limit_mb = 17592186044416\n",
            &["workers.memory_limit_mb"],
        ),
        (
            "[workers]\nmemory_limit_mb = -5\n",
            &["workers.memory_limit_mb"],
        ),
        (
            "[workers]\nmax_workers = 0\n",
            &["workers.max_workers", "1..=1024"],
        ),
        (
            "[workers]\nready_sandboxes = 0\n",
            &["workers.ready_sandboxes", "1..=64"],
        ),
        (
            "[workers]\nmax_workers = 2\nprewarmed_workers = 3\n",
            &[
                "workers.prewarmed_workers",
                "must not exceed workers.max_workers",
            ],
        ),
        (
            "preinstall_packages = [\"pandas\", \" \"]\n",
            &["preinstall_packages", "micropip requirements"],
        ),
        (
            "preimport_modules = [\"pandas\", \"matplotlib/pyplot\"]\n",
            &["preimport_modules", "Python module name"],
        ),
        (
            "preimport_modules = [\"pandas\"]\n[workers]\nboot = \"full\"\n",
            &["preimport_modules", "workers.boot = \"snapshot\""],
        ),
        (
            "package_index_urls = [\"http://pypi.internal/simple\"]\n",
            &["package_index_urls", "https://"],
        ),
        ("extra_ca_certs = [\"\"]\n", &["extra_ca_certs", "PEM"]),
        (
            "[workers]\nwasm_memory_limit_mb = 8\n",
            &["workers.wasm_memory_limit_mb", "16..=4096"],
        ),
        (
            "[workers]\nsandbox_memory_limit_mb = 32\n",
            &["workers.sandbox_memory_limit_mb", "64..=1048576"],
        ),
        (
            "[workers]\nsetup_timeout_s = 0\n",
            &["workers.setup_timeout_s", "1..=3600"],
        ),
        (
            "[sessions]\nmax_sessions = 0\n",
            &["sessions.max_sessions", "1..=100000"],
        ),
        (
            "[sessions]\nmax_resident = 0\n",
            &["sessions.max_resident", "1..=1024"],
        ),
        (
            "[results]\nfigure_plotly_js = \"plotly.js\"\n",
            &["results.figure_plotly_js", "\"cdn\", \"inline\""],
        ),
        (
            "[results]\nfigure_plotly_js = \"https://x.test/p.js\\\"><script>\"\n",
            &["results.figure_plotly_js", "ending in .js"],
        ),
        (
            "[results]\nmax_table_rows_app = 100001\n",
            &["results.max_table_rows_app", "0..=100000"],
        ),
        (
            "[sessions]\nstore_url = \"ftp://host/x\"\n",
            &["sessions.store_url", "names no store"],
        ),
        (
            "[sessions]\nstore_url = \"relative/dir\"\n",
            &["sessions.store_url", "s3://bucket/prefix"],
        ),
        (
            "[results]\nmax_table_rows = 1\n",
            &["results.max_table_rows", "2..=1000"],
        ),
        (
            "[sessions]\nqueue_capacity = 65\n",
            &["sessions.queue_capacity", "0..=64"],
        ),
        (
            "[sessions]\nidle_timeout_s = 0\n",
            &["sessions.idle_timeout_s", "is outside 1..="],
        ),
        (
            "bind_addr = \"localhost\"\n",
            &["bind_addr", "socket address"],
        ),
        (
            "log_format = \"xml\"\n",
            &["log_format", "\"text\" or \"json\""],
        ),
        (
            "[workers]\nboot = \"fast\"\n",
            &["workers.boot", "\"snapshot\" or \"full\""],
        ),
        (
            "allowed_hosts = [\"https://pypi.org\"]\n",
            &["allowed_hosts", "bare host name"],
        ),
        (
            "http_allowed_origins = [\"app.example.com\"]\n",
            &["http_allowed_origins", "origin"],
        ),
        (
            "[integrations.prometheus]\nenabled = true\nhost = \"localhost\"\n",
            &["integrations.prometheus.host", "IPv4 or IPv6"],
        ),
        (
            "[integrations.prometheus]\nenabled = true\nport = 0\n",
            &["integrations.prometheus.port", "1..=65535"],
        ),
        (
            "[integrations.prometheus]\nenabled = true\nport = 70000\n",
            &["integrations.prometheus.port", "1..=65535"],
        ),
        (
            "bind_addr = \"0.0.0.0:3131\"\n[integrations.prometheus]\nenabled = true\nhost = \"127.0.0.1\"\n",
            &[
                "integrations.prometheus.port",
                "must differ from bind_addr's port",
            ],
        ),
        (
            "[workers]\nmax_wrokers = 2\n",
            &["workers.max_wrokers", "unknown field"],
        ),
        ("unknown_top = 1\n", &["unknown_top", "unknown field"]),
        (
            "[workers]\nmax_workers = \"two\"\n",
            &["workers.max_workers", "invalid type"],
        ),
        (
            "runtime_package_installation = \"yes\"\n",
            &["runtime_package_installation", "invalid type"],
        ),
        (
            "[code_snippets.snippets.x]\ntitle = \"t\"\n",
            &["code_snippets.snippets.x", "missing field"],
        ),
    ];
    for (text, needles) in cases {
        std::fs::write(&file, text).unwrap();
        let err = error(&dir, &[]);
        for needle in *needles {
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
        assert!(
            err.contains(&file.display().to_string()),
            "{text:?}: {err:?} lacks the file"
        );
    }
    std::fs::remove_file(&file).unwrap();

    for (var, value, needle) in [
        (
            "CODE_INTERPRETER_MCP_SKIP_HOST_HEADER_VERIFICATION",
            "yes",
            "must be true or false",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "1",
            "must be true or false",
        ),
        (
            "CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS",
            "many",
            "must be an integer",
        ),
        (
            "CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_FILE_KB",
            "0",
            "1..=1048576",
        ),
        ("TOKIO_WORKER_THREADS", "0", "positive integer"),
        ("TOKIO_WORKER_THREADS", "four", "positive integer"),
    ] {
        let err = error(&dir, &[(var, value)]);
        assert!(
            err.contains(var) && err.contains(needle),
            "{var}={value}: {err}"
        );
    }

    // The default prewarmed_workers is cut to a smaller max_workers; a value that was set must fit.
    let one = load_with(
        &dir,
        &[],
        &[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1")],
    )
    .unwrap();
    assert_eq!(one.config.workers.prewarmed(), 1);
    let err = error(
        &dir,
        &[
            ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
            ("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "2"),
        ],
    );
    assert!(
        err.contains("workers.prewarmed_workers") && err.contains("must not exceed"),
        "{err}"
    );

    write(&dir, "code-interpreter-mcp.toml", "[workers\n");
    let err = error(&dir, &[]);
    assert!(
        err.contains("not valid TOML") && err.contains("code-interpreter-mcp.toml"),
        "{err}"
    );
}

#[test]
fn snippets_and_their_defaults_load() {
    let dir = temp_dir("snippets");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        "[code_snippets.snippets.convert_docx_to_pdf]\ntitle = \"Convert DOCX to PDF\"\ndescription = \"d\"\ncode_snippet = '''\nprint(1)\n'''\n",
    );
    let loaded = load(&dir);
    let s = &loaded.config.code_snippets.snippets["convert_docx_to_pdf"];
    assert_eq!(s.title, "Convert DOCX to PDF");
    assert!(s.tags.is_empty() && s.required_python_packages.is_empty());
}

#[test]
fn committed_reference_is_current_and_the_check_catches_a_stale_copy() {
    let committed =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/config-reference.json");
    assert_eq!(
        std::fs::read_to_string(&committed).unwrap(),
        config::reference_json(),
        "run `cargo run --bin gen-config-reference`"
    );
    let gen_bin = env!("CARGO_BIN_EXE_gen-config-reference");
    let ok = Command::new(gen_bin).arg("--check").output().unwrap();
    assert!(ok.status.success());

    let dir = temp_dir("reference");
    let stale = write(
        &dir,
        "reference.json",
        &config::reference_json().replace("max_workers", "max_wrkers"),
    );
    let out = Command::new(gen_bin)
        .args(["--check", "--path"])
        .arg(&stale)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stale"));

    let reference: serde_json::Value = serde_json::from_str(&config::reference_json()).unwrap();
    let keys = reference["keys"].as_array().unwrap();
    let max_workers = keys
        .iter()
        .find(|k| k["key"] == "workers.max_workers")
        .unwrap();
    assert_eq!(max_workers["default"], 2);
    assert_eq!(
        max_workers["env"],
        "CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS"
    );
    assert_eq!(max_workers["type"], "integer");
    assert!(
        max_workers["doc"]
            .as_str()
            .unwrap()
            .contains("simultaneous")
    );
}

#[test]
fn upstream_tables_load_with_their_defaults_and_bad_ones_name_the_key() {
    let dir = temp_dir("upstream");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        r#"
[upstream.memory]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-memory"]
env = { MEMORY_FILE_PATH = "/tmp/m.jsonl" }

[upstream.github]
url = "https://api.example.com/mcp/"
headers = { Authorization = "Bearer ${GITHUB_TOKEN}" }
tools = ["search_issues"]
timeout_ms = 5000
"#,
    );
    let loaded = load(&dir);
    let memory = &loaded.settings.upstream["memory"];
    assert_eq!(memory.max_calls_per_execution, 100);
    assert_eq!(memory.max_concurrent_calls, 16);
    assert_eq!(memory.timeout, std::time::Duration::from_secs(30));
    assert_eq!(memory.max_result_bytes, 1024 * 1024);
    assert!(matches!(
        &memory.transport,
        config::UpstreamTransport::Stdio { command, args, .. } if command == "npx" && args.len() == 2
    ));
    let github = &loaded.settings.upstream["github"];
    assert_eq!(github.tools, ["search_issues"]);
    assert_eq!(github.timeout, std::time::Duration::from_secs(5));
    // The template is kept as written (resolved by the server at start-up, never printed resolved).
    assert!(matches!(
        &github.transport,
        config::UpstreamTransport::Http { headers, .. } if headers["Authorization"] == "Bearer ${GITHUB_TOKEN}"
    ));

    for (text, expected) in [
        (
            "[upstream.\"my-server\"]\ncommand = \"x\"\n",
            "Python identifier",
        ),
        ("[upstream.class]\ncommand = \"x\"\n", "Python identifier"),
        ("[upstream.a]\n", "exactly one of url"),
        (
            "[upstream.a]\ncommand = \"x\"\nurl = \"https://e.com\"\n",
            "exactly one of url",
        ),
        (
            "[upstream.a]\nurl = \"http://example.com/mcp\"\n",
            "upstream.a.url",
        ),
        (
            "[upstream.a]\nurl = \"https://e.com\"\nheaders = { \"bad name\" = \"v\" }\n",
            "not an HTTP header name",
        ),
        (
            "[upstream.a]\ncommand = \"x\"\nheaders = { A = \"v\" }\n",
            "headers go with url",
        ),
        (
            "[upstream.a]\ncommand = \"x\"\nmax_calls_per_execution = 0\n",
            "upstream.a.max_calls_per_execution",
        ),
        (
            "[upstream.a]\ncommand = \"x\"\nmax_concurrent_calls = 2000\n",
            "upstream.a.max_concurrent_calls",
        ),
        ("[upstream.a]\ncommand = \"x\"\nunknown = 1\n", "unknown"),
    ] {
        let dir = temp_dir("upstream-bad");
        write(&dir, "code-interpreter-mcp.toml", text);
        let err = error(&dir, &[]);
        assert!(err.contains(expected), "{text}: {err}");
    }
    // http:// only to loopback.
    let dir = temp_dir("upstream-loopback");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        "[upstream.a]\nurl = \"http://127.0.0.1:9000/mcp\"\n[upstream.b]\nurl = \"http://localhost/mcp\"\n",
    );
    assert_eq!(load(&dir).settings.upstream.len(), 2);
}

#[test]
fn network_host_grants_load_with_their_defaults_and_bad_ones_name_the_key() {
    let dir = temp_dir("grants");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        r#"
[[network.hosts]]
host = "API.Example.com."
inject_headers = { Authorization = "Bearer ${API_TOKEN}" }

[[network.hosts]]
host = "*.data.example.org"
methods = ["get", "POST"]
paths = ["/v1/", "/v2/"]
max_response_mb = 5
allow_private_addresses = true
"#,
    );
    let grants = load(&dir).settings.engine.host_grants;
    assert_eq!(grants.len(), 2);
    assert_eq!(grants[0].host, "api.example.com");
    assert_eq!(grants[0].methods, ["GET", "HEAD"]);
    assert_eq!(grants[0].paths, ["/"]);
    assert_eq!(grants[0].max_response_bytes, 100 << 20);
    assert!(!grants[0].allow_private_addresses);
    // The template as written: resolved by the server at start-up.
    assert_eq!(
        grants[0].inject_headers["Authorization"],
        "Bearer ${API_TOKEN}"
    );
    assert_eq!(grants[1].host, "*.data.example.org");
    assert_eq!(grants[1].methods, ["GET", "POST"]);
    assert_eq!(grants[1].max_response_bytes, 5 << 20);
    assert!(grants[1].allow_private_addresses);

    for (text, expected) in [
        ("[[network.hosts]]\n", "network.hosts[0].host"),
        (
            "[[network.hosts]]\nhost = \"a b\"\n",
            "network.hosts[0].host",
        ),
        (
            "[[network.hosts]]\nhost = \"https://x.com\"\n",
            "network.hosts[0].host",
        ),
        (
            "[[network.hosts]]\nhost = \"x.com\"\nmethods = [\"TRACE\"]\n",
            "network.hosts[0].methods",
        ),
        (
            "[[network.hosts]]\nhost = \"x.com\"\nmethods = []\n",
            "network.hosts[0].methods",
        ),
        (
            "[[network.hosts]]\nhost = \"x.com\"\npaths = [\"v1\"]\n",
            "network.hosts[0].paths",
        ),
        (
            "[[network.hosts]]\nhost = \"x.com\"\ninject_headers = { Host = \"y\" }\n",
            "cannot be injected",
        ),
        (
            "[[network.hosts]]\nhost = \"x.com\"\nmax_response_mb = 101\n",
            "max_response_mb",
        ),
        (
            "[[network.hosts]]\nhost = \"x.com\"\nsecret = 1\n",
            "unknown",
        ),
    ] {
        let dir = temp_dir("grants-bad");
        write(&dir, "code-interpreter-mcp.toml", text);
        let err = error(&dir, &[]);
        assert!(err.contains(expected), "{text}: {err}");
    }
}

#[test]
fn quota_overrides_load_and_bad_ones_name_the_key() {
    let dir = temp_dir("quota-overrides");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        r#"
[auth]
named_tokens = true

[quotas]
max_concurrent_calls = 2
weight = 3

[[quotas.overrides]]
name = "batch"
max_concurrent_calls = 0
weight = 10

[[quotas.overrides]]
claim = "tier"
value = "gold"
max_sessions = 50
"#,
    );
    let loaded = load(&dir);
    let policy = &loaded.settings.quotas;
    assert!(loaded.settings.http.named_tokens);
    assert_eq!(policy.base.max_concurrent_calls, Some(2));
    assert_eq!(policy.base.weight, 3);
    assert_eq!(policy.claims(), ["tier"]);
    // The first match wins; what it leaves out is the base's; 0 is no limit.
    let batch = policy.limits_for(Some("batch"), |_| Vec::new());
    assert_eq!((batch.max_concurrent_calls, batch.weight), (None, 10));
    let gold = policy.limits_for(None, |c| {
        if c == "tier" {
            vec!["silver", "gold"]
        } else {
            Vec::new()
        }
    });
    assert_eq!(
        (gold.max_concurrent_calls, gold.max_sessions, gold.weight),
        (Some(2), Some(50), 3)
    );
    let other = policy.limits_for(Some("alice"), |_| vec!["bronze"]);
    assert_eq!(other, policy.base);

    for (text, expected) in [
        (
            "[[quotas.overrides]]
max_tasks = 1
",
            "quotas.overrides[0].name",
        ),
        (
            "[[quotas.overrides]]
name = \"a\"
claim = \"tier\"
value = \"x\"
",
            "quotas.overrides[0].name",
        ),
        (
            "[[quotas.overrides]]
claim = \"tier\"
",
            "quotas.overrides[0].name",
        ),
        (
            "[[quotas.overrides]]
name = \"a\"
weight = 0
",
            "quotas.overrides[0].weight",
        ),
        (
            "[[quotas.overrides]]
name = \"a\"
max_concurrent_calls = 10001
",
            "quotas.overrides[0].max_concurrent_calls",
        ),
        (
            "[[quotas.overrides]]
name = \"a\"
limit = 1
",
            "unknown",
        ),
        (
            "[quotas]
weight = 101
",
            "quotas.weight",
        ),
    ] {
        let dir = temp_dir("quota-overrides-bad");
        write(&dir, "code-interpreter-mcp.toml", text);
        let err = error(&dir, &[]);
        assert!(err.contains(expected), "{text}: {err}");
    }
}

#[test]
fn trace_export_loads_and_bad_values_name_the_key() {
    let dir = temp_dir("traces");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        r#"
[integrations.opentelemetry]
enabled = true
endpoint = "https://otlp.example.com/v1/traces"
sample_percent = 0
[integrations.opentelemetry.headers]
x-api-key = "plain-value"
"#,
    );
    let traces = load(&dir).settings.traces.unwrap();
    assert_eq!(traces.endpoint, "https://otlp.example.com/v1/traces");
    assert_eq!(traces.sample_ratio, 0.0);
    assert_eq!(traces.headers.len(), 1);
    assert_eq!(traces.headers[0].0, "x-api-key");
    assert_eq!(traces.headers[0].1.expose(), "plain-value");
    assert!(
        !format!("{traces:?}").contains("plain-value"),
        "a header value is never shown"
    );
    // Off by default: nothing to check then.
    assert!(load(&temp_dir("traces-off")).settings.traces.is_none());

    let on = "[integrations.opentelemetry]\nenabled = true\n";
    for (text, expected) in [
        (
            format!("{on}endpoint = \"otel:4318\"\n"),
            "integrations.opentelemetry.endpoint",
        ),
        (
            format!("{on}endpoint = \"http:///v1\"\n"),
            "integrations.opentelemetry.endpoint",
        ),
        (
            format!("{on}max_queue_spans = 64\nmax_batch_spans = 65\n"),
            "integrations.opentelemetry.max_batch_spans",
        ),
        (
            format!("{on}sample_percent = 101\n"),
            "integrations.opentelemetry.sample_percent",
        ),
        (
            format!("{on}export_timeout_ms = 50\n"),
            "integrations.opentelemetry.export_timeout_ms",
        ),
        (
            format!("{on}service_name = \" \"\n"),
            "integrations.opentelemetry.service_name",
        ),
        (
            format!("{on}[integrations.opentelemetry.headers]\n\"bad name\" = \"x\"\n"),
            "integrations.opentelemetry.headers",
        ),
        (
            format!(
                "{on}[integrations.opentelemetry.headers]\nx = \"${{CIM_TEST_UNSET_VARIABLE}}\"\n"
            ),
            "integrations.opentelemetry.headers",
        ),
    ] {
        let dir = temp_dir("traces-bad");
        write(&dir, "code-interpreter-mcp.toml", &text);
        let err = error(&dir, &[]);
        assert!(err.contains(expected), "{text}: {err}");
    }
}
