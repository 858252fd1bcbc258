//! Session images against the real engine (issue 25, first part): a session's interpreter and
//! /workspace files saved between calls, sealed through the store, and restored into a fresh
//! sandbox that carries on; what an image does not carry yet is refused with the reason.

use std::time::{Duration, Instant};

use code_interpreter_mcp::sandbox::{Flavor, SessionImage};
use code_interpreter_mcp::store::Store;

use crate::common::run_in as run;

#[test]
fn a_session_is_saved_sealed_and_restored_into_a_fresh_sandbox() {
    let engine = crate::common::engine();
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(
        &mut session,
        "x = 41\ndef f(n):\n    return n + x\nopen('notes.txt', 'w').write('kept')",
    );
    run(
        &mut session,
        "import json, os\nos.makedirs('data', exist_ok=True)\nopen('data/b.bin', 'wb').write(bytes(range(256)))",
    );
    // A global JavaScript object held from Python comes back as the new sandbox's.
    run(&mut session, "from js import Math\nm = Math");
    let started = Instant::now();
    let image = session.save_image().unwrap();
    let saved = started.elapsed();
    assert_eq!(
        image
            .files
            .iter()
            .map(|(p, d)| (p.as_str(), d.len()))
            .collect::<Vec<_>>(),
        [("data/b.bin", 256), ("notes.txt", 4)]
    );
    // The session goes on after a save.
    assert_eq!(run(&mut session, "f(0)").as_deref(), Some("41"));
    drop(session);

    // Through the store, sealed, as another process would read it.
    let dir = crate::common::temp_dir("session-image");
    let store = Store::open("", &dir, "engine-test").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let id = "pod-1.c2Vzc2lvbi1pbWFnZS10ZXN0";
    let stored = rt.block_on(store.save(id, image.encode())).unwrap();
    let payload = rt.block_on(store.load(id, 1 << 30)).unwrap().unwrap();
    let image = SessionImage::decode(payload.clone()).unwrap();

    let started = Instant::now();
    let mut restored = engine.restore_session(None, image).unwrap();
    let resumed = started.elapsed();
    println!(
        "saved in {saved:?} ({} bytes raw, {stored} stored), restored in {resumed:?}",
        payload.len()
    );
    assert_eq!(
        run(&mut restored, "print('hi')\nf(1)").as_deref(),
        Some("42")
    );
    assert_eq!(
        run(
            &mut restored,
            "open('notes.txt').read() + str(len(open('data/b.bin', 'rb').read()))"
        )
        .as_deref(),
        Some("kept256")
    );
    assert_eq!(
        run(&mut restored, "json.dumps([x])").as_deref(),
        Some("[41]")
    );
    assert_eq!(run(&mut restored, "m.floor(2.5)").as_deref(), Some("2"));
    // And it can be saved again.
    run(&mut restored, "x = 99");
    let again = restored.save_image().unwrap();
    drop(restored);
    let mut third = engine.restore_session(None, again).unwrap();
    assert_eq!(run(&mut third, "f(1)").as_deref(), Some("100"));
}

