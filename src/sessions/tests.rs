//! The session manager's logic against a fake backend and a manual clock: no V8, no sleeps. Calls
//! that must be running when the test acts report their start and wait to be released (or
//! cancelled), so every ordering below is forced by channels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::{Backend, Caller, Clock, Principal, SessionError, Sessions};
use crate::config::SessionSettings;
use crate::sandbox::{
    ErrorKind, ExecError, ExecRequest, ExecResult, FileListing, FileRead, SandboxEnd,
};

/// A clock the test moves.
pub(super) struct ManualClock {
    start: Instant,
    offset: Mutex<Duration>,
}

impl ManualClock {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        })
    }

    pub(super) fn advance(&self, by: Duration) {
        *self.offset.lock().unwrap() += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.offset.lock().unwrap()
    }
}

/// Runs fake code: `hold` (report the start, then wait until released or cancelled), `crash` (the
/// sandbox can run nothing more), `say:TEXT` (raise an exception with that message), `push:X`
/// (remember X: the session's state), `state` (what was remembered, as the result), `js` (hold
/// something an image cannot carry); anything else succeeds with the code as its result. A first
/// code of `slow-boot` waits to be released before the sandbox exists; `parked` says whether the
/// sandbox was finished from a parked one. The image of a sandbox is what it remembers.
pub(super) struct Fake {
    started: UnboundedSender<&'static str>,
    release: Mutex<mpsc::Receiver<()>>,
}

pub(super) struct FakeSandbox {
    ended: Option<SandboxEnd>,
    state: Vec<String>,
    holds_js: bool,
    /// Finished from a parked sandbox (code `parked` says).
    parked: bool,
}

impl Fake {
    pub(super) fn new() -> (Arc<Self>, UnboundedReceiver<&'static str>, mpsc::Sender<()>) {
        let (started, started_rx) = unbounded_channel();
        let (release_tx, release) = mpsc::channel();
        (
            Arc::new(Self {
                started,
                release: Mutex::new(release),
            }),
            started_rx,
            release_tx,
        )
    }

    /// Waits for a release, or for `cancel`; true when cancelled.
    fn hold(&self, cancel: Option<&AtomicBool>) -> bool {
        loop {
            if cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
                return true;
            }
            match self
                .release
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_millis(1))
            {
                Ok(()) => return false,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }
}

fn success(result: &str) -> ExecResult {
    ExecResult {
        success: true,
        stdout: String::new(),
        stderr: String::new(),
        result: Some(result.to_string()),
        files: Vec::new(),
        displays: Vec::new(),
        error: None,
        timed_out: false,
        output_truncated: false,
    }
}

/// The fake's failures, by their message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Failed(String);

impl Backend for Fake {
    type Sandbox = FakeSandbox;
    type Parked = ();
    type Error = Failed;

    fn park(&self) -> Option<()> {
        Some(())
    }

    fn boot(&self, parked: Option<()>, first_code: &str) -> Result<FakeSandbox, Failed> {
        if first_code == "slow-boot" {
            let _ = self.started.send("boot");
            self.hold(None);
        }
        if first_code == "fail-boot" {
            return Err(Failed("no".into()));
        }
        Ok(FakeSandbox {
            ended: None,
            state: Vec::new(),
            holds_js: false,
            parked: parked.is_some(),
        })
    }

