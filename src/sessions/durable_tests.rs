//! Durable sessions against the fake backend and a real directory store: spill and resume, the
//! resident bound, refusals, a failing store, restarts, racing replicas, shutdown, fork, damaged
//! images. No V8, no sleeps: the clock is moved and the reaper is called.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tests::{Fake, ManualClock, config, request};
use super::{Caller, Durability, Principal, SessionError, Sessions};
use crate::store::Store;

const ENGINE: &str = "fake-engine";

fn manager(
    dir: &Path,
    max_resident: usize,
    replica: &str,
    clock: Arc<ManualClock>,
) -> Sessions<Fake> {
    let (fake, _started, _release) = Fake::new();
    let mut settings = config(100, 4);
    settings.max_resident = max_resident;
    settings.spill_after = Some(Duration::from_secs(60));
    settings.idle_timeout = Duration::from_secs(3600);
    settings.max_lifetime = Duration::from_secs(86400);
    settings.store_url = dir.display().to_string();
    let store = Store::open("", dir, ENGINE).unwrap();
    Sessions::without_reaper(
        fake,
        settings,
        replica,
        clock,
        Some(
            Durability::new(store, replica, 1 << 20).with_handoff_wait(Duration::from_millis(300)),
        ),
    )
}

async fn state(
    sessions: &Sessions<Fake>,
    id: &str,
    caller: &Caller,
) -> Result<String, SessionError> {
    let run = sessions.run(id, caller, request("state"), None).await?;
    Ok(run.result.result.unwrap_or_default())
}

async fn push(sessions: &Sessions<Fake>, id: &str, value: &str) {
    let run = sessions
        .run(
            id,
            &Caller::default(),
            request(&format!("push:{value}")),
            None,
        )
        .await
        .unwrap();
    assert_eq!(run.unsaveable, None, "durable");
}

fn images(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".img"))
        })
        .count()
}

#[tokio::test]
async fn an_idle_session_is_spilled_and_its_next_call_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let sessions = manager(dir.path(), 8, "", clock.clone());
    let caller = Caller::default();
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    push(&sessions, &id, "a").await;
    push(&sessions, &id, "b").await;
    clock.advance(Duration::from_secs(30));
    sessions.reap().await;
    assert_eq!(sessions.resident(), 1, "not idle long enough");
    clock.advance(Duration::from_secs(31));
    sessions.reap().await;
    assert_eq!((sessions.resident(), sessions.live()), (0, 1), "spilled");
    assert_eq!(images(dir.path()), 1);
    assert_eq!(state(&sessions, &id, &caller).await.unwrap(), "a,b");
    assert_eq!(sessions.resident(), 1, "resumed");
    push(&sessions, &id, "c").await;
    assert_eq!(state(&sessions, &id, &caller).await.unwrap(), "a,b,c");
    // Ending the session deletes its image.
    sessions.clear(&id, &caller).await.unwrap();
    for _ in 0..200 {
        if images(dir.path()) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(images(dir.path()), 0);
}

#[tokio::test]
async fn max_resident_spills_the_least_recently_used_and_every_session_keeps_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let sessions = manager(dir.path(), 2, "", clock.clone());
    let mut ids = Vec::new();
    for n in 0..6 {
        let id = sessions.create(Caller::default(), "x").await.unwrap();
        push(&sessions, &id, &format!("v{n}")).await;
        assert!(sessions.resident() <= 2);
        clock.advance(Duration::from_millis(10));
        ids.push(id);
    }
    for (n, id) in ids.iter().enumerate().rev() {
        assert_eq!(
            state(&sessions, id, &Caller::default()).await.unwrap(),
            format!("v{n}")
        );
        assert!(sessions.resident() <= 2);
    }
    assert_eq!(sessions.live(), 6);
}

#[tokio::test]
async fn a_session_that_cannot_be_saved_says_why_and_stays_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let sessions = manager(dir.path(), 1, "", clock.clone());
    let caller = Caller::default();
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    let run = sessions
        .run(&id, &caller, request("js"), None)
        .await
        .unwrap();
    assert_eq!(
        run.unsaveable.as_deref(),
        Some("it holds a JavaScript object")
    );
    clock.advance(Duration::from_secs(120));
    sessions.reap().await;
    assert_eq!(sessions.resident(), 1, "kept in memory");
    // It holds the one place in memory and cannot give it up.
    assert!(matches!(
        sessions.create(caller.clone(), "x").await,
        Err(SessionError::TooManyResident { max: 1 })
    ));
    assert!(matches!(
        sessions.fork(&id, &caller).await,
        Err(SessionError::NotDurable { .. })
    ));
    assert_eq!(images(dir.path()), 0);
}

#[tokio::test]
async fn a_store_that_fails_keeps_the_session_in_memory_and_working() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    let clock = ManualClock::new();
    let sessions = manager(&store_dir, 8, "", clock.clone());
    let caller = Caller::default();
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    push(&sessions, &id, "kept").await;
    // The store's directory is gone and a file stands in its place: every write fails.
    std::fs::remove_dir_all(&store_dir).unwrap();
    std::fs::write(&store_dir, b"not a directory").unwrap();
    clock.advance(Duration::from_secs(61));
    sessions.reap().await;
    assert_eq!(sessions.resident(), 1, "the failed spill left it in memory");
    assert_eq!(state(&sessions, &id, &caller).await.unwrap(), "kept");
}