#[test]
fn a_parked_sandbox_is_finished_as_a_new_session_or_as_a_restored_one() {
    let engine = crate::common::engine();
    // Parked ahead of a session, then finished as a new one: its clock starts when it is finished.
    let parked = engine.park_session().expect("a snapshot engine parks");
    std::thread::sleep(Duration::from_millis(1200));
    let mut session = engine
        .boot_session_flavor(Some(parked), Flavor::Plain)
        .unwrap();
    let since_origin: f64 = run(
        &mut session,
        "from js import Date, performance\nDate.now() - performance.timeOrigin",
    )
    .unwrap()
    .parse()
    .unwrap();
    assert!(since_origin < 1000.0, "time origin {since_origin} ms ago");
    run(
        &mut session,
        "x = 41\nimport json\nopen('kept.txt', 'w').write('yes')",
    );
    let image = session.save_image().unwrap();
    drop(session);

    // Parked, then finished from that session's image.
    let parked = engine.park_session().unwrap();
    let mut restored = engine.restore_session(Some(parked), image).unwrap();
    assert_eq!(run(&mut restored, "x + 1").as_deref(), Some("42"));
    assert_eq!(
        run(&mut restored, "open('kept.txt').read() + json.dumps(1)").as_deref(),
        Some("yes1")
    );
    // Saveable again, and restorable without parking.
    run(&mut restored, "x = 99");
    let again = restored.save_image().unwrap();
    drop(restored);
    let mut third = engine.restore_session(None, again).unwrap();
    assert_eq!(run(&mut third, "x").as_deref(), Some("99"));
    drop(third);

    // A parked sandbox given an image that does not restore is refused, not half-booted.
    let parked = engine.park_session().unwrap();
    let mut foreign = fresh_image(engine);
    foreign.base = Some("plain:not-this-build".into());
    assert!(engine.restore_session(Some(parked), foreign).is_err());
}

/// An image of a fresh session (for tests that change it).
fn fresh_image(engine: &code_interpreter_mcp::sandbox::Engine) -> SessionImage {
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(&mut session, "y = 1");
    session.save_image().unwrap()
}

#[test]
fn what_an_image_does_not_carry_is_refused_with_the_reason() {
    let engine = crate::common::engine();
    // A sandbox not booted to be saved.
    let mut plain = engine.boot_flavor(Flavor::Plain).unwrap();
    plain.keep_for_session();
    run(&mut plain, "x = 1");
    let error = plain.save_image().unwrap_err();
    assert!(
        matches!(
            error,
            code_interpreter_mcp::sandbox::SessionSandboxError::Unsaveable(_)
        ),
        "{error:?}"
    );
    let error = error.to_string();
    assert!(error.contains("not booted to be saved"), "{error}");

    // A JavaScript object held from Python.
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(&mut session, "import js\nheld = js.Object.new()");
    let error = session.save_image().unwrap_err().to_string();
    assert!(error.contains("JavaScript object"), "{error}");
    // Letting go of it makes the session saveable again.
    run(&mut session, "del held");
    session.save_image().unwrap();
    // An object the code hung on the global object is still the code's own.
    run(
        &mut session,
        "js.globalThis.made = js.Object.new()\nheld = js.made",
    );
    let error = session.save_image().unwrap_err().to_string();
    assert!(error.contains("JavaScript object"), "{error}");

    // A package loaded from the package index during the session (not preinstalled: not in the
    // package layer a restore relinks from) is not carried.
    let mut numeric = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(&mut numeric, "import numpy as np\na = np.arange(10)");
    let error = numeric.save_image().unwrap_err().to_string();
    assert!(error.contains("preinstall_packages"), "{error}");
    assert_eq!(numeric.check_image(), Some(error));
    assert_eq!(
        run(&mut numeric, "int(a.sum())").as_deref(),
        Some("45"),
        "the session goes on"
    );
}

/// Code that catches the rejection of an awaited JavaScript promise (a refused `js.fetch`, say)
/// leaves the exception, its traceback and the frames of the call up to the runner for Python's
/// collector: the runner's frame holds none of the call's JavaScript functions once the call ends,
/// and the image's check collects before it judges, so the session can still be saved (found by
/// tests/it/secrets.rs).
#[test]
fn a_session_that_caught_a_rejected_javascript_promise_can_be_saved() {
    let engine = crate::common::engine();
    for code in [
        "import js\ntry:\n    await js.fetch('https://example.invalid/')\nexcept Exception as e:\n    seen = str(e)",
        "import js\ntry:\n    await js.Promise.reject(js.Error.new('no'))\nexcept Exception as e:\n    seen = str(e)",
    ] {
        let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
        run(&mut session, code);
        if let Err(error) = session.save_image() {
            panic!("{code}\n{error}");
        }
        assert!(run(&mut session, "seen").is_some());
    }
}
