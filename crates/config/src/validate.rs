//! Validation: every rule a configuration must obey, checked once, and the [`Settings`] it yields.
//! Numeric ranges are one table ([`RANGES`]: a new limit is one row); the other rules each name the
//! key, where its value came from and what is allowed.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use code_interpreter_mcp_protocol::InputLimits;
use code_interpreter_mcp_protocol::limits::shown;

use crate::model::{AppConfig, BootMode};
use crate::settings::{
    Applies, AppsSettings, EngineSettings, HostGrant, HttpSettings, IntrospectionSettings,
    OAuthScopes, OAuthSettings, QuotaOverride, QuotaPolicy, QuotaSettings, SessionSettings,
    Settings, SnippetSettings, TaskSettings, TraceSettings, UpstreamSettings, UpstreamTransport,
    WorkerSettings,
};
use crate::sources::{ConfigError, Source, source_of};

/// A numeric key's allowed range.
struct Range {
    key: &'static str,
    value: fn(&AppConfig) -> u64,
    allowed: RangeInclusive<u64>,
    unit: &'static str,
}

/// The largest KB allowance (1 GiB).
const MAX_KB: u64 = 1_048_576;

/// Every numeric key's range, in the order they are checked.
const RANGES: &[Range] = &[
    Range {
        key: "quotas.max_concurrent_calls",
        value: |c| c.quotas.max_concurrent_calls,
        allowed: 0..=10_000,
        unit: "",
    },
    Range {
        key: "quotas.cpu_seconds_per_minute",
        value: |c| c.quotas.cpu_seconds_per_minute,
        allowed: 0..=86_400,
        unit: " s",
    },
    Range {
        key: "quotas.max_queued_calls",
        value: |c| c.quotas.max_queued_calls,
        allowed: 0..=10_000,
        unit: "",
    },
    Range {
        key: "quotas.max_sessions",
        value: |c| c.quotas.max_sessions,
        allowed: 0..=100_000,
        unit: "",
    },
    Range {
        key: "quotas.weight",
        value: |c| c.quotas.weight,
        allowed: 1..=100,
        unit: "",
    },
    Range {
        key: "quotas.max_tasks",
        value: |c| c.quotas.max_tasks,
        allowed: 0..=100_000,
        unit: "",
    },
    Range {
        key: "integrations.opentelemetry.sample_percent",
        value: |c| c.integrations.opentelemetry.sample_percent,
        allowed: 0..=100,
        unit: " %",
    },
    Range {
        key: "integrations.opentelemetry.max_queue_spans",
        value: |c| c.integrations.opentelemetry.max_queue_spans,
        allowed: 64..=65_536,
        unit: "",
    },
    Range {
        key: "integrations.opentelemetry.max_batch_spans",
        value: |c| c.integrations.opentelemetry.max_batch_spans,
        allowed: 1..=65_536,
        unit: "",
    },
    Range {
        key: "integrations.opentelemetry.export_interval_ms",
        value: |c| c.integrations.opentelemetry.export_interval_ms,
        allowed: 100..=60_000,
        unit: " ms",
    },
    Range {
        key: "integrations.opentelemetry.export_timeout_ms",
        value: |c| c.integrations.opentelemetry.export_timeout_ms,
        allowed: 100..=60_000,
        unit: " ms",
    },
    Range {
        key: "auth.oauth.clock_skew_s",
        value: |c| c.auth.oauth.clock_skew_s,
        allowed: 0..=300,
        unit: " s",
    },
    Range {
        key: "auth.oauth.jwks_refresh_s",
        value: |c| c.auth.oauth.jwks_refresh_s,
        allowed: 1..=86_400,
        unit: " s",
    },
    Range {
        key: "auth.oauth.jwks_min_refresh_interval_s",
        value: |c| c.auth.oauth.jwks_min_refresh_interval_s,
        allowed: 1..=3600,
        unit: " s",
    },
    Range {
        key: "auth.oauth.jwks_timeout_ms",
        value: |c| c.auth.oauth.jwks_timeout_ms,
        allowed: 100..=30_000,
        unit: " ms",
    },
    Range {
        key: "auth.oauth.introspection_cache_s",
        value: |c| c.auth.oauth.introspection_cache_s,
        allowed: 0..=3600,
        unit: " s",
    },
    Range {
        key: "auth.oauth.introspection_cache_entries",
        value: |c| c.auth.oauth.introspection_cache_entries,
        allowed: 1..=1_000_000,
        unit: "",
    },
    Range {
        key: "auth.oauth.jwks_max_kb",
        value: |c| c.auth.oauth.jwks_max_kb,
        allowed: 1..=4096,
        unit: " KB",
    },
    Range {
        key: "input_limits.max_file_kb",
        value: |c| c.input_limits.max_file_kb,
        allowed: 1..=MAX_KB,
        unit: " KB",
    },
    Range {
        key: "input_limits.max_total_file_kb",
        value: |c| c.input_limits.max_total_file_kb,
        allowed: 1..=MAX_KB,
        unit: " KB",
    },
    Range {
        key: "workers.wasm_memory_limit_mb",
        value: |c| c.workers.wasm_memory_limit_mb,
        allowed: 16..=4096,
        unit: " MB",
    },
    Range {
        key: "workers.sandbox_memory_limit_mb",
        value: |c| c.workers.sandbox_memory_limit_mb,
        allowed: 64..=1_048_576,
        unit: " MB",
    },
    Range {
        key: "workers.setup_timeout_s",
        value: |c| c.workers.setup_timeout_s,
        allowed: 1..=3600,
        unit: " s",
    },
    Range {
        key: "workers.idle_give_back_s",
        value: |c| c.workers.idle_give_back_s,
        allowed: 0..=86_400,
        unit: " s",
    },
    Range {
        key: "workers.max_workers",
        value: |c| c.workers.max_workers,
        allowed: 1..=1024,
        unit: "",
    },
    Range {
        key: "workers.ready_sandboxes",
        value: |c| c.workers.ready_sandboxes,
        allowed: 1..=64,
        unit: "",
    },
    Range {
        key: "workers.ready_preimported_sandboxes",
        value: |c| c.workers.ready_preimported_sandboxes,
        allowed: 1..=64,
        unit: "",
    },
    Range {
        key: "workers.queue_capacity",
        value: |c| c.workers.queue_capacity,
        allowed: 0..=1_000_000,
        unit: "",
    },
    Range {
        key: "sessions.max_sessions",
        value: |c| c.sessions.max_sessions,
        allowed: 1..=100_000,
        unit: "",
    },
    Range {
        key: "sessions.max_resident",
        value: |c| c.sessions.max_resident,
        allowed: 1..=1024,
        unit: "",
    },
    Range {
        key: "sessions.spill_after_s",
        value: |c| c.sessions.spill_after_s,
        allowed: 0..=u64::MAX / 2,
        unit: " s",
    },
    Range {
        key: "sessions.queue_capacity",
        value: |c| c.sessions.queue_capacity,
        allowed: 0..=64,
        unit: "",
    },
    Range {
        key: "sessions.idle_timeout_s",
        value: |c| c.sessions.idle_timeout_s,
        allowed: 1..=u64::MAX / 2,
        unit: " s",
    },
    Range {
        key: "sessions.max_lifetime_s",
        value: |c| c.sessions.max_lifetime_s,
        allowed: 1..=u64::MAX / 2,
        unit: " s",
    },
    Range {
        key: "tasks.queue_capacity",
        value: |c| c.tasks.queue_capacity,
        allowed: 0..=10_000,
        unit: "",
    },
    Range {
        key: "tasks.max_running",
        value: |c| c.tasks.max_running,
        allowed: 0..=1024,
        unit: "",
    },
    Range {
        key: "tasks.ttl_s",
        value: |c| c.tasks.ttl_s,
        allowed: 1..=604_800,
        unit: " s",
    },
    Range {
        key: "tasks.max_timeout_ms",
        value: |c| c.tasks.max_timeout_ms,
        allowed: 1_000..=86_400_000,
        unit: " ms",
    },
    Range {
        key: "tasks.immediate_result_ms",
        value: |c| c.tasks.immediate_result_ms,
        allowed: 0..=120_000,
        unit: " ms",
    },
    Range {
        key: "results.max_inline_image_kb",
        value: |c| c.results.max_inline_image_kb,
        allowed: 0..=MAX_KB,
        unit: " KB",
    },
    Range {
        key: "results.max_text_chars",
        value: |c| c.results.max_text_chars,
        allowed: 0..=100_000_000,
        unit: "",
    },
    Range {
        key: "results.max_table_rows",
        value: |c| c.results.max_table_rows,
        allowed: 2..=1000,
        unit: "",
    },
    Range {
        key: "results.max_table_columns",
        value: |c| c.results.max_table_columns,
        allowed: 2..=1000,
        unit: "",
    },
    Range {
        key: "results.max_table_rows_app",
        value: |c| c.results.max_table_rows_app,
        allowed: 0..=100_000,
        unit: "",
    },
];

