//! A stdio upstream: the server's process, started with only `PATH`, `HOME` and its configured
//! environment (never this process's credentials), in a process group of its own that dies with it
//! (npx's grandchildren too), its standard error logged line by line at debug level, the server's
//! credentials redacted from it.

use std::process::Stdio;

use rmcp::service::ServiceExt;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::AsyncReadExt;

use std::sync::Arc;

use super::{Running, Watcher};
use crate::config::Secret;

/// The child and its group; killed when this is dropped.
pub(super) struct Child {
    child: tokio::process::Child,
}

impl Drop for Child {
    fn drop(&mut self) {
        // (`id()` is `None` once the child was reaped: its group id may be someone else's then.)
        if let Some(pid) = self.child.id()
            && let Ok(pid) = i32::try_from(pid)
        {
            // SAFETY: killpg takes plain integers; the group is the child's own (process_group(0)).
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
    }
}

/// Longest line of the child's standard error that is logged whole.
const STDERR_LINE: usize = 2048;

/// Starts `command` and says `initialize` to it as `watcher`; lines the server writes longer than
/// `max_line_bytes` are dropped (that call then times out). Its standard error is logged without
/// `needles` (its credentials).
pub(super) async fn connect(
    watcher: Watcher,
    command: &str,
    args: &[String],
    env: &[(String, Secret)],
    max_line_bytes: usize,
    needles: Arc<[String]>,
) -> Result<(Running, Child), String> {
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args).env_clear();
    for key in ["PATH", "HOME"] {
        if let Some(value) = std::env::var_os(key) {
            cmd.env(key, value);
        }
    }
    for (key, value) in env {
        cmd.env(key, value.expose());
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {command}: {e}"))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("the child's pipes are missing".into());
    };
    let child = Child { child };
    tokio::spawn(log_stderr(watcher.name(), stderr, needles));
    let transport =
        AsyncRwTransport::new_client(stdout, stdin).with_max_line_length(max_line_bytes);
    let running = watcher
        .serve(transport)
        .await
        .map_err(|e| format!("the server did not complete the MCP initialization: {e}"))?;
    Ok((running, child))
}

/// The child's standard error as debug lines (bounded: a line without an end is logged in pieces),
/// `needles` redacted.
async fn log_stderr(name: String, mut stderr: tokio::process::ChildStderr, needles: Arc<[String]>) {
    let mut pending = Vec::with_capacity(STDERR_LINE);
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &b in &chunk[..n] {
            if b == b'\n' || pending.len() >= STDERR_LINE {
                tracing::debug!(upstream = %name, line = %redacted(&pending, &needles), "upstream stderr");
                pending.clear();
                if b == b'\n' {
                    continue;
                }
            }
            pending.push(b);
        }
    }
    if !pending.is_empty() {
        tracing::debug!(upstream = %name, line = %redacted(&pending, &needles), "upstream stderr");
    }
}

/// `line` as text, each of `needles` replaced by `[redacted]`. (A credential cut across two pieces
/// of an overlong line is not recognised; such a line is not a log line anyway.)
fn redacted(line: &[u8], needles: &[String]) -> String {
    let mut text = String::from_utf8_lossy(line).into_owned();
    for needle in needles {
        if text.contains(needle.as_str()) {
            text = text.replace(needle.as_str(), "[redacted]");
        }
    }
    text
}
