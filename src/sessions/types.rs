//! What the session manager answers and is asked with: its errors, a call's result, who calls, and
//! a session's file listing.

use crate::sandbox::ExecResult;

/// Which of a call's long outputs the session keeps as files under /workspace, so that a result
/// whose text is cut for a model can say where the whole is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepOutputs {
    /// The files' path stem relative to /workspace, e.g. `.outputs/20261203-044501-3f9a`: the
    /// streams go to `{stem}-stdout.txt` and `{stem}-stderr.txt`.
    pub stem: String,
    /// A stream longer than this many characters is kept.
    pub stdout_over: usize,
    pub stderr_over: usize,
}

/// A session call's result, the files it kept of its long outputs, and whether the session can
/// be saved now.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRun {
    pub result: ExecResult,
    /// Paths (relative to /workspace) of the whole stdout and stderr, when they were kept.
    pub kept_stdout: Option<String>,
    pub kept_stderr: Option<String>,
    /// Why the session cannot be saved to the store (spilled, resumed elsewhere, kept through a
    /// restart), as of the end of this call; `None`: it can.
    pub unsaveable: Option<String>,
    /// When the code started and ended on the session's thread.
    pub ran: (std::time::Instant, std::time::Instant),
}

/// Who a request was authenticated as (put into the request's extensions by the transport): a
/// static bearer token's SHA-256 digest, or an OAuth token's issuer and subject hashed
/// (`transport::oauth::principal`). A session created by a principal answers only to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Principal(pub [u8; 32]);

impl Principal {
    /// A short, stable label for logs: neither the token nor the subject, and not the digest that
    /// stands for them in session records either (`p-` and 12 hex digits of a hash of it).
    pub fn label(&self) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest([b"label".as_slice(), &self.0].concat());
        format!("p-{}", hex::encode(&digest[..6]))
    }
}

/// Who makes a session call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client, for listing its sessions' resources (a legacy-era MCP session, or stdio).
    pub client: Option<String>,
    /// The principal, when the server requires authentication.
    pub principal: Option<Principal>,
    /// Its name and quotas, resolved when it was authenticated (`None`: no authentication; the
    /// server's own quotas apply).
    pub profile: Option<std::sync::Arc<Profile>>,
}

/// What authentication found out about a principal besides its id: its name and its quotas
/// (`[quotas]` with the first override that matches applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// A named static token's name (`auth.named_tokens`): logs and the metric label show it.
    pub name: Option<std::sync::Arc<str>>,
    pub kind: PrincipalKind,
    pub limits: crate::config::QuotaSettings,
}

/// How a principal was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalKind {
    /// A static bearer token.
    Token,
    /// An OAuth access token.
    OAuth,
}

impl Profile {
    /// Its value of the `principal` metric label: its name, else how it was authenticated (a
    /// bounded set: names come only from the operator's token file).
    pub fn metric_label(&self) -> &str {
        match (&self.name, self.kind) {
            (Some(name), _) => name,
            (None, PrincipalKind::Token) => "token",
            (None, PrincipalKind::OAuth) => "oauth",
        }
    }
}

/// Why a session call could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error(
        "session {0} does not exist or has expired; pass session_id = \"new\" to start a fresh session"
    )]
    NotFound(String),
    #[error("session {id} has ended: {reason}; pass session_id = \"new\" to start a fresh session")]
    Ended { id: String, reason: String },
    #[error(
        "session {id} was created by replica {owner}, and this is {here}: a session lives on the replica that created it (route session calls by the Mcp-Param-Session-Id header; see deploy/nginx), or it has ended; pass session_id = \"new\" to start a fresh session"
    )]
    OtherReplica {
        id: String,
        owner: String,
        here: String,
    },
    #[error(
        "no more sessions can be created: {live} are live, the limit sessions.max_sessions = {max}; clear one (clear_session) or retry later"
    )]
    TooMany { live: usize, max: usize },
    #[error(
        "this principal holds {held} sessions on this server (quotas.max_sessions = {max}); clear one (clear_session) or let one expire"
    )]
    TooManyOwned { held: usize, max: usize },
    #[error(
        "session {id} is busy: {waiting} calls are queued or running in it (sessions.queue_capacity = {capacity} may wait behind the running one); retry when it has finished"
    )]
    Busy {
        id: String,
        waiting: usize,
        capacity: usize,
    },
    #[error(
        "no more sessions can be in memory: {max} are (sessions.max_resident) and none of them can be saved to the store now; clear one (clear_session) or retry later"
    )]
    TooManyResident { max: usize },
    #[error(
        "session {id} is running on another replica now (it holds the session's lease for up to {expires_in_s} s more); retry shortly, or route the call by the Mcp-Param-Session-Id header"
    )]
    Elsewhere { id: String, expires_in_s: u64 },
    #[error(
        "session {id} is saved in the session store, which cannot be reached now ({reason}); retry later"
    )]
    StoreUnavailable { id: String, reason: String },
    #[error(
        "session {id} cannot be restored: {reason}; pass session_id = \"new\" to start a fresh session"
    )]
    Unrestorable { id: String, reason: String },
    #[error("session {id} cannot be copied: {reason}")]
    NotDurable { id: String, reason: String },
    #[error("the session could not start: {0}")]
    Boot(String),
    #[error(
        "the server is shutting down: its sessions have ended and it accepts no session calls; pass session_id = \"new\" to start a fresh session (on another replica)"
    )]
    ShuttingDown,
}

/// One file of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFile {
    pub path: String,
    pub size: u64,
}

/// A session's files, at most `MAX_LISTED_FILES`, and what the listing left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFiles {
    pub files: Vec<SessionFile>,
    /// Files left out (past the cap, or with paths over the path limit); with `truncated`, at least
    /// this many.
    pub left_out: u64,
    /// The listing stopped at its cap.
    pub truncated: bool,
}