/// The error for `key`: its source and what is allowed.
struct Fail<'a>(&'a BTreeMap<String, Source>);

impl Fail<'_> {
    fn at(&self, key: &str, allowed: impl std::fmt::Display) -> ConfigError {
        ConfigError(format!("key {key} ({}): {allowed}", source_of(self.0, key)))
    }
}

/// Checks `c` (whose values came from `sources`) and parses it into [`Settings`].
pub fn validate(
    c: &AppConfig,
    sources: &BTreeMap<String, Source>,
    tokio_worker_threads: Option<usize>,
) -> Result<Settings, ConfigError> {
    let fail = Fail(sources);
    let bind_addr: SocketAddr = c.bind_addr.parse().map_err(|_| {
        fail.at(
            "bind_addr",
            format!(
                "{:?} is not a socket address such as 127.0.0.1:8000",
                c.bind_addr
            ),
        )
    })?;
    for range in RANGES {
        let value = (range.value)(c);
        if !range.allowed.contains(&value) {
            return Err(fail.at(
                range.key,
                format!(
                    "{value} is outside {}..={}{}",
                    range.allowed.start(),
                    range.allowed.end(),
                    range.unit
                ),
            ));
        }
    }
    check_workers(c, &fail, sources)?;
    check_names(c, &fail)?;
    check_lists(c, &fail)?;
    let prometheus = prometheus(c, &fail, bind_addr, sources)?;
    let upstream = upstream(c, &fail)?;
    let host_grants = host_grants(c, &fail)?;
    let oauth = oauth(c, &fail, bind_addr)?;
    let traces = traces(c, &fail)?;
    let overrides = quota_overrides(c, &fail)?;
    let mut settings = settings(c, bind_addr, prometheus, tokio_worker_threads);
    settings.http.oauth = oauth;
    settings.traces = traces;
    settings.quotas.overrides = overrides;
    settings.upstream = upstream;
    settings.engine.host_grants = host_grants;
    Ok(settings)
}

