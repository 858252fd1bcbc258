//! Security scope: no host globals, no host file system, no host environment, no module loading, and
//! network only through the allowlisted HTTPS fetch.

use crate::common::{ok, run};

#[test]
fn host_globals_are_unreachable_from_python() {
    let r = run(
        "import js\n[n for n in ('Deno', 'process', 'Bun', 'require', '__bootstrap', 'read', 'load', 'window', 'os', '__sandboxEntry', '__sandboxPreload') if hasattr(js, n)]",
    );
    assert_eq!(ok(&r).result.as_deref(), Some("[]"));
    let r = run("import js\njs.Deno.core");
    let e = r.error.expect("js.Deno must not exist");
    assert_eq!(e.error_type, "AttributeError");
}

#[test]
fn host_globals_are_unreachable_from_javascript_evaluated_by_python() {
    let r = run(
        "import js\njs.eval(\"[typeof Deno, typeof process, typeof Bun, typeof require, typeof __bootstrap, typeof Function('return this')().Deno].join()\")",
    );
    assert_eq!(
        ok(&r).result.as_deref(),
        Some("undefined,undefined,undefined,undefined,undefined,undefined")
    );
}

#[test]
fn native_file_system_mounts_are_gone() {
    let r = run(
        "import pyodide_js\n[hasattr(pyodide_js, 'mountNodeFS'), hasattr(pyodide_js, 'mountNativeFS'), sorted(pyodide_js.FS.filesystems.object_keys())]",
    );
    assert_eq!(ok(&r).result.as_deref(), Some("[False, False, ['MEMFS']]"));
}

#[test]
fn modules_cannot_be_imported_from_javascript() {
    let r = run(
        "import js\nawait js.eval(\"Promise.all(['file:///etc/passwd', 'ext:core/mod.js', 'node:fs', 'https://example.com/x.js'].map(u => import(u).then(() => 'loaded', () => 'refused')))\")",
    );
    let out = ok(&r).result.clone().unwrap();
    assert_eq!(out, "refused,refused,refused,refused");
}

#[test]
fn the_host_file_system_is_invisible() {
    let r = run(
        "import os\nresults = []\nfor p in ('/etc/passwd', '/proc/self/environ', '/root'):\n    results.append(os.path.exists(p))\nresults",
    );
    assert_eq!(ok(&r).result.as_deref(), Some("[False, False, False]"));
    let r = run("open('/etc/passwd').read()");
    assert_eq!(r.error.unwrap().error_type, "FileNotFoundError");
}

#[test]
fn the_host_environment_is_invisible() {
    // Cargo sets these on every test process.
    let host_value = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let r = run("import os\ndict(os.environ)");
    let env = ok(&r).result.clone().unwrap();
    assert!(!env.contains("CARGO_MANIFEST_DIR"), "{env}");
    assert!(!env.contains(&host_value), "{env}");
}

#[test]
fn fetch_refuses_hosts_off_the_allowlist_and_plain_http() {
    let r = run(
        "import js\ntry:\n    await js.fetch('https://example.com/')\nexcept Exception as e:\n    err = str(e)\nerr",
    );
    let msg = ok(&r).result.clone().unwrap();
    assert!(
        msg.contains("host not on the allowlist: example.com"),
        "{msg}"
    );

    let r = run(
        "from pyodide.http import pyfetch\ntry:\n    await pyfetch('http://pypi.org/simple/')\nexcept Exception as e:\n    err = str(e)\nerr",
    );
    let msg = ok(&r).result.clone().unwrap();
    assert!(msg.contains("only https:// URLs"), "{msg}");
}

#[test]
fn javascript_console_output_goes_to_the_sandbox_stderr() {
    let r = run("import js\njs.console.log('from js')");
    assert_eq!(ok(&r).stderr, "from js\n");
}
