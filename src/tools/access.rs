//! What an OAuth access token's scopes allow. Each request needs the scopes of what it does
//! (`auth.oauth.scope_*`): running code (tools, tasks), reading sessions (list_session_files,
//! `session://` resources), changing them (a call naming a session, clear_session, fork_session;
//! it implies reading). The transport checks a request before rmcp reads it and answers 403
//! `insufficient_scope` naming every scope the request needs; `tools/list` shows a principal only
//! the tools its scopes allow, and a tool call is checked again here. Static tokens and servers
//! without authentication carry no [`Access`]: they may do everything.

use std::sync::Arc;

use code_interpreter_mcp_config::OAuthScopes;

/// An OAuth principal's granted scopes, and the names the configuration gives each kind of
/// request. The transport puts it in the request's extensions.
#[derive(Debug, Clone)]
pub struct Access {
    granted: Arc<[String]>,
    names: Arc<OAuthScopes>,
}

/// What a request does, as far as scopes go.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked<'a> {
    pub method: &'a str,
    /// The tool of a `tools/call`.
    pub tool: Option<&'a str>,
    /// Whether a `tools/call` names a session (`session_id` given and not null).
    pub session: bool,
    /// The URI of a `resources/read`.
    pub uri: Option<&'a str>,
}

impl Access {
    pub fn new(granted: Vec<String>, names: Arc<OAuthScopes>) -> Self {
        Self {
            granted: granted.into(),
            names,
        }
    }

    /// Whether the token holds `scope` (holding the write scope implies the read one).
    fn holds(&self, scope: &str) -> bool {
        self.granted.iter().any(|g| g == scope)
            || (scope == self.names.sessions_read
                && self.granted.iter().any(|g| *g == self.names.sessions_write))
    }

    /// The scopes `asked` needs, when the token lacks one of them: all of them, so one challenge
    /// names everything (MCP authorization, scope challenge handling).
    pub fn lacks(&self, asked: &Asked<'_>) -> Option<Vec<String>> {
        let needed = needed(&self.names, asked);
        needed
            .iter()
            .any(|s| !self.holds(s))
            .then(|| needed.into_iter().map(str::to_string).collect())
    }

    /// The scopes needed by a request that could not be read: every one (fails closed).
    pub fn lacks_any(&self) -> Option<Vec<String>> {
        let all = [
            &self.names.run,
            &self.names.sessions_read,
            &self.names.sessions_write,
        ];
        let all: Vec<String> = all.into_iter().filter(|s| !s.is_empty()).cloned().collect();
        all.iter().any(|s| !self.holds(s)).then_some(all)
    }
}

/// The scopes a request needs, by what it does; methods that touch nothing of a principal's
/// (initialize, ping, the lists) need none.
pub fn needed<'n>(names: &'n OAuthScopes, asked: &Asked<'_>) -> Vec<&'n str> {
    let run = names.run.as_str();
    let (read, write) = (names.sessions_read.as_str(), names.sessions_write.as_str());
    let mut needed = match (asked.method, asked.tool) {
        ("tools/call", Some("list_session_files")) => vec![read],
        ("tools/call", Some("clear_session" | "fork_session")) => vec![write],
        ("tools/call", _) if asked.session => vec![run, write],
        ("tools/call", _) => vec![run],
        ("resources/read", _) if asked.uri.is_some_and(|u| u.starts_with("session://")) => {
            vec![read]
        }
        (method, _) if method.starts_with("tasks/") => vec![run],
        _ => Vec::new(),
    };
    needed.retain(|s| !s.is_empty());
    needed.dedup();
    needed
}

/// Every scope the configuration names, for the protected-resource metadata.
pub fn supported(names: &OAuthScopes) -> Vec<String> {
    let mut all: Vec<String> = [&names.run, &names.sessions_read, &names.sessions_write]
        .into_iter()
        .filter(|s| !s.is_empty())
        .cloned()
        .collect();
    all.dedup();
    all
}

/// The OAuth scopes of the request's principal, when it has them (none: static token or no auth).
pub(super) fn of(context: &rmcp::service::RequestContext<rmcp::RoleServer>) -> Option<Access> {
    context
        .extensions
        .get::<axum::http::request::Parts>()?
        .extensions
        .get::<Access>()
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Arc<OAuthScopes> {
        Arc::new(OAuthScopes {
            run: "code:run".into(),
            sessions_read: "sessions:read".into(),
            sessions_write: "sessions:write".into(),
        })
    }

    fn call(tool: &'static str, session: bool) -> Asked<'static> {
        Asked {
            method: "tools/call",
            tool: Some(tool),
            session,
            uri: None,
        }
    }

    #[test]
    fn each_request_needs_the_scopes_of_what_it_does() {
        let only_run = Access::new(vec!["code:run".into()], names());
        assert_eq!(only_run.lacks(&call("run_python_code", false)), None);
        assert_eq!(
            only_run.lacks(&call("run_python_code", true)),
            Some(vec!["code:run".into(), "sessions:write".into()]),
            "a challenge names every scope the call needs"
        );
        assert!(only_run.lacks(&call("list_session_files", false)).is_some());
        assert!(only_run.lacks(&call("clear_session", false)).is_some());
        assert_eq!(
            only_run.lacks(&Asked {
                method: "tasks/get",
                ..Asked::default()
            }),
            None
        );
        assert_eq!(
            only_run.lacks(&Asked {
                method: "tools/list",
                ..Asked::default()
            }),
            None
        );
        let read = Asked {
            method: "resources/read",
            uri: Some("session://abc/files/x.csv"),
            ..Asked::default()
        };
        assert!(only_run.lacks(&read).is_some());
        let ui = Asked {
            method: "resources/read",
            uri: Some("ui://code-interpreter-mcp/result.html"),
            ..Asked::default()
        };
        assert_eq!(only_run.lacks(&ui), None);
        assert!(
            only_run.lacks_any().is_some(),
            "an unreadable request fails closed"
        );

        let writer = Access::new(vec!["code:run".into(), "sessions:write".into()], names());
        assert_eq!(writer.lacks(&call("run_python_code", true)), None);
        assert_eq!(writer.lacks(&read), None, "write implies read");
        assert_eq!(writer.lacks_any(), None);
        let reader = Access::new(vec!["sessions:read".into()], names());
        assert!(reader.lacks(&call("run_python_code", false)).is_some());
        assert_eq!(reader.lacks(&call("list_session_files", false)), None);
    }

    #[test]
    fn an_empty_scope_name_needs_nothing() {
        let names = Arc::new(OAuthScopes {
            run: String::new(),
            sessions_read: String::new(),
            sessions_write: "w".into(),
        });
        let none = Access::new(Vec::new(), names.clone());
        assert_eq!(none.lacks(&call("run_python_code", false)), None);
        assert_eq!(
            none.lacks(&call("run_python_code", true)),
            Some(vec!["w".into()])
        );
        assert_eq!(supported(&names), ["w"]);
    }
}