fn check_workers(
    c: &AppConfig,
    fail: &Fail,
    sources: &BTreeMap<String, Source>,
) -> Result<(), ConfigError> {
    let il = &c.input_limits;
    if il.max_file_kb > il.max_total_file_kb {
        return Err(fail.at(
            "input_limits.max_file_kb",
            format!(
                "{} must not exceed input_limits.max_total_file_kb ({})",
                il.max_file_kb, il.max_total_file_kb
            ),
        ));
    }
    let w = &c.workers;
    if w.memory_limit_mb == 0
        || w.memory_limit_mb
            .checked_mul(1_048_576)
            .is_none_or(|b| usize::try_from(b).is_err())
    {
        return Err(fail.at(
            "workers.memory_limit_mb",
            format!(
                "{} must be a positive number of MB whose size in bytes fits this platform's address size",
                w.memory_limit_mb
            ),
        ));
    }
    // The default is cut to max_workers (see `WorkersConfig::prewarmed`); a set value must fit.
    if w.prewarmed_workers > w.max_workers
        && source_of(sources, "workers.prewarmed_workers") != Source::Default
    {
        return Err(fail.at(
            "workers.prewarmed_workers",
            format!(
                "{} must not exceed workers.max_workers ({})",
                w.prewarmed_workers, w.max_workers
            ),
        ));
    }
    Ok(())
}

fn check_names(c: &AppConfig, fail: &Fail) -> Result<(), ConfigError> {
    let replica = &c.replica_id;
    if replica.len() > 63
        || !replica
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(fail.at(
            "replica_id",
            format!(
                "\"{}\" must be at most 63 lower-case letters, digits and '-' (empty: no prefix)",
                shown(replica)
            ),
        ));
    }
    let plotly_js = &c.results.figure_plotly_js;
    let url_ok = |u: &str| {
        (u.starts_with("https://") || u.starts_with("http://") || u.starts_with('/'))
            && u.ends_with(".js")
            && u.len() <= 2048
            && u.bytes()
                .all(|b| b.is_ascii_graphic() && !b"\"'<>\\`".contains(&b))
    };
    if plotly_js != "cdn" && plotly_js != "inline" && !url_ok(plotly_js) {
        return Err(fail.at(
            "results.figure_plotly_js",
            format!(
                "\"{}\" must be \"cdn\", \"inline\", or a URL of plotly.js (https://..., http://... or \
/..., ending in .js, without quotes, spaces or <>)",
                shown(plotly_js)
            ),
        ));
    }
    let store = c.sessions.store_url.trim();
    let store_ok = store.is_empty()
        || store.eq_ignore_ascii_case("off")
        || store.starts_with('/')
        || store.starts_with("file:///")
        || store
            .strip_prefix("s3://")
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'));
    if !store_ok {
        return Err(fail.at(
            "sessions.store_url",
            format!(
                "\"{}\" names no store: empty (the directory <package_cache_dir>/sessions), an absolute path, file:///path, s3://bucket/prefix, or off",
                shown(store)
            ),
        ));
    }
    if c.auth.bearer_tokens_file.trim() != c.auth.bearer_tokens_file {
        return Err(fail.at(
            "auth.bearer_tokens_file",
            "must not start or end with whitespace",
        ));
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
            return Err(fail.at(
                "preimport_modules",
                format!(
                    "{module:?} must be a Python module name such as \"pandas\" or \"matplotlib.pyplot\""
                ),
            ));
        }
    }
    if !c.preimport_modules.is_empty() && c.workers.boot == BootMode::Full {
        return Err(fail.at(
            "preimport_modules",
            "needs workers.boot = \"snapshot\" (modules are pre-imported into the memory snapshot)",
        ));
    }
    Ok(())
}

