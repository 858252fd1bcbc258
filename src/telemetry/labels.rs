//! The fixed label values of the metrics (src/telemetry/mod.rs records them): each set an enum with
//! its `label()` and `ALL`, so that every series can be registered up front and no label ever takes a
//! value from outside these lists.

/// The tools, as the `tool` label names them.
pub const TOOLS: [&str; 7] = [
    "run_python_code",
    "list_code_snippets",
    "get_code_snippet",
    "list_session_files",
    "clear_session",
    "fork_session",
    "list_upstream_tools",
];
/// A fixed set of label values: an enum, its `label()` and `ALL` (for registering every series).
macro_rules! labels {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label),+
                }
            }
        }
    };
}

labels! {
    /// How one execution in a sandbox ended (the `python_execution_duration_seconds` outcome).
    ExecutionOutcome {
        Success => "success",
        PythonError => "python_error",
        Timeout => "timeout",
        Cancelled => "cancelled",
        RuntimeFailure => "runtime_failure",
    }
}

labels! {
    /// How a tool call ended: an execution's outcome, or a refusal before one.
    ToolOutcome {
        Success => "success",
        ValidationError => "validation_error",
        Overload => "overload",
        PythonError => "python_error",
        Timeout => "timeout",
        Cancelled => "cancelled",
        RuntimeFailure => "runtime_failure",
    }
}

impl From<ExecutionOutcome> for ToolOutcome {
    fn from(outcome: ExecutionOutcome) -> Self {
        match outcome {
            ExecutionOutcome::Success => ToolOutcome::Success,
            ExecutionOutcome::PythonError => ToolOutcome::PythonError,
            ExecutionOutcome::Timeout => ToolOutcome::Timeout,
            ExecutionOutcome::Cancelled => ToolOutcome::Cancelled,
            ExecutionOutcome::RuntimeFailure => ToolOutcome::RuntimeFailure,
        }
    }
}

labels! {
    /// How a job left the queue.
    QueueExit {
        Dispatched => "dispatched",
        Cancelled => "cancelled",
        Shutdown => "shutdown",
    }
}

labels! {
    /// A worker's state.
    WorkerState {
        Idle => "idle",
        Initializing => "initializing",
        Executing => "executing",
    }
}

labels! {
    /// Why an isolate was initialised.
    InitPhase {
        Startup => "startup",
        OnDemand => "on_demand",
        Replenishment => "replenishment",
    }
}

labels! {
    /// Why a session ended.
    SessionEnd {
        Cleared => "cleared",
        Idle => "idle",
        Lifetime => "lifetime",
        Limit => "limit",
        Error => "error",
        Shutdown => "shutdown",
    }
}

labels! {
    /// How a session's save (a spill, or at shutdown) ended.
    SaveOutcome {
        Saved => "saved",
        /// The session holds what an image cannot carry.
        Refused => "refused",
        /// The store failed (down, full, denied).
        StoreFailed => "store_failed",
    }
}

labels! {
    /// How a session's resume from the store ended.
    ResumeOutcome {
        Resumed => "resumed",
        /// Another replica holds its lease.
        Held => "held",
        /// Its image was refused (damaged, tampered with, another build's).
        Unrestorable => "unrestorable",
        StoreFailed => "store_failed",
        /// The sandbox did not boot from the image.
        BootFailed => "boot_failed",
    }
}

labels! {
    /// How a task ended.
    TaskEnd {
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}

labels! {
    /// Why a submission was rejected.
    Rejection {
        Validation => "validation",
        QueueFull => "queue_full",
        Shutdown => "shutdown",
        Quota => "quota",
    }
}

labels! {
    /// Why a /mcp request was refused by authentication or authorization (`no_keys` and
    /// `introspection_failed` answer 503: the token could not be checked).
    AuthRefusal {
        NoToken => "no_token",
        TooLong => "too_long",
        UnknownToken => "unknown_token",
        Malformed => "malformed",
        Type => "type",
        Critical => "critical",
        Algorithm => "algorithm",
        UnknownKey => "unknown_key",
        Signature => "signature",
        Expired => "expired",
        NotYetValid => "not_yet_valid",
        Issuer => "issuer",
        Audience => "audience",
        Claims => "claims",
        NoKeys => "no_keys",
        Inactive => "inactive",
        IntrospectionFailed => "introspection_failed",
        InsufficientScope => "insufficient_scope",
    }
}

labels! {
    /// How a fetch of the authorization server's metadata and keys ended.
    KeysFetch {
        Loaded => "loaded",
        Failed => "failed",
    }
}

labels! {
    /// How a call from the sandbox to an upstream MCP server's tool ended.
    UpstreamOutcome {
        Ok => "ok",
        ToolError => "tool_error",
        Denied => "denied",
        InvalidArguments => "invalid_arguments",
        Budget => "budget",
        Timeout => "timeout",
        Cancelled => "cancelled",
        TooLarge => "too_large",
        Unavailable => "unavailable",
        Error => "error",
    }
}
