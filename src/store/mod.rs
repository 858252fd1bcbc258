//! Where saved sessions live between processes: a directory (the default, under
//! `package_cache_dir`, so a restart on the same disk or volume finds them) or S3-compatible object
//! storage (`s3://bucket/prefix`, shared by replicas), through `object_store`. Each image is sealed
//! (see [`seal`]): stored under a hash of its session's id, encrypted with a key derived from it,
//! and refused unless it was made by this engine for that id; a lease ([`lease`]) says which
//! process runs a session. The store only moves sealed bytes; what an image holds is the sandbox's
//! business.

pub mod lease;
pub mod seal;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

pub use lease::{Held, Lease};
pub use seal::OpenError;

/// Milliseconds since the Unix epoch (image and lease times; a session's record).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The suffix of every image's object name.
const SUFFIX: &str = ".img";

/// A session store.
#[derive(Clone)]
pub struct Store {
    objects: Arc<dyn ObjectStore>,
    /// Where it is, for logs (a directory or `s3://bucket/prefix`; never credentials).
    location: String,
    /// The engine key images are made and accepted by.
    engine: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.location)
            .finish()
    }
}

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `sessions.store_url` names no usable store (a configuration error).
    #[error("sessions.store_url: {0}")]
    Url(String),
    /// The backend failed (I/O, network, permissions).
    #[error("the session store at {location} failed: {source}")]
    Backend {
        location: String,
        source: object_store::Error,
    },
    /// The stored image was refused.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The image could not be sealed.
    #[error("sealing the image failed: {0}")]
    Seal(String),
}

impl Store {
    /// The store `url` names: empty for the directory `default_dir`, an absolute path or
    /// `file:///path` for a directory (made if missing), `s3://bucket[/prefix]` for S3-compatible
    /// storage configured by the usual AWS environment variables (`AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP`, ...). `engine`: the key of the engine that makes and reads images.
    pub fn open(url: &str, default_dir: &Path, engine: &str) -> Result<Self, StoreError> {
        Self::open_with(url, default_dir, engine, &[])
    }