/// One list-valued key's rule: what each entry must be, and the error for one that is not.
struct ListRule {
    key: &'static str,
    entries: fn(&AppConfig) -> &[String],
    ok: fn(&str) -> bool,
    error: fn(&str) -> String,
}

/// The list-valued keys' rules.
const LIST_RULES: &[ListRule] = &[
    ListRule {
        key: "allowed_hosts",
        entries: |c| &c.allowed_hosts,
        ok: |h| !(h.trim().is_empty() || h.contains('/') || h.contains(':')),
        error: |h| format!("{h:?} must be a bare host name such as pypi.org"),
    },
    ListRule {
        key: "preinstall_packages",
        entries: |c| &c.preinstall_packages,
        ok: |r| !r.trim().is_empty(),
        error: |_| {
            "entries must be micropip requirements such as \"pandas\" or \"snowballstemmer==3.0.1\", not empty strings".into()
        },
    },
    ListRule {
        key: "package_index_urls",
        entries: |c| &c.package_index_urls,
        ok: |u| u.starts_with("https://"),
        error: |u| format!("{u:?} must be an https:// URL (sandboxes fetch over HTTPS only)"),
    },
    ListRule {
        key: "extra_ca_certs",
        entries: |c| &c.extra_ca_certs,
        ok: |p| !p.trim().is_empty(),
        error: |_| "entries must be paths of PEM files, not empty strings".into(),
    },
    ListRule {
        key: "http_allowed_hosts",
        entries: |c| &c.http_allowed_hosts,
        ok: |h| !(h.trim().is_empty() || h.contains('/')),
        error: |h| format!("{h:?} must be a host name or host:port such as mcp.example.com:8443"),
    },
    ListRule {
        key: "http_allowed_origins",
        entries: |c| &c.http_allowed_origins,
        ok: |o| o == "null" || o.starts_with("http://") || o.starts_with("https://"),
        error: |o| format!("{o:?} must be an origin such as https://app.example.com or null"),
    },
];

/// Every entry of the list-valued keys is of its key's form.
fn check_lists(c: &AppConfig, fail: &Fail) -> Result<(), ConfigError> {
    for rule in LIST_RULES {
        if let Some(bad) = (rule.entries)(c).iter().find(|e| !(rule.ok)(e)) {
            return Err(fail.at(rule.key, (rule.error)(bad)));
        }
    }
    Ok(())
}

/// Python keywords, which cannot follow `from upstream import`.
const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Whether `name` can be imported as `from upstream import name`: an ASCII identifier, not a
/// keyword, not private.
fn python_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 64
        && !PYTHON_KEYWORDS.contains(&name)
}

/// The JWS algorithms `auth.oauth.algorithms` may name (asymmetric only: no `none`, no HS*).
const OAUTH_ALGORITHMS: &[&str] = &["RS256", "PS256", "ES256", "EdDSA"];

