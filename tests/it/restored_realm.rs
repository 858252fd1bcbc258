//! A restored or forked session reaches nothing a fresh sandbox cannot (issue 44, point 1): what an
//! image names of the JavaScript world is decided in Rust before a restore starts; the session's
//! own Python, which runs while Pyodide restores it, finds the realm already sealed; every boot path
//! (fresh, parked then finished, restored, restored again as a fork is) ends with the same realm
//! check; and whether a session is saveable does not depend on anything its code can patch.

use code_interpreter_mcp::sandbox::{Flavor, SessionImage};

use crate::common::run_in as run;

/// The realm as user code sees it: its globals, and whether deno_core's objects are reachable.
const REALM: &str = "import js\n\
    names = sorted(str(n) for n in js.Object.getOwnPropertyNames(js.globalThis))\n\
    ' '.join(names) + ' | Memory=' + str(hasattr(js.WebAssembly, 'Memory'))";

#[test]
fn every_boot_path_ends_in_the_same_realm() {
    let engine = crate::common::engine();
    let mut fresh = engine.boot_flavor(Flavor::Plain).unwrap();
    fresh.keep_for_session();
    let expected = run(&mut fresh, REALM).unwrap();
    drop(fresh);
    for host in ["Deno", "__bootstrap", "__infra", "read ", "load "] {
        assert!(!expected.contains(host), "{host}: {expected}");
    }
    assert!(expected.ends_with("Memory=False"), "{expected}");

    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    assert_eq!(
        run(&mut session, REALM).as_ref(),
        Some(&expected),
        "fresh session"
    );
    run(&mut session, "x = 1");
    let image = session.save_image().unwrap();
    drop(session);

    let parked = engine.park_session().expect("a snapshot engine parks");
    let mut unparked = engine
        .boot_session_flavor(Some(parked), Flavor::Plain)
        .unwrap();
    assert_eq!(
        run(&mut unparked, REALM).as_ref(),
        Some(&expected),
        "parked"
    );
    drop(unparked);

    let mut restored = engine.restore_session(None, image.clone()).unwrap();
    assert_eq!(
        run(&mut restored, REALM).as_ref(),
        Some(&expected),
        "restored"
    );
    drop(restored);

    // A fork is a restore of the same image into a parked sandbox.
    let parked = engine.park_session().unwrap();
    let mut forked = engine.restore_session(Some(parked), image).unwrap();
    assert_eq!(run(&mut forked, REALM).as_ref(), Some(&expected), "forked");
}

