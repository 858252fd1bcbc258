//! Legacy-era MCP sessions (protocols up to 2025-11-25) whose `Mcp-Session-Id` names this replica:
//! rmcp's in-memory session manager, except that ids start with `replica_id` and a dot, so a load
//! balancer can send every request of an MCP session to the replica that holds it (the same prefix
//! as the tool sessions' ids; see deploy/nginx). Without a replica id the ids are rmcp's own.

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

/// [`LocalSessionManager`] minting replica-prefixed ids.
#[derive(Default)]
pub struct ReplicaSessionManager {
    /// `replica_id`, or empty.
    replica: String,
    inner: LocalSessionManager,
}

impl ReplicaSessionManager {
    pub fn new(replica_id: &str) -> Self {
        Self {
            replica: replica_id.to_string(),
            inner: LocalSessionManager::default(),
        }
    }
}

impl ReplicaSessionManager {
    /// How many MCP sessions are open.
    pub async fn open(&self) -> usize {
        self.inner.sessions.read().await.len()
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