/// `[auth.oauth]`, checked: `None` when no issuer is set.
fn oauth(
    c: &AppConfig,
    fail: &Fail,
    bind_addr: SocketAddr,
) -> Result<Option<OAuthSettings>, ConfigError> {
    let o = &c.auth.oauth;
    if o.issuer.is_empty() {
        return Ok(None);
    }
    if !upstream_url_ok(&o.issuer) || o.issuer.contains(['?', '#']) {
        return Err(fail.at(
            "auth.oauth.issuer",
            format!(
                "\"{}\" must be an https URL (http only on a loopback address) without query or fragment",
                shown(&o.issuer)
            ),
        ));
    }
    if o.resource.is_empty() && !bind_addr.ip().is_loopback() {
        return Err(fail.at(
            "auth.oauth.issuer",
            format!(
                "needs auth.oauth.resource set (the URL clients reach /mcp at, e.g. https://mcp.example.com/mcp) when bind_addr ({bind_addr}) is not a loopback address"
            ),
        ));
    }
    if !o.resource.is_empty()
        && (!upstream_url_ok(&o.resource) || o.resource.contains(['#', '?', ' ', '"', '\\']))
    {
        return Err(fail.at(
            "auth.oauth.resource",
            format!(
                "\"{}\" must be an https URL (http only on a loopback address) without query, fragment, spaces or quotes",
                shown(&o.resource)
            ),
        ));
    }
    if o.algorithms.is_empty() {
        return Err(fail.at("auth.oauth.algorithms", "must name at least one algorithm"));
    }
    if let Some(bad) = o
        .algorithms
        .iter()
        .find(|a| !OAUTH_ALGORITHMS.contains(&a.as_str()))
    {
        return Err(fail.at(
            "auth.oauth.algorithms",
            format!(
                "\"{}\" is not one of {} (none and HS* are never accepted)",
                shown(bad),
                OAUTH_ALGORITHMS.join(", ")
            ),
        ));
    }
    optional_secure_url(fail, "auth.oauth.jwks_uri", &o.jwks_uri)?;
    for (key, scope) in [
        ("auth.oauth.scope_run", &o.scope_run),
        ("auth.oauth.scope_sessions_read", &o.scope_sessions_read),
        ("auth.oauth.scope_sessions_write", &o.scope_sessions_write),
    ] {
        // RFC 6749 §3.3 scope-token: visible ASCII but space, '"' and '\\'.
        if !scope
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            return Err(fail.at(
                key,
                format!(
                    "\"{}\" is not one scope: visible ASCII without spaces, quotes or backslashes",
                    shown(scope)
                ),
            ));
        }
    }
    let introspection = if o.introspection_client_id.is_empty() {
        None
    } else {
        let endpoint = &o.introspection_endpoint;
        optional_secure_url(fail, "auth.oauth.introspection_endpoint", endpoint)?;
        let key = "auth.oauth.introspection_client_secret";
        let client_secret =
            crate::secret::resolve(key, &o.introspection_client_secret).map_err(|e| {
                let reason = e.strip_prefix(&format!("{key}: ")).unwrap_or(&e);
                fail.at(key, reason)
            })?;
        Some(IntrospectionSettings {
            client_id: o.introspection_client_id.clone(),
            client_secret,
            endpoint: (!o.introspection_endpoint.is_empty())
                .then(|| o.introspection_endpoint.clone()),
            cache_for: Duration::from_secs(o.introspection_cache_s),
            cache_entries: usize::try_from(o.introspection_cache_entries).unwrap_or(usize::MAX),
        })
    };
    Ok(Some(OAuthSettings {
        issuer: o.issuer.clone(),
        resource: (!o.resource.is_empty()).then(|| o.resource.clone()),
        algorithms: o.algorithms.clone(),
        clock_skew: Duration::from_secs(o.clock_skew_s),
        jwks_uri: (!o.jwks_uri.is_empty()).then(|| o.jwks_uri.clone()),
        jwks_refresh: Duration::from_secs(o.jwks_refresh_s),
        jwks_min_refresh_interval: Duration::from_secs(o.jwks_min_refresh_interval_s),
        jwks_timeout: Duration::from_millis(o.jwks_timeout_ms),
        jwks_max_bytes: usize::try_from(o.jwks_max_kb * 1024).unwrap_or(usize::MAX),
        scopes: OAuthScopes {
            run: o.scope_run.clone(),
            sessions_read: o.scope_sessions_read.clone(),
            sessions_write: o.scope_sessions_write.clone(),
        },
        introspection,
    }))
}

/// Checks that `url`, at `key`, is empty, or https (http only to a loopback address).
fn optional_secure_url(fail: &Fail, key: &str, url: &str) -> Result<(), ConfigError> {
    if url.is_empty() || upstream_url_ok(url) {
        return Ok(());
    }
    Err(fail.at(
        key,
        format!(
            "\"{}\" must be an https URL (http only on a loopback address), or empty",
            shown(url)
        ),
    ))
}

/// Whether `url` may carry an upstream's requests: https, or http to a loopback address.
fn upstream_url_ok(url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        return false;
    }
    match scheme {
        "https" => true,
        "http" => {
            let host = match host.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or(""),
                None => host.rsplit_once(':').map_or(host, |(h, _)| h),
            };
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}

/// The `[upstream.NAME]` tables, checked.
fn upstream(c: &AppConfig, fail: &Fail) -> Result<BTreeMap<String, UpstreamSettings>, ConfigError> {
    let mut out = BTreeMap::new();
    for (name, u) in &c.upstream {
        let key = |k: &str| format!("upstream.{name}.{k}");
        if !python_name(name) {
            return Err(fail.at(
                &format!("upstream.{}", shown(name)),
                "the server's name must be a Python identifier (letters, digits and '_', starting with a letter, at most 64, not a keyword): code imports it as `from upstream import NAME`",
            ));
        }
        let transport = match (u.url.trim(), u.command.trim()) {
            (url, "") if !url.is_empty() => {
                if !upstream_url_ok(url) {
                    return Err(fail.at(
                        &key("url"),
                        format!(
                            "\"{}\" must be an https:// URL, or http:// to a loopback address",
                            shown(url)
                        ),
                    ));
                }
                if !u.args.is_empty() || !u.env.is_empty() {
                    return Err(fail.at(&key("args"), "args and env go with command, not url"));
                }
                for name in u.headers.keys() {
                    let token = !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                    if !token {
                        return Err(fail.at(
                            &key("headers"),
                            format!("\"{}\" is not an HTTP header name", shown(name)),
                        ));
                    }
                }
                UpstreamTransport::Http {
                    url: url.to_string(),
                    headers: u.headers.clone(),
                }
            }
            ("", command) if !command.is_empty() => {
                if !u.headers.is_empty() {
                    return Err(fail.at(
                        &key("headers"),
                        "headers go with url, not command (a stdio server takes env)",
                    ));
                }
                UpstreamTransport::Stdio {
                    command: command.to_string(),
                    args: u.args.clone(),
                    env: u.env.clone(),
                }
            }
            _ => {
                return Err(fail.at(
                    &format!("upstream.{name}"),
                    "exactly one of url (Streamable HTTP) and command (stdio) must be set",
                ));
            }
        };
        for (k, value, range) in [
            (
                "max_calls_per_execution",
                u.max_calls_per_execution,
                1..=100_000,
            ),
            ("max_concurrent_calls", u.max_concurrent_calls, 1..=1024),
            ("timeout_ms", u.timeout_ms, 1..=3_600_000),
            ("max_result_kb", u.max_result_kb, 1..=65_536),
        ] {
            if !range.contains(&value) {
                return Err(fail.at(
                    &key(k),
                    format!("{value} is outside {}..={}", range.start(), range.end()),
                ));
            }
        }
        out.insert(
            name.clone(),
            UpstreamSettings {
                transport,
                tools: u.tools.clone(),
                deny_tools: u.deny_tools.clone(),
                max_calls_per_execution: u.max_calls_per_execution as u32,
                max_concurrent_calls: u.max_concurrent_calls as u32,
                timeout: Duration::from_millis(u.timeout_ms),
                max_result_bytes: (u.max_result_kb * 1024) as usize,
            },
        );
    }
    Ok(out)
}

