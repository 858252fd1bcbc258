//! The session store against real backends: a directory (two stores on one directory, as a restart
//! sees it) and S3-compatible object storage (moto's S3 server on loopback, installed into
//! `.tools/moto` from `tests/store/requirements.txt` on first use). Images round-trip, open only with
//! their id and engine, are stored under names that reveal no id, leases have one holder at a time
//! (eight racing replicas: one winner), and a bad URL is refused.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use code_interpreter_mcp::store::{Held, OpenError, Store, StoreError};

const ID: &str = "pod-1.TmV2ZXItYS1yZWFsLXNlc3Npb24taWQtMDAx";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A payload shaped like a memory image: mostly zero pages, some data.
fn payload(seed: u8) -> bytes::Bytes {
    let mut bytes = vec![0u8; 4 << 20];
    for (i, b) in bytes.iter_mut().enumerate().step_by(4096).take(300) {
        *b = seed ^ (i / 4096) as u8;
    }
    bytes.into()
}

/// What every store must do, whatever its backend.
fn exercise(a: &Store, b: &Store, other_engine: &Store) {
    let rt = runtime();
    rt.block_on(async {
        assert_eq!(
            a.load(ID, 1 << 30).await.unwrap(),
            None,
            "nothing stored yet"
        );
        let stored = a.save(ID, vec![payload(1)]).await.unwrap();
        assert!(stored < 256 * 1024, "compressed to {stored} bytes");
        // Another process on the same store reads it; a newer image replaces the older one.
        assert_eq!(b.load(ID, 1 << 30).await.unwrap(), Some(payload(1)));
        b.save(ID, vec![payload(2)]).await.unwrap();
        assert_eq!(a.load(ID, 1 << 30).await.unwrap(), Some(payload(2)));
        assert_eq!(a.count().await.unwrap(), 1);
        // Another engine refuses it; so does a smaller budget.
        match other_engine.load(ID, 1 << 30).await {
            Err(StoreError::Open(OpenError::OtherEngine(engine))) => assert_eq!(engine, "engine-1"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            a.load(ID, 1024).await,
            Err(StoreError::Open(OpenError::TooLarge(..)))
        ));
        // Another id finds nothing.
        assert_eq!(a.load("pod-1.another", 1 << 30).await.unwrap(), None);
        a.delete(ID).await.unwrap();
        a.delete(ID).await.unwrap();
        assert_eq!(b.load(ID, 1 << 30).await.unwrap(), None);
        assert_eq!(a.count().await.unwrap(), 0);
    });
}

/// Leases on any backend: one holder at a time, renewed and released by it, taken over once
/// expired, and exactly one winner when many race for a session.
fn exercise_leases(a: &Store, b: &Store) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let id = "pod-1.lease-session";
        let minute = Duration::from_secs(60);
        let first = a
            .take_lease(id, "replica-a", minute)
            .await
            .unwrap()
            .unwrap();
        match b.take_lease(id, "replica-b", minute).await.unwrap() {
            Err(Held { holder, expires_in }) => {
                assert_eq!(holder, "replica-a");
                assert!(expires_in > Duration::from_secs(50), "{expires_in:?}");
            }
            Ok(lease) => panic!("two holders: {lease:?}"),
        }
        let renewed = a
            .take_lease(id, "replica-a", minute)
            .await
            .unwrap()
            .unwrap();
        assert!(renewed.generation > first.generation);
        a.release_lease(id, "replica-a").await.unwrap();
        b.take_lease(id, "replica-b", Duration::from_millis(300))
            .await
            .unwrap()
            .expect("released: free to take");
        // A's release of a lease it no longer holds changes nothing.
        a.release_lease(id, "replica-a").await.unwrap();
        assert!(
            a.take_lease(id, "replica-a", minute)
                .await
                .unwrap()
                .is_err()
        );
        // B's holder died: once expired, A takes over.
        tokio::time::sleep(Duration::from_millis(400)).await;
        a.take_lease(id, "replica-a", minute)
            .await
            .unwrap()
            .expect("expired: taken over");

        // Eight replicas race for a fresh session: exactly one wins.
        let race = "pod-1.raced-session";
        let attempts = (0..8).map(|n| {
            let store = if n % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                store
                    .take_lease(race, &format!("replica-{n}"), Duration::from_secs(60))
                    .await
                    .unwrap()
                    .is_ok()
            })
        });
        let won = futures::future::join_all(attempts)
            .await
            .into_iter()
            .filter(|r| *r.as_ref().unwrap())
            .count();
        assert_eq!(won, 1, "racing replicas");
        a.forget_lease(race).await.unwrap();
        a.forget_lease(id).await.unwrap();
        b.take_lease(race, "replica-b", minute)
            .await
            .unwrap()
            .expect("forgotten: free");
        b.forget_lease(race).await.unwrap();
    });
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn a_directory_store_survives_a_restart_and_names_reveal_no_session() {
    let dir = crate::common::temp_dir("store-dir").join("sessions");
    let a = Store::open("", &dir, "engine-1").unwrap();
    let b = Store::open(
        &format!("file://{}", dir.display()),
        Path::new("/unused"),
        "engine-1",
    )
    .unwrap();
    let other = Store::open(dir.to_str().unwrap(), Path::new("/unused"), "engine-2").unwrap();
    exercise(&a, &b, &other);
    exercise_leases(&a, &b);

    runtime().block_on(a.save(ID, vec![payload(3)])).unwrap();
    let mut files = Vec::new();
    files_under(&dir, &mut files);
    files.sort();
    // The image and the record of its generation beside it.
    assert_eq!(files.len(), 2, "{files:?}");
    let name = files[1].file_name().unwrap().to_str().unwrap();
    assert!(name.ends_with(".img") && name.len() == 64 + 4, "{name}");
    assert!(
        !name.contains("pod-1") && !name.contains(&ID[6..12]),
        "{name}"
    );
    assert_eq!(
        files[0].file_name().unwrap().to_str().unwrap(),
        name.replace(".img", ".gen")
    );
    let sealed = std::fs::read(&files[1]).unwrap();
    assert!(
        !sealed.windows(ID.len()).any(|w| w == ID.as_bytes()),
        "the id is not in the image"
    );
}