#[tokio::test]
async fn a_restarted_server_resumes_saved_sessions_for_their_token_only() {
    let dir = tempfile::tempdir().unwrap();
    let alice = Caller {
        client: None,
        principal: Some(Principal([7; 32])),
        profile: None,
    };
    let (id, plain) = {
        let clock = ManualClock::new();
        let before = manager(dir.path(), 8, "", clock);
        let id = before.create(alice.clone(), "x").await.unwrap();
        before
            .run(&id, &alice, request("push:secret"), None)
            .await
            .unwrap();
        let plain = before.create(Caller::default(), "x").await.unwrap();
        push(&before, &plain, "p").await;
        let js = before.create(Caller::default(), "x").await.unwrap();
        before
            .run(&js, &Caller::default(), request("js"), None)
            .await
            .unwrap();
        before
            .shutdown(Instant::now() + Duration::from_secs(10))
            .await;
        assert_eq!(before.live(), 0);
        // The unsaveable session left word of why it ended.
        let after = manager(dir.path(), 8, "", ManualClock::new());
        match state(&after, &js, &Caller::default()).await {
            Err(SessionError::Ended { reason, .. }) => {
                assert!(reason.contains("JavaScript object"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        after
            .shutdown(Instant::now() + Duration::from_secs(10))
            .await;
        (id, plain)
    };
    let after = manager(dir.path(), 8, "", ManualClock::new());
    let bob = Caller {
        client: None,
        principal: Some(Principal([8; 32])),
        profile: None,
    };
    assert!(matches!(
        state(&after, &id, &bob).await,
        Err(SessionError::NotFound(_))
    ));
    assert_eq!(state(&after, &id, &alice).await.unwrap(), "secret");
    assert_eq!(
        state(&after, &plain, &Caller::default()).await.unwrap(),
        "p"
    );
    // A garbage or unknown id never reaches the store's contents.
    assert!(matches!(
        state(&after, "nope", &Caller::default()).await,
        Err(SessionError::NotFound(_))
    ));
}

#[tokio::test]
async fn two_replicas_racing_for_one_saved_session_run_it_in_one_place() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let first = manager(dir.path(), 8, "r1", clock.clone());
    let id = first.create(Caller::default(), "x").await.unwrap();
    push(&first, &id, "one").await;
    clock.advance(Duration::from_secs(61));
    first.reap().await;
    assert_eq!(first.resident(), 0);
    let r2 = manager(dir.path(), 8, "r2", ManualClock::new());
    let r3 = manager(dir.path(), 8, "r3", ManualClock::new());
    let caller = Caller::default();
    let (a, b) = tokio::join!(state(&r2, &id, &caller), state(&r3, &id, &caller));
    let won = [&a, &b].iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "{a:?} {b:?}");
    for result in [&a, &b] {
        match result {
            Ok(value) => assert_eq!(value, "one"),
            Err(SessionError::Elsewhere { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    // The first replica, which knows the session as spilled, finds it held elsewhere too.
    assert!(matches!(
        state(&first, &id, &caller).await,
        Err(SessionError::Elsewhere { .. })
    ));
}

#[tokio::test]
async fn a_fork_is_a_copy_that_goes_its_own_way() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let sessions = manager(dir.path(), 8, "", clock.clone());
    let caller = Caller::default();
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    push(&sessions, &id, "base").await;
    let copy = sessions.fork(&id, &caller).await.unwrap();
    assert_ne!(copy, id);
    push(&sessions, &copy, "copy").await;
    push(&sessions, &id, "original").await;
    assert_eq!(state(&sessions, &copy, &caller).await.unwrap(), "base,copy");
    assert_eq!(
        state(&sessions, &id, &caller).await.unwrap(),
        "base,original"
    );
    // A spilled session forks too (resumed for it).
    clock.advance(Duration::from_secs(61));
    sessions.reap().await;
    let again = sessions.fork(&id, &caller).await.unwrap();
    assert_eq!(
        state(&sessions, &again, &caller).await.unwrap(),
        "base,original"
    );
}

#[tokio::test]
async fn a_damaged_or_foreign_image_is_refused_with_the_session_error() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let sessions = manager(dir.path(), 8, "", clock.clone());
    let caller = Caller::default();
    let ids = [
        sessions.create(caller.clone(), "x").await.unwrap(),
        sessions.create(caller.clone(), "x").await.unwrap(),
    ];
    for id in &ids {
        push(&sessions, id, "v").await;
    }
    clock.advance(Duration::from_secs(61));
    sessions.reap().await;
    sessions
        .shutdown(Instant::now() + Duration::from_secs(5))
        .await;
    // One image gets a flipped byte; the other is read by another build.
    let damaged = dir
        .path()
        .join(format!("{}.img", crate::store::seal::name(&ids[0])));
    let mut bytes = std::fs::read(&damaged).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&damaged, bytes).unwrap();
    let after = manager(dir.path(), 8, "", ManualClock::new());
    assert!(matches!(
        state(&after, &ids[0], &caller).await,
        Err(SessionError::Unrestorable { .. })
    ));
    let (fake, _s, _r) = Fake::new();
    let mut settings = config(100, 4);
    settings.max_resident = 8;
    let other_build = Sessions::without_reaper(
        fake,
        settings,
        "",
        ManualClock::new(),
        Some(Durability::new(
            Store::open("", dir.path(), "another-engine").unwrap(),
            "",
            1 << 20,
        )),
    );
    match state(&other_build, &ids[1], &caller).await {
        Err(SessionError::Unrestorable { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
    // The right build still resumes it.
    assert_eq!(state(&after, &ids[1], &caller).await.unwrap(), "v");
}