/// Methods a grant may allow (those a sandbox may use at all).
const GRANT_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

/// Whether `host` names a host as a grant may: a DNS name of letters, digits, '-' and '.' (with an
/// optional leading "*."), or an IP address.
fn grant_host_ok(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Headers a grant may not inject: those the transport manages.
const UNINJECTABLE: [&str; 8] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
];

/// The `[[network.hosts]]` grants, checked.
fn host_grants(c: &AppConfig, fail: &Fail) -> Result<Vec<HostGrant>, ConfigError> {
    let mut out = Vec::new();
    for (i, g) in c.network.hosts.iter().enumerate() {
        let key = |k: &str| format!("network.hosts[{i}].{k}");
        let host = g.host.trim().trim_end_matches('.').to_ascii_lowercase();
        if !grant_host_ok(&host) {
            return Err(fail.at(
                &key("host"),
                format!(
                    "\"{}\" must be a host name, \"*.\" and a domain, or an IP address",
                    shown(&g.host)
                ),
            ));
        }
        let mut methods = Vec::new();
        for m in &g.methods {
            let upper = m.trim().to_ascii_uppercase();
            if !GRANT_METHODS.contains(&upper.as_str()) {
                return Err(fail.at(
                    &key("methods"),
                    format!(
                        "\"{}\" is not one of {}",
                        shown(m),
                        GRANT_METHODS.join(", ")
                    ),
                ));
            }
            methods.push(upper);
        }
        if methods.is_empty() {
            return Err(fail.at(&key("methods"), "at least one method"));
        }
        if g.paths.is_empty() || g.paths.iter().any(|p| !p.starts_with('/')) {
            return Err(fail.at(
                &key("paths"),
                "one or more path prefixes, each starting with /",
            ));
        }
        for name in g.inject_headers.keys() {
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token || UNINJECTABLE.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(fail.at(
                    &key("inject_headers"),
                    format!("\"{}\" cannot be injected", shown(name)),
                ));
            }
        }
        if !(1..=100).contains(&g.max_response_mb) {
            return Err(fail.at(
                &key("max_response_mb"),
                format!("{} is outside 1..=100", g.max_response_mb),
            ));
        }
        out.push(HostGrant {
            host,
            methods,
            paths: g.paths.clone(),
            inject_headers: g.inject_headers.clone(),
            max_response_bytes: (g.max_response_mb as usize) << 20,
            allow_private_addresses: g.allow_private_addresses,
        });
    }
    Ok(out)
}

/// Where `/metrics` listens, when enabled: an IP address and a port apart from `bind_addr`'s.
fn prometheus(
    c: &AppConfig,
    fail: &Fail,
    bind: SocketAddr,
    sources: &BTreeMap<String, Source>,
) -> Result<Option<SocketAddr>, ConfigError> {
    let p = &c.integrations.prometheus;
    if !p.enabled {
        return Ok(None);
    }
    let ip: IpAddr = p.host.parse().map_err(|_| {
        fail.at(
            "integrations.prometheus.host",
            format!(
                "{:?} must be an IPv4 or IPv6 address such as 127.0.0.1 or ::1",
                p.host
            ),
        )
    })?;
    let port = u16::try_from(p.port)
        .ok()
        .filter(|port| *port > 0)
        .ok_or_else(|| {
            fail.at(
                "integrations.prometheus.port",
                format!("{} is outside 1..=65535", p.port),
            )
        })?;
    if port == bind.port() {
        return Err(fail.at(
            "integrations.prometheus.port",
            format!(
                "{} must differ from bind_addr's port ({}, {})",
                p.port,
                bind.port(),
                source_of(sources, "bind_addr")
            ),
        ));
    }
    Ok(Some(SocketAddr::new(ip, port)))
}

/// A `[quotas]` count as a limit: 0 is none.
fn limit(n: u64) -> Option<u32> {
    u32::try_from(n).ok().filter(|&n| n > 0)
}