/// `image` with its record of held JavaScript objects replaced by `held` (JSON), as a forged or
/// tampered image would carry it.
fn with_held(image: &SessionImage, held: &str) -> SessionImage {
    let memory = &image.memory[..];
    assert_eq!(&memory[..8], b"CIMDLT\0\x01", "a delta image");
    let header_len = u64::from_le_bytes(memory[8..16].try_into().unwrap()) as usize;
    let header = &memory[16..16 + header_len];
    let rest = &memory[16 + header_len..];
    let json = format!(r#"{{"hiwireKeys":{held},"immortalKeys":[]}}"#);
    let size = (48 + json.len()).div_ceil(16) * 16;
    let mut forged = vec![0u8; size];
    forged[..48].copy_from_slice(&header[..48]);
    forged[4..8].copy_from_slice(&(size as u32).to_le_bytes());
    forged[8..12].copy_from_slice(&(json.len() as u32).to_le_bytes());
    forged[48..48 + json.len()].copy_from_slice(json.as_bytes());
    let mut out = memory[..8].to_vec();
    out.extend_from_slice(&(size as u64).to_le_bytes());
    out.extend_from_slice(&forged);
    out.extend_from_slice(rest);
    SessionImage {
        memory: out.into(),
        ..image.clone()
    }
}

#[test]
fn an_image_naming_what_a_user_realm_lacks_is_refused_before_it_restores() {
    let engine = crate::common::engine();
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(&mut session, "from js import Math\nm = Math");
    let image = session.save_image().unwrap();
    drop(session);
    for held in [
        r#"[{"serialized":["__bootstrap"]}]"#,
        r#"[{"serialized":["Deno","core"]}]"#,
        r#"[{"serialized":["Math","floor","call"]}]"#,
        r#"[{"path":["__bootstrap"]}]"#,
        r#"[{"serialized":"stdin"}]"#,
        r#"[{"API":true,"path":["__bootstrap"]}]"#,
        r#"[{"other":1}]"#,
    ] {
        let forged = with_held(&image, held);
        let error = engine
            .restore_session(None, forged.clone())
            .err()
            .unwrap_or_else(|| panic!("{held} was restored"));
        assert!(
            error.to_string().contains("JavaScript object"),
            "{held}: {error}"
        );
        let parked = engine.park_session().unwrap();
        assert!(
            engine.restore_session(Some(parked), forged).is_err(),
            "{held}"
        );
    }
    // What the boot can name comes back (the image as it was made).
    let mut restored = engine.restore_session(None, image).unwrap();
    assert_eq!(run(&mut restored, "m.floor(1.5)").as_deref(), Some("1"));
}

#[test]
fn a_patched_serializer_changes_neither_the_image_nor_whether_it_can_be_made() {
    let engine = crate::common::engine();
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    // The attack of the review: Pyodide's serializer made to name deno_core's bootstrap, and the
    // hiwire reader made to hide what Python holds.
    run(
        &mut session,
        "import js, pyodide_js\n\
         from pyodide.ffi import create_proxy\n\
         forged = js.JSON.parse('{\"hiwireKeys\":[{\"serialized\":[\"__bootstrap\"]}],\"immortalKeys\":[]}')\n\
         pyodide_js._api.serializeHiwireState = create_proxy(lambda *a: forged)\n\
         pyodide_js._module.__hiwire_get = create_proxy(lambda i: (_ for _ in ()).throw(Exception()))\n\
         pyodide_js._api.getExpectedKeys = create_proxy(lambda: [])\n\
         held = js.Object.new()",
    );
    let error = session.check_image().expect("holding a JavaScript object");
    assert!(error.contains("JavaScript object"), "{error}");
    assert!(session.save_image().is_err());
    let mut clean = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(
        &mut clean,
        "import pyodide_js\n\
         pyodide_js._api.serializeHiwireState = None\n\
         pyodide_js._api.makeSnapshot = None\n\
         x = 7",
    );
    assert_eq!(clean.check_image(), None);
    let image = clean.save_image().unwrap();
    let mut restored = engine.restore_session(None, image).unwrap();
    assert_eq!(
        run(&mut restored, "import js\nx, hasattr(js, '__bootstrap')").as_deref(),
        Some("(7, False)")
    );
}

/// Python that Pyodide runs while it restores the session: it sets `LD_LIBRARY_PATH` through the
/// restored `os.environ`, whose class the session replaced. It records the globals it sees and
/// tries to make a memory of its own; `extra` runs there too (`restore_again()` asks for the memory
/// to be restored once more).
fn hook(extra: &str) -> String {
    format!(
        "import os, js\n\
         seen = []\n\
         def restore_again():\n\
         \x20   import pyodide_js\n\
         \x20   module = pyodide_js._module\n\
         \x20   try:\n\
         \x20       module.sandboxRestoreMemory(module.HEAP8)\n\
         \x20       return 'restored again'\n\
         \x20   except Exception:\n\
         \x20       return 'no second restore'\n\
         class Env(type(os.environ)):\n\
         \x20   def __setitem__(self, key, value):\n\
         \x20       if key == 'LD_LIBRARY_PATH':\n\
         \x20           seen.append(' '.join(sorted(str(n) for n in js.Object.getOwnPropertyNames(js.globalThis))))\n\
         \x20           try:\n\
         \x20               js.WebAssembly.Memory.new(js.JSON.parse('{{\"initial\":1,\"maximum\":65536}}'))\n\
         \x20               seen.append('made a memory')\n\
         \x20           except Exception as e:\n\
         \x20               seen.append('no memory')\n\
         {extra}\n\
         \x20           import gc\n\
         \x20           gc.collect()\n\
         \x20       super().__setitem__(key, value)\n\
         os.environ.__class__ = Env\n"
    )
}

/// The image of a session that set up [`hook`] with `extra`.
fn hooked(engine: &code_interpreter_mcp::sandbox::Engine, extra: &str) -> SessionImage {
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(&mut session, &hook(extra));
    session.save_image().unwrap()
}

#[test]
fn python_a_restore_runs_finds_the_realm_already_sealed() {
    let engine = crate::common::engine();
    let image = hooked(engine, "");
    let mut restored = engine.restore_session(None, image).unwrap();
    let seen = run(&mut restored, "'\\n'.join(seen)").unwrap();
    assert!(
        seen.contains("Array"),
        "the hook ran during the restore: {seen}"
    );
    for host in ["Deno", "__bootstrap", "__infra", "__timers"] {
        assert!(
            !seen.contains(host),
            "{host} reachable during the restore: {seen}"
        );
    }
    assert!(seen.ends_with("no memory"), "{seen}");
    drop(restored);

    // The memory restored a second time, as the restore's Python asks: refused. (What that Python
    // holds afterwards may fail the boot's own check: then its output is in the error.)
    let image = hooked(
        engine,
        "\x20           seen.append(restore_again())\n\x20           print(seen[-1], flush=True)",
    );
    match engine.restore_session(None, image) {
        Ok(mut restored) => {
            let seen = run(&mut restored, "'\\n'.join(seen)").unwrap();
            assert!(seen.ends_with("no second restore"), "{seen}");
        }
        Err(error) => assert!(error.to_string().contains("no second restore"), "{error}"),
    }

    // A global the restore's Python makes permanent fails the realm check: the image is refused.
    let image = hooked(
        engine,
        "\x20           js.Object.defineProperty(js.globalThis, 'leak', js.JSON.parse('{\"value\":1,\"configurable\":false}'))",
    );
    let error = engine.restore_session(None, image).err().expect("refused");
    assert!(
        error
            .to_string()
            .contains("a global a fresh sandbox does not (\"leak\")"),
        "{error}"
    );
}