    /// [`Store::open`] with S3 options set over the environment's (`object_store`'s
    /// `AmazonS3ConfigKey` names, e.g. `aws_endpoint`, `aws_allow_http`).
    pub fn open_with(
        url: &str,
        default_dir: &Path,
        engine: &str,
        s3_options: &[(&str, &str)],
    ) -> Result<Self, StoreError> {
        let url = url.trim();
        let (objects, location): (Arc<dyn ObjectStore>, String) = if let Some(rest) =
            url.strip_prefix("s3://")
        {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::Url(format!("{url:?} names no bucket")));
            }
            // A store that does not answer fails the one save or load in well under a minute
            // (object_store's default retries for three).
            // (The client options first: setting them replaces any set before, `AWS_ALLOW_HTTP`
            // from the environment included.)
            let mut builder = AmazonS3Builder::new()
                .with_client_options(
                    ClientOptions::new()
                        .with_connect_timeout(Duration::from_secs(5))
                        .with_timeout(Duration::from_secs(120)),
                )
                .with_bucket_name(bucket)
                // Leases need a create that fails when the object exists (If-None-Match).
                .with_conditional_put(S3ConditionalPut::ETagMatch)
                .with_retry(RetryConfig {
                    max_retries: 3,
                    retry_timeout: Duration::from_secs(20),
                    ..RetryConfig::default()
                });
            // What `AmazonS3Builder::from_env` reads: every `AWS_*` variable it knows.
            for (key, value) in std::env::vars() {
                if key.starts_with("AWS_")
                    && let Ok(key) = key.to_ascii_lowercase().parse()
                {
                    builder = builder.with_config(key, value);
                }
            }
            for (key, value) in s3_options {
                let key = key
                    .parse()
                    .map_err(|e| StoreError::Url(format!("option {key}: {e}")))?;
                builder = builder.with_config(key, *value);
            }
            let s3 = builder
                .build()
                .map_err(|e| StoreError::Url(format!("{url:?}: {e}")))?;
            let prefix = prefix.trim_matches('/');
            let objects: Arc<dyn ObjectStore> = if prefix.is_empty() {
                Arc::new(s3)
            } else {
                let prefix = ObjectPath::parse(prefix)
                    .map_err(|e| StoreError::Url(format!("{url:?}: {e}")))?;
                Arc::new(PrefixStore::new(s3, prefix))
            };
            (objects, format!("s3://{bucket}/{prefix}"))
        } else {
            let dir = if url.is_empty() {
                default_dir.to_path_buf()
            } else if let Some(path) = url.strip_prefix("file://") {
                Path::new(path).to_path_buf()
            } else if url.contains("://") {
                return Err(StoreError::Url(format!(
                    "{url:?}: the store is a directory (an absolute path or file:///path) or s3://bucket/prefix"
                )));
            } else {
                Path::new(url).to_path_buf()
            };
            if !dir.is_absolute() {
                return Err(StoreError::Url(format!(
                    "{}: the directory must be an absolute path",
                    dir.display()
                )));
            }
            std::fs::create_dir_all(&dir)
                .map_err(|e| StoreError::Url(format!("{}: {e}", dir.display())))?;
            let local = LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| StoreError::Url(format!("{}: {e}", dir.display())))?;
            (Arc::new(local), dir.display().to_string())
        };
        Ok(Self {
            objects,
            location,
            engine: engine.to_string(),
        })
    }

    /// Where the store is (for logs).
    pub fn location(&self) -> &str {
        &self.location
    }

    fn path(id: &str) -> ObjectPath {
        ObjectPath::from(format!("{}{SUFFIX}", seal::name(id)))
    }

    fn backend(&self, source: object_store::Error) -> StoreError {
        StoreError::Backend {
            location: self.location.clone(),
            source,
        }
    }

    /// Seals `payload` as session `id`'s image and stores it (replacing an older one); the bytes
    /// stored.
    pub async fn save(&self, id: &str, payload: Vec<Bytes>) -> Result<u64, StoreError> {
        let created_ms = unix_ms();
        let (id_owned, engine) = (id.to_string(), self.engine.clone());
        let sealed = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let sealed = seal::seal(&id_owned, &engine, created_ms, &payload);
            tracing::debug!(
                ms = started.elapsed().as_secs_f64() * 1e3,
                "session image sealed"
            );
            sealed
        })
        .await
        .map_err(|e| StoreError::Seal(e.to_string()))?
        .map_err(StoreError::Seal)?;
        let bytes = sealed.len() as u64;
        self.objects
            .put(&Self::path(id), PutPayload::from(sealed))
            .await
            .map_err(|e| self.backend(e))?;
        Ok(bytes)
    }

    /// Session `id`'s image, if the store has one: opened (made by this engine for this id,
    /// intact, at most `max_plain` bytes).
    pub async fn load(&self, id: &str, max_plain: u64) -> Result<Option<Bytes>, StoreError> {
        let got = match self.objects.get(&Self::path(id)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.backend(e)),
        };
        // (A sealed image is never much larger than what it holds.)
        let most = max_plain
            .saturating_add(max_plain / 8)
            .saturating_add(1 << 20);
        if got.meta.size > most {
            return Err(OpenError::TooLarge(got.meta.size, most).into());
        }
        let sealed = got.bytes().await.map_err(|e| self.backend(e))?;
        let (id, engine) = (id.to_string(), self.engine.clone());
        let payload = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let payload = seal::open(&id, &engine, sealed, max_plain);
            tracing::debug!(
                ms = started.elapsed().as_secs_f64() * 1e3,
                "session image opened"
            );
            payload
        })
        .await
        .map_err(|e| StoreError::Seal(e.to_string()))??;
        Ok(Some(payload))
    }

    /// Whether the store holds an image for session `id`.
    pub async fn exists(&self, id: &str) -> Result<bool, StoreError> {
        match self.objects.head(&Self::path(id)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.backend(e)),
        }
    }

    /// Deletes session `id`'s image (nothing to delete is not an error).
    pub async fn delete(&self, id: &str) -> Result<(), StoreError> {
        match self.objects.delete(&Self::path(id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.backend(e)),
        }
    }

    /// How many images the store holds.
    pub async fn count(&self) -> Result<usize, StoreError> {
        let listed: Vec<_> = self
            .objects
            .list(None)
            .try_filter(|meta| std::future::ready(meta.location.as_ref().ends_with(SUFFIX)))
            .try_collect()
            .await
            .map_err(|e| self.backend(e))?;
        Ok(listed.len())
    }
}