/// `[[quotas.overrides]]`, checked: each names whom it is for, and its values are in range.
fn quota_overrides(c: &AppConfig, fail: &Fail) -> Result<Vec<QuotaOverride>, ConfigError> {
    let key = "quotas.overrides";
    c.quotas
        .overrides
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let at = |what: &str| format!("{key}[{i}].{what}");
            let applies_to = match (o.name.is_empty(), o.claim.is_empty()) {
                (false, true) if o.value.is_empty() => Applies::Name(o.name.clone()),
                (true, false) if !o.value.is_empty() => Applies::Claim {
                    claim: o.claim.clone(),
                    value: o.value.clone(),
                },
                _ => {
                    return Err(fail.at(
                        &at("name"),
                        "set either name, or claim and value (and not both)",
                    ));
                }
            };
            for (name, value) in [
                ("max_concurrent_calls", o.max_concurrent_calls),
                ("cpu_seconds_per_minute", o.cpu_seconds_per_minute),
                ("max_tasks", o.max_tasks),
                ("max_queued_calls", o.max_queued_calls),
                ("max_sessions", o.max_sessions),
                ("weight", o.weight),
            ] {
                let range = RANGES
                    .iter()
                    .find(|r| r.key.strip_prefix("quotas.") == Some(name))
                    .map(|r| r.allowed.clone());
                if let (Some(value), Some(allowed)) = (value, range)
                    && !allowed.contains(&value)
                {
                    return Err(fail.at(
                        &at(name),
                        format!("{value} is outside {}..={}", allowed.start(), allowed.end()),
                    ));
                }
            }
            Ok(QuotaOverride {
                applies_to,
                max_concurrent_calls: o.max_concurrent_calls.map(limit),
                cpu_seconds_per_minute: o.cpu_seconds_per_minute.map(limit),
                max_tasks: o.max_tasks.map(limit),
                max_queued_calls: o.max_queued_calls.map(limit),
                max_sessions: o.max_sessions.map(limit),
                weight: o.weight.map(|w| w as u32),
            })
        })
        .collect()
}

/// `[integrations.opentelemetry]`, checked: `None` when off.
fn traces(c: &AppConfig, fail: &Fail) -> Result<Option<TraceSettings>, ConfigError> {
    let o = &c.integrations.opentelemetry;
    if !o.enabled {
        return Ok(None);
    }
    let host = ["http://", "https://"]
        .iter()
        .find_map(|scheme| o.endpoint.strip_prefix(scheme))
        .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or(""));
    if host.is_none_or(|h| h.is_empty() || h.contains(['@', ' '])) {
        return Err(fail.at(
            "integrations.opentelemetry.endpoint",
            format!(
                "\"{}\" must be an http or https URL such as http://127.0.0.1:4318/v1/traces",
                shown(&o.endpoint)
            ),
        ));
    }
    if o.max_batch_spans > o.max_queue_spans {
        return Err(fail.at(
            "integrations.opentelemetry.max_batch_spans",
            format!(
                "{} must not exceed integrations.opentelemetry.max_queue_spans ({})",
                o.max_batch_spans, o.max_queue_spans
            ),
        ));
    }
    if o.service_name.trim().is_empty() {
        return Err(fail.at(
            "integrations.opentelemetry.service_name",
            "must not be empty",
        ));
    }
    for name in o.headers.keys() {
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(fail.at(
                "integrations.opentelemetry.headers",
                format!("\"{}\" is not an HTTP header name", shown(name)),
            ));
        }
    }
    let headers = crate::secret::resolve_all("integrations.opentelemetry.headers", &o.headers)
        .map_err(|e| fail.at("integrations.opentelemetry.headers", e))?;
    Ok(Some(TraceSettings {
        endpoint: o.endpoint.clone(),
        headers,
        service_name: o.service_name.clone(),
        sample_ratio: o.sample_percent as f64 / 100.0,
        max_queue_spans: o.max_queue_spans as usize,
        max_batch_spans: o.max_batch_spans as usize,
        export_interval: Duration::from_millis(o.export_interval_ms),
        export_timeout: Duration::from_millis(o.export_timeout_ms),
        principal_attribute: o.principal_attribute,
    }))
}

fn nonempty_path(text: &str) -> Option<PathBuf> {
    (!text.is_empty()).then(|| PathBuf::from(text))
}

