//! Where saved sessions live between processes: a directory (the default, under
//! `package_cache_dir`, so a restart on the same disk or volume finds them) or S3-compatible object
//! storage (`s3://bucket/prefix`, shared by replicas), through `object_store`. Each image is sealed
//! (see [`seal`]): stored under a hash of its session's id, encrypted with a key derived from it,
//! and refused unless it was made by this engine for that id; a lease ([`lease`]) says which
//! process runs a session. The store only moves sealed bytes; what an image holds is the sandbox's
//! business.

pub mod lease;
pub mod seal;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
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
/// The suffix of the object beside an image that holds its generation (see [`Store::load`]).
const GENERATION_SUFFIX: &str = ".gen";
/// At most this many sessions' newest generations are remembered in the process.
const MAX_REMEMBERED: usize = 100_000;

/// A session store.
#[derive(Clone)]
pub struct Store {
    objects: Arc<dyn ObjectStore>,
    /// Where it is, for logs (a directory or `s3://bucket/prefix`; never credentials).
    location: String,
    /// The engine key images are made and accepted by.
    engine: String,
    /// The directory, for a directory store: its files are read without following links or
    /// blocking (see [`read_regular`]).
    dir: Option<PathBuf>,
    /// The newest generation of each session image this process saved or loaded, by image name.
    generations: Arc<Mutex<HashMap<String, u64>>>,
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
        let mut local_dir = None;
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
            local_dir = Some(dir.clone());
            (Arc::new(local), dir.display().to_string())
        };
        Ok(Self {
            objects,
            location,
            engine: engine.to_string(),
            dir: local_dir,
            generations: Arc::default(),
        })
    }

    /// The object at `path`, if there is one, of at most `most` bytes (else `TooLarge`). A
    /// directory store reads it with [`read_regular`]: a link, a FIFO or any other non-regular
    /// file in the store is an error at once, never a read that blocks.
    pub(crate) async fn fetch(
        &self,
        path: &ObjectPath,
        most: u64,
    ) -> Result<Option<Bytes>, StoreError> {
        if let Some(dir) = &self.dir {
            let file = dir.join(path.as_ref());
            return tokio::task::spawn_blocking(move || read_regular(&file, most))
                .await
                .map_err(|e| StoreError::Seal(e.to_string()))?
                .map_err(|e| match e {
                    ReadError::NotRegular => StoreError::Open(OpenError::NotRegular),
                    ReadError::TooLarge(size) => StoreError::Open(OpenError::TooLarge(size, most)),
                    ReadError::Io(e) => self.local_error(e),
                });
        }
        let got = match self.objects.get(path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.backend(e)),
        };
        if got.meta.size > most {
            return Err(OpenError::TooLarge(got.meta.size, most).into());
        }
        got.bytes().await.map(Some).map_err(|e| self.backend(e))
    }

    fn generation_path(id: &str) -> ObjectPath {
        ObjectPath::from(format!("{}{GENERATION_SUFFIX}", seal::name(id)))
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn remembered(&self, id: &str) -> u64 {
        self.known().get(&seal::name(id)).copied().unwrap_or(0)
    }

    fn remember(&self, id: &str, generation: u64) {
        let mut known = self.known();
        if known.len() >= MAX_REMEMBERED {
            known.clear();
        }
        let entry = known.entry(seal::name(id)).or_default();
        *entry = (*entry).max(generation);
    }

    /// Forgets session `id`'s generation (its images are deleted).
    pub(crate) fn forget_generation(&self, name: &str) {
        self.known().remove(name);
    }

    /// An I/O error of a directory store, as the backend's.
    fn local_error(&self, source: std::io::Error) -> StoreError {
        self.backend(object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(source),
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

    /// Seals `payload` as session `id`'s image and stores it (replacing an older one), as the
    /// session's next generation (recorded beside it); the bytes stored.
    pub async fn save(&self, id: &str, payload: Vec<Bytes>) -> Result<u64, StoreError> {
        let created_ms = unix_ms();
        let generation = self.remembered(id) + 1;
        let (id_owned, engine) = (id.to_string(), self.engine.clone());
        let sealed = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let sealed = seal::seal(&id_owned, &engine, created_ms, generation, &payload);
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
        self.remember(id, generation);
        self.objects
            .put(
                &Self::generation_path(id),
                PutPayload::from(generation.to_string().into_bytes()),
            )
            .await
            .map_err(|e| self.backend(e))?;
        Ok(bytes)
    }

    /// Session `id`'s image, if the store has one: opened (made by this engine for this id,
    /// intact, at most `max_plain` bytes) and not older than the session's newest generation — as
    /// this process last saved or loaded it, or as recorded beside the image — so that an older
    /// image put back in place of a newer one is refused (`OpenError::Replayed`).
    pub async fn load(&self, id: &str, max_plain: u64) -> Result<Option<Bytes>, StoreError> {
        // (A sealed image is never much larger than what it holds.)
        let most = max_plain
            .saturating_add(max_plain / 8)
            .saturating_add(1 << 20);
        let Some(sealed) = self.fetch(&Self::path(id), most).await? else {
            return Ok(None);
        };
        let recorded = self
            .fetch(&Self::generation_path(id), 32)
            .await?
            .and_then(|text| std::str::from_utf8(&text).ok()?.trim().parse().ok())
            .unwrap_or(0);
        let newest = self.remembered(id).max(recorded);
        let (id_owned, engine) = (id.to_string(), self.engine.clone());
        let (payload, generation) = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let payload = seal::open(&id_owned, &engine, sealed, max_plain, newest);
            tracing::debug!(
                ms = started.elapsed().as_secs_f64() * 1e3,
                "session image opened"
            );
            payload
        })
        .await
        .map_err(|e| StoreError::Seal(e.to_string()))??;
        self.remember(id, generation);
        Ok(Some(payload))
    }

    /// Whether the store holds an image for session `id` (a directory store looks without
    /// opening it).
    pub async fn exists(&self, id: &str) -> Result<bool, StoreError> {
        if let Some(dir) = &self.dir {
            let file = dir.join(Self::path(id).as_ref());
            return match std::fs::symlink_metadata(&file) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(self.local_error(e)),
            };
        }
        match self.objects.head(&Self::path(id)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.backend(e)),
        }
    }

    /// Deletes session `id`'s image and its generation record (nothing to delete is not an
    /// error).
    pub async fn delete(&self, id: &str) -> Result<(), StoreError> {
        self.forget_generation(&seal::name(id));
        for path in [Self::path(id), Self::generation_path(id)] {
            match self.objects.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.backend(e)),
            }
        }
        Ok(())
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

/// Why [`read_regular`] read nothing.
enum ReadError {
    /// A link, a FIFO, a device, a directory: not a regular file.
    NotRegular,
    /// A regular file of this many bytes, more than allowed.
    TooLarge(u64),
    Io(std::io::Error),
}

/// The regular file at `path`, if there is one, of at most `most` bytes, read without following a
/// link (`O_NOFOLLOW`) and without blocking on a FIFO or device (`O_NONBLOCK`, then `fstat`): any
/// other kind of file, or a larger one, is an error at once.
fn read_regular(path: &Path, most: u64) -> Result<Option<Bytes>, ReadError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match file {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: the last component is a link.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(ReadError::NotRegular),
        Err(e) => return Err(ReadError::Io(e)),
    };
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > most {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(meta.len() as usize)
        .map_err(|e| ReadError::Io(std::io::Error::other(e)))?;
    file.take(most + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > most {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    Ok(Some(bytes.into()))
}