#[test]
fn bad_store_urls_are_refused() {
    let dir = crate::common::temp_dir("store-bad");
    for url in ["relative/dir", "ftp://host/x", "s3://", "s3:///prefix"] {
        match Store::open(url, &dir, "e") {
            Err(StoreError::Url(message)) => assert!(!message.is_empty(), "{url}"),
            other => panic!("{url}: {other:?}"),
        }
    }
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        Store::open(file.join("below").to_str().unwrap(), &dir, "e"),
        Err(StoreError::Url(_))
    ));
}

/// moto's S3 server (installed by tests/store/install.sh); stopped when dropped.
pub(crate) struct Moto {
    child: Child,
    pub(crate) endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn moto() -> Moto {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let install = Command::new("bash")
        .arg(root.join("tests/store/install.sh"))
        .output()
        .unwrap();
    assert!(
        install.status.success(),
        "tests/store/install.sh: {}",
        String::from_utf8_lossy(&install.stderr)
    );
    let server = root.join(".tools/moto/bin/moto_server");
    let port = crate::metrics::free_port();
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let moto = Moto {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let started = Instant::now();
    let http = reqwest::blocking::Client::new();
    loop {
        // Creating the bucket is also the readiness check.
        if let Ok(r) = http
            .put(format!("{}/sessions-bucket", moto.endpoint))
            .send()
            && r.status().is_success()
        {
            return moto;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "moto did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_s3_store_is_shared_by_replicas() {
    let moto = moto();
    let options = [
        ("aws_endpoint", moto.endpoint.as_str()),
        ("aws_allow_http", "true"),
        ("aws_region", "us-east-1"),
        ("aws_access_key_id", "test"),
        ("aws_secret_access_key", "test"),
    ];
    let unused = Path::new("/unused");
    let open = |engine: &str| {
        Store::open_with(
            "s3://sessions-bucket/replicas/images",
            unused,
            engine,
            &options,
        )
        .unwrap()
    };
    let (a, b, other) = (open("engine-1"), open("engine-1"), open("engine-2"));
    assert_eq!(a.location(), "s3://sessions-bucket/replicas/images");
    exercise(&a, &b, &other);
    exercise_leases(&a, &b);

    // Under the prefix, one object named by the hash.
    runtime().block_on(a.save(ID, vec![payload(4)])).unwrap();
    let listing = reqwest::blocking::get(format!("{}/sessions-bucket?list-type=2", moto.endpoint))
        .unwrap()
        .text()
        .unwrap();
    assert!(listing.contains("<Key>replicas/images/"), "{listing}");
    assert!(!listing.contains("pod-1"), "{listing}");
    // A store that cannot be reached fails the call that used it, and says where.
    let down = Store::open_with(
        "s3://sessions-bucket/x",
        unused,
        "engine-1",
        &[
            ("aws_endpoint", "http://127.0.0.1:9"),
            ("aws_allow_http", "true"),
            ("aws_region", "us-east-1"),
            ("aws_access_key_id", "t"),
            ("aws_secret_access_key", "t"),
        ],
    )
    .unwrap();
    let error = runtime().block_on(down.load(ID, 1 << 20)).unwrap_err();
    assert!(
        error.to_string().contains("s3://sessions-bucket/x"),
        "{error}"
    );
}