/// The settings of a configuration that passed every check.
fn settings(
    c: &AppConfig,
    bind_addr: SocketAddr,
    prometheus: Option<SocketAddr>,
    tokio_worker_threads: Option<usize>,
) -> Settings {
    let w = &c.workers;
    let s = &c.sessions;
    Settings {
        log_format: c.log_format,
        tokio_worker_threads,
        replica_id: c.replica_id.clone(),
        http: HttpSettings {
            bind_addr,
            allowed_hosts: (!c.skip_host_header_verification).then(|| {
                c.http_allowed_hosts
                    .iter()
                    .map(|h| h.trim().to_string())
                    .collect()
            }),
            allowed_origins: c.http_allowed_origins.clone(),
            bearer_tokens_file: nonempty_path(&c.auth.bearer_tokens_file),
            named_tokens: c.auth.named_tokens,
            input_limits: InputLimits {
                max_file_kb: c.input_limits.max_file_kb,
                max_total_file_kb: c.input_limits.max_total_file_kb,
            },
            oauth: None,
        },
        engine: EngineSettings {
            asset_dir: nonempty_path(&c.asset_dir),
            allowed_hosts: c.allowed_hosts.clone(),
            package_base_url: (!c.package_base_url.is_empty()).then(|| c.package_base_url.clone()),
            package_cache_dir: PathBuf::from(&c.package_cache_dir),
            preinstall_packages: c.preinstall_packages.clone(),
            preimport_modules: c.preimport_modules.clone(),
            preimport_preinstalled: c.preimport_preinstalled,
            package_index_urls: c.package_index_urls.clone(),
            extra_ca_certs: c.extra_ca_certs.iter().map(PathBuf::from).collect(),
            host_grants: Vec::new(),
            runtime_package_installation: c.runtime_package_installation,
            boot: w.boot,
            map_snapshot_memory: w.map_snapshot_memory,
            give_back_idle_memory: w.idle_give_back_s > 0,
            memory_limit_mb: w.memory_limit_mb,
            wasm_memory_limit_mb: w.wasm_memory_limit_mb,
            sandbox_memory_limit_mb: w.sandbox_memory_limit_mb,
            setup_timeout: Duration::from_secs(w.setup_timeout_s),
            table_rows: c.results.max_table_rows,
            table_columns: c.results.max_table_columns,
            figure_plotly_js: c.results.figure_plotly_js.clone(),
        },
        workers: WorkerSettings {
            max_workers: w.max_workers as usize,
            queue_capacity: w.queue_capacity as usize,
            prewarmed_workers: w.prewarmed() as usize,
            ready_sandboxes: w.ready_sandboxes as usize,
            ready_preimported_sandboxes: w.ready_preimported_sandboxes as usize,
            idle_give_back: (w.idle_give_back_s > 0)
                .then(|| Duration::from_secs(w.idle_give_back_s)),
        },
        sessions: s.enabled.then(|| SessionSettings {
            max_sessions: s.max_sessions as usize,
            max_resident: s.max_resident as usize,
            spill_after: (s.spill_after_s > 0).then(|| Duration::from_secs(s.spill_after_s)),
            store_url: s.store_url.trim().to_string(),
            queue_capacity: s.queue_capacity as usize,
            idle_timeout: Duration::from_secs(s.idle_timeout_s),
            max_lifetime: Duration::from_secs(s.max_lifetime_s),
            max_per_principal: (c.quotas.max_sessions > 0)
                .then_some(c.quotas.max_sessions as usize),
        }),
        tasks: c.tasks.enabled.then(|| TaskSettings {
            max_running: match c.tasks.max_running {
                0 => (w.max_workers as usize).saturating_sub(1).max(1),
                n => n as usize,
            },
            queue_capacity: c.tasks.queue_capacity as usize,
            ttl: Duration::from_secs(c.tasks.ttl_s),
            max_timeout_ms: c.tasks.max_timeout_ms,
            immediate_result: Duration::from_millis(c.tasks.immediate_result_ms),
        }),
        snippets: c.code_snippets.enabled.then(|| SnippetSettings {
            catalog: c.code_snippets.clone(),
            min_hits: c.search.min_hits as usize,
        }),
        max_inline_image_bytes: c.results.max_inline_image_kb * 1024,
        max_text_chars: c.results.max_text_chars as usize,
        structured_content: c.results.structured_content,
        apps: c.results.apps.then(|| AppsSettings {
            asset_dir: (!c.results.apps_asset_dir.is_empty())
                .then(|| PathBuf::from(&c.results.apps_asset_dir)),
            grid_rows: c.results.max_table_rows_app as u32,
        }),
        prometheus,
        traces: None,
        upstream: BTreeMap::new(),
        quotas: QuotaPolicy {
            base: QuotaSettings {
                max_concurrent_calls: limit(c.quotas.max_concurrent_calls),
                cpu_seconds_per_minute: limit(c.quotas.cpu_seconds_per_minute),
                max_tasks: limit(c.quotas.max_tasks),
                max_queued_calls: limit(c.quotas.max_queued_calls),
                max_sessions: limit(c.quotas.max_sessions),
                weight: c.quotas.weight as u32,
            },
            overrides: Vec::new(),
        },
        principal_metric_label: c.integrations.prometheus.principal_label,
    }
}

impl Default for Settings {
    /// The settings of the default configuration.
    fn default() -> Self {
        validate(
            &crate::AppConfig::default(),
            &std::collections::BTreeMap::new(),
            None,
        )
        .expect("the default configuration is valid")
    }
}