    fn run(
        &self,
        sandbox: &mut FakeSandbox,
        request: ExecRequest,
        cancel: Arc<AtomicBool>,
    ) -> ExecResult {
        match request.code.as_str() {
            "hold" => {
                let _ = self.started.send("run");
                if self.hold(Some(&cancel)) {
                    return ExecResult::failure(ExecError::new(
                        ErrorKind::Cancelled,
                        crate::sandbox::ErrorType::Cancelled,
                        "cancelled",
                    ));
                }
                success("released")
            }
            "crash" => {
                sandbox.ended = Some(SandboxEnd::Crashed);
                ExecResult::failure(ExecError::new(
                    ErrorKind::Python,
                    crate::sandbox::ErrorType::InterpreterCrashed,
                    "crashed; the session has ended",
                ))
            }
            code if code.starts_with("say:") => ExecResult::failure(ExecError {
                kind: ErrorKind::Python,
                error_type: "Exception".into(),
                message: code["say:".len()..].to_string(),
                traceback: None,
                quota: None,
                retry_after_ms: None,
            }),
            "state" => success(&sandbox.state.join(",")),
            "parked" => success(&sandbox.parked.to_string()),
            "js" => {
                sandbox.holds_js = true;
                success("js")
            }
            code if code.starts_with("push:") => {
                sandbox.state.push(code["push:".len()..].to_string());
                success(code)
            }
            code => success(code),
        }
    }

    fn list(&self, _sandbox: &mut FakeSandbox) -> Result<FileListing, Failed> {
        Ok(FileListing::default())
    }

    fn read(&self, _: &mut FakeSandbox, _: &str, _: u64) -> Result<FileRead, Failed> {
        Ok(FileRead::Missing)
    }

    fn store(&self, _: &mut FakeSandbox, _: &str, _: Vec<u8>) -> Result<(), Failed> {
        Ok(())
    }

    fn ended(&self, sandbox: &FakeSandbox) -> Option<SandboxEnd> {
        sandbox.ended
    }

    fn unsaveable(&self, sandbox: &mut FakeSandbox) -> Option<String> {
        sandbox
            .holds_js
            .then(|| "it holds a JavaScript object".to_string())
    }

    fn save(&self, sandbox: &mut FakeSandbox) -> Result<Vec<Bytes>, Failed> {
        match self.unsaveable(sandbox) {
            Some(reason) => Err(Failed(reason)),
            // (In two parts, as the engine's payloads are.)
            None => Ok(vec![
                Bytes::from_static(b"fake:"),
                sandbox.state.join(",").into_bytes().into(),
            ]),
        }
    }

    fn restore(&self, parked: Option<()>, payload: Bytes) -> Result<FakeSandbox, Failed> {
        let text = String::from_utf8(payload.to_vec()).map_err(|e| Failed(e.to_string()))?;
        let state = text
            .strip_prefix("fake:")
            .ok_or_else(|| Failed("not a fake image".into()))?;
        Ok(FakeSandbox {
            ended: None,
            state: state
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            holds_js: false,
            parked: parked.is_some(),
        })
    }
}

pub(super) fn config(max_sessions: usize, queue_capacity: usize) -> SessionSettings {
    SessionSettings {
        max_sessions,
        max_resident: max_sessions,
        spill_after: None,
        store_url: "off".into(),
        queue_capacity,
        idle_timeout: Duration::from_secs(60),
        max_lifetime: Duration::from_secs(3600),
        max_per_principal: None,
    }
}

