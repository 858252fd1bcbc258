//! Legacy-era MCP sessions (protocols up to 2025-11-25) whose `Mcp-Session-Id` names this replica:
//! rmcp's in-memory session manager, except that ids start with `replica_id` and a dot, so a load
//! balancer can send every request of an MCP session to the replica that holds it (the same prefix
//! as the tool sessions' ids; see deploy/nginx). Without a replica id the ids are rmcp's own.
//! With authentication, an MCP session belongs to the principal that opened it: another principal
//! presenting its id is told the session does not exist ([`ReplicaSessionManager::owned_by`]).

use std::collections::HashMap;
use std::sync::Mutex;

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionError,
    create_local_session,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};

use crate::sessions::Principal;

/// Legacy-era MCP sessions open at once at most (each ends 5 minutes after its last request);
/// `requests.rs` refuses a new one past it.
pub const MAX_MCP_SESSIONS: usize = 4096;

/// [`LocalSessionManager`] minting replica-prefixed ids.
#[derive(Default)]
pub struct ReplicaSessionManager {
    /// `replica_id`, or empty.
    replica: String,
    inner: LocalSessionManager,
    /// The principal that opened each MCP session (with authentication only).
    owners: Mutex<HashMap<String, Principal>>,
}

impl ReplicaSessionManager {
    pub fn new(replica_id: &str) -> Self {
        Self {
            replica: replica_id.to_string(),
            ..Self::default()
        }
    }
}

impl ReplicaSessionManager {
    /// How many MCP sessions are open.
    pub async fn open(&self) -> usize {
        self.inner.sessions.read().await.len()
    }

    /// Records that `principal` opened the MCP session `id`. Owners of sessions that have ended
    /// are forgotten once there are more owners than open sessions can account for.
    pub async fn bind(&self, id: &str, principal: Principal) {
        let over = {
            let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            owners.insert(id.to_string(), principal);
            owners.len() > MAX_MCP_SESSIONS
        };
        if over {
            let open: std::collections::HashSet<String> = self
                .inner
                .sessions
                .read()
                .await
                .keys()
                .map(|k| k.to_string())
                .collect();
            let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            owners.retain(|id, _| open.contains(id));
        }
    }

    /// Whether the MCP session `id` may be used by `principal`: it opened it, or nobody is known to
    /// have (no authentication, or an id this replica does not hold, which rmcp answers itself).
    pub fn owned_by(&self, id: &str, principal: Option<&Principal>) -> bool {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        match owners.get(id) {
            None => true,
            Some(owner) => principal == Some(owner),
        }
    }

    /// Forgets the owner of a closed session.
    pub fn unbind(&self, id: &str) {
        self.owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

impl SessionManager for ReplicaSessionManager {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        if self.replica.is_empty() {
            return self.inner.create_session().await;
        }
        let id: SessionId = crate::sessions::mint_id(&self.replica, 16)
            .map_err(|e| {
                LocalSessionManagerError::SessionError(SessionError::Io(std::io::Error::other(
                    e.to_string(),
                )))
            })?
            .into();
        let (handle, worker) = create_local_session(id.clone(), self.inner.session_config.clone());
        self.inner.sessions.write().await.insert(id.clone(), handle);
        Ok((id, WorkerTransport::spawn(worker)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }
}
