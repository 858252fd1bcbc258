//! What the session manager answers: its errors and a session's file listing.

/// Why a session call could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error(
        "session {0} does not exist or has expired; pass session_id = \"new\" to start a fresh session"
    )]
    NotFound(String),
    #[error("session {id} has ended: {reason}; pass session_id = \"new\" to start a fresh session")]
    Ended { id: String, reason: &'static str },
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
        "session {id} is busy: {waiting} calls are queued or running in it (sessions.queue_capacity = {capacity} may wait behind the running one); retry when it has finished"
    )]
    Busy {
        id: String,
        waiting: usize,
        capacity: usize,
    },
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