pub(super) fn request(code: &str) -> ExecRequest {
    ExecRequest {
        code: code.into(),
        files: Vec::new(),
        timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

fn manager(
    max_sessions: usize,
    queue_capacity: usize,
) -> (
    Sessions<Fake>,
    Arc<ManualClock>,
    UnboundedReceiver<&'static str>,
    mpsc::Sender<()>,
) {
    let (fake, started, release) = Fake::new();
    let clock = ManualClock::new();
    let sessions = Sessions::without_reaper(
        fake,
        config(max_sessions, queue_capacity),
        "",
        clock.clone(),
        None,
    );
    (sessions, clock, started, release)
}

/// Waits until no job of any session is queued or running (the session threads finish dropped
/// jobs on their own).
pub(super) async fn settled(sessions: &Sessions<Fake>) {
    while sessions.busy() {
        tokio::task::yield_now().await;
        std::thread::yield_now();
    }
}

#[tokio::test]
async fn a_cancelled_call_leaves_nothing_behind_and_the_idle_session_is_reaped() {
    let (sessions, clock, mut started, _release) = manager(2, 4);
    let caller = Caller::default();
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    {
        let call = sessions.run(&id, &caller, request("hold"), None);
        tokio::pin!(call);
        tokio::select! {
            _ = &mut call => panic!("the held call returned"),
            started = started.recv() => assert_eq!(started, Some("run")),
        }
        // Dropping the call's future is what a client cancellation does.
    }
    settled(&sessions).await;
    // The session still answers, and is idle now.
    let r = sessions
        .run(&id, &caller, request("again"), None)
        .await
        .unwrap();
    assert_eq!(r.result.result.as_deref(), Some("again"));
    clock.advance(Duration::from_secs(61));
    sessions.reap().await;
    assert_eq!(sessions.live(), 0, "an idle session is reaped");
    assert!(matches!(
        sessions.run(&id, &caller, request("x"), None).await,
        Err(SessionError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_cancelled_creation_gives_its_slot_back() {
    let (sessions, _clock, mut started, release) = manager(1, 4);
    {
        let create = sessions.create(Caller::default(), "slow-boot");
        tokio::pin!(create);
        tokio::select! {
            _ = &mut create => panic!("the held boot returned"),
            started = started.recv() => assert_eq!(started, Some("boot")),
        }
    }
    release.send(()).unwrap();
    // The one slot is free again: a session can be created, and it starts on the spare thread the
    // cancelled creation left behind.
    let id = sessions.create(Caller::default(), "x").await.unwrap();
    assert_eq!(sessions.live(), 1);
    let run = sessions
        .run(&id, &Caller::default(), request("parked"), None)
        .await
        .unwrap();
    assert_eq!(run.result.result.as_deref(), Some("true"));
    assert!(matches!(
        sessions.create(Caller::default(), "x").await,
        Err(SessionError::TooMany { live: 1, max: 1 })
    ));
    sessions.abandon(&id);
    assert_eq!(sessions.live(), 0);
}

#[tokio::test]
async fn a_busy_session_queues_at_most_its_capacity() {
    let (sessions, _clock, mut started, release) = manager(2, 2);
    let caller = Caller::default();
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    let running = tokio::spawn({
        let (sessions, id, caller) = (sessions.clone(), id.clone(), caller.clone());
        async move { sessions.run(&id, &caller, request("hold"), None).await }
    });
    assert_eq!(started.recv().await, Some("run"));
    let queued: Vec<_> = (0..2)
        .map(|n| {
            let (sessions, id, caller) = (sessions.clone(), id.clone(), caller.clone());
            tokio::spawn(async move {
                sessions
                    .run(&id, &caller, request(&format!("q{n}")), None)
                    .await
            })
        })
        .collect();
    while sessions.inner.sessions.lock().unwrap()[id.as_str()]
        .pending
        .load(Ordering::SeqCst)
        < 3
    {
        tokio::task::yield_now().await;
    }
    let refused = sessions.run(&id, &caller, request("one more"), None).await;
    assert!(
        matches!(
            refused,
            Err(SessionError::Busy {
                waiting: 3,
                capacity: 2,
                ..
            })
        ),
        "{refused:?}"
    );
    // Listings count too.
    assert!(matches!(
        sessions.list_files(&id, &caller).await,
        Err(SessionError::Busy { .. })
    ));
    release.send(()).unwrap();
    assert_eq!(
        running.await.unwrap().unwrap().result.result.as_deref(),
        Some("released")
    );
    for (n, call) in queued.into_iter().enumerate() {
        let run = call.await.unwrap().unwrap();
        assert_eq!(run.result.result, Some(format!("q{n}")), "in order");
    }
    settled(&sessions).await;
}

#[tokio::test]
async fn a_sandbox_that_ended_ends_its_session_and_no_message_text_does() {
    let (sessions, _clock, _started, _release) = manager(2, 4);
    let caller = Caller::default();
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    let said = sessions
        .run(&id, &caller, request("say:the session has ended"), None)
        .await
        .unwrap();
    assert_eq!(said.result.error.unwrap().message, "the session has ended");
    assert_eq!(sessions.live(), 1, "a message is only a message");
    let crashed = sessions
        .run(&id, &caller, request("crash"), None)
        .await
        .unwrap();
    assert_eq!(
        crashed.result.error.unwrap().error_type,
        "InterpreterCrashed"
    );
    assert_eq!(sessions.live(), 0, "ended before the reply came");
    match sessions.run(&id, &caller, request("x"), None).await {
        Err(SessionError::Ended { reason, .. }) => {
            assert_eq!(reason, SandboxEnd::Crashed.reason())
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn with_bearer_tokens_a_session_answers_only_to_its_token() {
    let (sessions, _clock, _started, _release) = manager(2, 4);
    let alice = Caller {
        client: None,
        principal: Some(Principal([1; 32])),
        profile: None,
    };
    let bob = Caller {
        client: None,
        principal: Some(Principal([2; 32])),
        profile: None,
    };
    let id = sessions.create(alice.clone(), "x").await.unwrap();
    for other in [&bob, &Caller::default()] {
        assert!(matches!(
            sessions.run(&id, other, request("x"), None).await,
            Err(SessionError::NotFound(_))
        ));
        assert!(matches!(
            sessions.clear(&id, other).await,
            Err(SessionError::NotFound(_))
        ));
    }
    assert!(sessions.run(&id, &alice, request("x"), None).await.is_ok());
    sessions.clear(&id, &alice).await.unwrap();
}

#[tokio::test]
async fn sessions_end_at_their_lifetime_and_shutdown_does_not_wait_for_cancelled_calls() {
    let (sessions, clock, mut started, _release) = manager(4, 4);
    let caller = Caller::default();
    let old = sessions.create(caller.clone(), "x").await.unwrap();
    clock.advance(Duration::from_secs(3000));
    let young = sessions.create(caller.clone(), "x").await.unwrap();
    clock.advance(Duration::from_secs(601));
    // Both were used just now, so neither is idle; only the old one is past its lifetime.
    sessions
        .run(&young, &caller, request("x"), None)
        .await
        .unwrap();
    sessions.reap().await;
    assert!(
        sessions
            .run(&old, &caller, request("x"), None)
            .await
            .is_err()
    );
    assert!(
        sessions
            .run(&young, &caller, request("x"), None)
            .await
            .is_ok()
    );
    {
        let call = sessions.run(&young, &caller, request("hold"), None);
        tokio::pin!(call);
        tokio::select! {
            _ = &mut call => panic!("the held call returned"),
            _ = started.recv() => {}
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    sessions.shutdown(deadline).await;
    assert!(
        Instant::now() < deadline - Duration::from_secs(25),
        "no wait for a zombie"
    );
    assert_eq!(sessions.live(), 0);
}

#[tokio::test]
async fn a_failed_boot_is_a_structured_error_and_frees_its_slot() {
    let (sessions, _clock, _started, _release) = manager(1, 4);
    assert!(matches!(
        sessions.create(Caller::default(), "fail-boot").await,
        Err(SessionError::Boot(_))
    ));
    assert!(sessions.create(Caller::default(), "x").await.is_ok());
}

#[tokio::test]
async fn every_session_after_the_first_starts_on_a_spare_thread_with_a_parked_sandbox() {
    let (sessions, _clock, _started, _release) = manager(4, 4);
    let caller = Caller::default();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let id = sessions.create(caller.clone(), "x").await.unwrap();
        let run = sessions
            .run(&id, &caller, request("parked"), None)
            .await
            .unwrap();
        seen.push(run.result.result.unwrap());
    }
    // The first session's thread is made on demand; each start leaves a spare for the next.
    assert_eq!(seen, ["false", "true", "true"]);
    // A failed start uses up the spare too, and the next session still finds one.
    assert!(sessions.create(caller.clone(), "fail-boot").await.is_err());
    let id = sessions.create(caller.clone(), "x").await.unwrap();
    let run = sessions
        .run(&id, &caller, request("parked"), None)
        .await
        .unwrap();
    assert_eq!(run.result.result.as_deref(), Some("true"));
}
