//! Packages: imports that auto-load Pyodide packages, micropip, the preinstalled package layer (built,
//! reused without downloads, rebuilt), the disabled installation policy, wheel verification, a private
//! HTTPS index trusted through extra_ca_certs, and the allowlist.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use code_interpreter_mcp::sandbox::layer::LayerOrigin;
use code_interpreter_mcp::sandbox::{Engine, EngineSettings};

use crate::common::{
    engine_settings, ok, package_mirror, request, returned_file, run, run_with, temp_dir,
};

/// A directory holding hard links (or copies) of the named mirror wheels.
fn partial_mirror(name: &str, prefixes: &[&str]) -> PathBuf {
    let dir = temp_dir(name);
    for entry in std::fs::read_dir(package_mirror()).unwrap() {
        let entry = entry.unwrap();
        let file = entry.file_name().to_string_lossy().into_owned();
        if prefixes.iter().any(|p| file.starts_with(&format!("{p}-"))) {
            let target = dir.join(&file);
            if std::fs::hard_link(entry.path(), &target).is_err() {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    dir
}

fn exec(engine: &Engine, code: &str) -> code_interpreter_mcp::sandbox::ExecResult {
    engine.execute(request(code))
}

#[test]
fn pandas_and_matplotlib_load_from_their_imports() {
    // Importing both takes several seconds, many more when the other tests load the machine.
    let result = run_with(
        r#"
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

frame = pd.DataFrame({"value": [1, 2, 3]})
plt.plot(frame["value"])
plt.savefig("plot.png")
frame["value"].sum()
"#,
        &[],
        std::time::Duration::from_secs(120),
    );
    let result = ok(&result);
    assert_eq!(result.result.as_deref(), Some("6"));
    let bytes = returned_file(result, "plot.png");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

#[test]
fn the_spec_results_csv_example_returns_the_file() {
    let result = run(r#"import pandas as pd

frame = pd.DataFrame({"value": [1, 2, 3]})
frame.loc[frame["value"] > 1].to_csv("results.csv", index=False)
"#);
    let text = returned_file(ok(&result), "results.csv");
    assert_eq!(String::from_utf8(text).unwrap(), "value\n2\n3\n");
}

#[test]
fn micropip_is_preloaded_and_hosts_off_the_allowlist_are_refused() {
    let result = run(r#"
import micropip
from pyodide.http import pyfetch

errors = []
try:
    await pyfetch("https://example.com/")
except Exception as e:
    errors.append(str(e))
try:
    await micropip.install("https://example.com/tiny-1.0-py3-none-any.whl")
except Exception as e:
    errors.append(str(e))
(micropip.__version__, errors)
"#);
    let text = ok(&result).result.clone().unwrap();
    assert!(text.starts_with("('0.11.1', ["), "{text}");
    assert_eq!(
        text.matches("host not on the allowlist: example.com")
            .count(),
        2,
        "{text}"
    );
}

/// The layer's directories are made when first looked up, but the layer looks whole: listed, walked,
/// read, not removable while it holds files, replaceable file by file.
#[test]
fn the_package_layer_looks_whole_though_its_directories_are_made_when_first_used() {
    let result = run(r#"
import errno, os, sys
sp = next(p for p in sys.path if p.endswith("site-packages"))
names = os.listdir(sp)
files = sum(len(f) for _, _, f in os.walk(os.path.join(sp, "micropip")))
try:
    os.rmdir(os.path.join(sp, "micropip"))
    removed = "removed"
except OSError as e:
    removed = e.errno == errno.ENOTEMPTY
with open(os.path.join(sp, "micropip", "__init__.py")) as f:
    policy = "_code_interpreter_mcp_policy" in f.read()
with open(os.path.join(sp, "micropip", "_version.py"), "w") as f:
    f.write("replaced")
with open(os.path.join(sp, "micropip", "_version.py")) as f:
    replaced = f.read()
("micropip" in names, any(n.endswith(".dist-info") for n in names), files > 30, removed, policy, replaced)
"#);
    assert_eq!(
        ok(&result).result.as_deref(),
        Some("(True, True, True, True, True, 'replaced')")
    );
    // The next sandbox has the layer's own file again.
    let result = run("import micropip, os
open(os.path.join(os.path.dirname(micropip.__file__), '_version.py')).read() != 'replaced'");
    assert_eq!(ok(&result).result.as_deref(), Some("True"));
}

/// Preinstallation: the layer is built once, reused on the next start without a single wheel read
/// (the mirror is emptied in between), rebuilt when the list changes; runtime installation disabled
/// keeps the preinstalled packages importable and refuses everything else.
#[test]
fn the_package_layer_is_built_reused_without_downloads_and_rebuilt_when_the_list_changes() {
    let mirror = partial_mirror(
        "layer-mirror",
        &[
            "micropip",
            "pandas",
            "numpy",
            "python_dateutil",
            "pytz",
            "six",
            "regex",
        ],
    );
    let cache = temp_dir("layer-cache");
    let config = |packages: &[&str]| EngineSettings {
        package_base_url: Some(mirror.display().to_string()),
        package_cache_dir: cache.clone(),
        preinstall_packages: packages.iter().map(|p| p.to_string()).collect(),
        runtime_package_installation: false,
        ..engine_settings()
    };

    let first = Engine::new(config(&["pandas"])).expect("layer built");
    assert_eq!(first.layer_origin(), Some(LayerOrigin::Built));
    drop(first);
    assert!(cache.join("layer/manifest.json").is_file());

    // A restart with the same list must not read a single wheel: take them all away.
    let saved = temp_dir("layer-mirror-saved");
    for entry in std::fs::read_dir(&mirror).unwrap() {
        let entry = entry.unwrap();
        std::fs::rename(entry.path(), saved.join(entry.file_name())).unwrap();
    }
    let second = Engine::new(config(&["pandas"])).expect("layer reused");
    assert_eq!(second.layer_origin(), Some(LayerOrigin::Reused));
    let result = exec(
        &second,
        r#"
import importlib
import micropip
refusals = []
for attempt in range(2):
    try:
        await micropip.install("snowballstemmer")
    except RuntimeError as e:
        refusals.append(str(e))
    importlib.reload(micropip)
import pyodide_js
try:
    await pyodide_js.loadPackage("regex")
except Exception as e:
    refusals.append(str(e))
from pyodide.http import pyfetch
try:
    await pyfetch("https://pypi.org/simple/")
except Exception as e:
    refusals.append(str(e))
try:
    import regex
except ImportError as e:
    refusals.append(type(e).__name__)
import pandas as pd
print("\n".join(refusals))
int(pd.DataFrame({"value": [1, 2, 3]})["value"].sum())
"#,
    );
    let result = ok(&result);
    assert_eq!(result.result.as_deref(), Some("6"));
    let lines: Vec<&str> = result.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert_eq!(lines[0], "Runtime package installation is disabled");
    assert_eq!(lines[1], "Runtime package installation is disabled");
    assert!(
        lines[2].contains("Runtime package installation is disabled"),
        "{lines:?}"
    );
    assert!(
        lines[3].contains("Runtime package installation is disabled"),
        "{lines:?}"
    );
    assert_eq!(lines[4], "ModuleNotFoundError");
    drop(second);

    // Another list: rebuilt, and holding only what the new list asks for.
    for entry in std::fs::read_dir(&saved).unwrap() {
        let entry = entry.unwrap();
        std::fs::rename(entry.path(), mirror.join(entry.file_name())).unwrap();
    }
    let third = Engine::new(config(&["regex"])).expect("layer rebuilt");
    assert_eq!(third.layer_origin(), Some(LayerOrigin::Built));
    let result = exec(
        &third,
        "import regex\ntry:\n    import pandas\nexcept ImportError as e:\n    print(type(e).__name__)\nregex.sub(r'\\d', '#', 'a1b2')",
    );
    let result = ok(&result);
    assert_eq!(result.result.as_deref(), Some("a#b#"));
    assert_eq!(result.stdout, "ModuleNotFoundError\n");
}

#[test]
fn an_unknown_preinstalled_package_stops_start_up_with_a_clear_message() {
    let error = match Engine::new(EngineSettings {
        package_cache_dir: temp_dir("layer-unknown"),
        preinstall_packages: vec!["no-such-package-cim-test".into()],
        ..engine_settings()
    }) {
        Ok(_) => panic!("an unknown package must stop start-up"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("preparing the package layer failed"),
        "{error}"
    );
    assert!(error.contains("no-such-package-cim-test"), "{error}");
}

#[test]
fn without_micropip_in_the_package_source_the_engine_starts_and_import_micropip_says_why() {
    // Nothing the operator asked for is missing (preinstall_packages is empty): start without micropip.
    let empty = temp_dir("empty-mirror");
    let engine = Engine::new(EngineSettings {
        package_base_url: Some(empty.display().to_string()),
        package_cache_dir: temp_dir("empty-mirror-cache"),
        ..engine_settings()
    })
    .expect("the engine starts");
    assert_eq!(
        engine.layer_origin(),
        Some(code_interpreter_mcp::sandbox::layer::LayerOrigin::Offline)
    );
    let result = exec(&engine, "import micropip");
    let error = result.error.expect("import micropip fails");
    assert_eq!(error.error_type, "ModuleNotFoundError");
    assert!(
        error.message.contains("micropip is unavailable")
            && error.message.contains("package_base_url"),
        "{error:?}"
    );
    assert!(exec(&engine, "import json").success);
    // A requirement the operator named that cannot be installed still stops start-up, naming the source.
    let error = match Engine::new(EngineSettings {
        package_base_url: Some(empty.display().to_string()),
        package_cache_dir: temp_dir("empty-mirror-cache-2"),
        preinstall_packages: vec!["six".into()],
        ..engine_settings()
    }) {
        Ok(_) => panic!("start-up must fail when a preinstalled package cannot be installed"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("package_base_url"), "{error}");
    assert!(error.contains(&empty.display().to_string()), "{error}");
}

#[test]
fn a_tampered_wheel_is_refused_with_a_sha256_mismatch_naming_the_package() {
    let mirror = partial_mirror("tampered-mirror", &["micropip"]);
    let six = std::fs::read(package_mirror().join("six-1.17.0-py2.py3-none-any.whl")).unwrap();
    let mut tampered = six.clone();
    tampered.extend_from_slice(b"tampered");
    std::fs::write(mirror.join("six-1.17.0-py2.py3-none-any.whl"), tampered).unwrap();
    let engine = Engine::new(EngineSettings {
        package_base_url: Some(mirror.display().to_string()),
        package_cache_dir: temp_dir("tampered-cache"),
        ..engine_settings()
    })
    .expect("engine");
    let result = exec(&engine, "import six");
    assert!(!result.success, "{result:#?}");
    assert!(
        result
            .stderr
            .contains("sha256 mismatch for package six (six-1.17.0-py2.py3-none-any.whl)"),
        "{result:#?}"
    );
    let error = result.error.unwrap();
    assert_eq!(error.error_type, "ModuleNotFoundError");
}

/// A throw-away CA, a server certificate for localhost signed by it, and a loopback HTTPS server
/// that answers as a PEP 691 simple index for one tiny wheel the test builds.
struct PrivateIndex {
    addr: SocketAddr,
    ca_pem_path: PathBuf,
    wheel_downloads: Arc<AtomicUsize>,
    _server: crate::tls::TlsServer,
}

fn tiny_wheel() -> (String, Vec<u8>) {
    let name = "cimtiny-1.0-py3-none-any.whl".to_string();
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        let options = zip::write::SimpleFileOptions::default();
        let files: [(&str, &str); 4] = [
            ("cimtiny/__init__.py", "VALUE = 42\n"),
            (
                "cimtiny-1.0.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: cimtiny\nVersion: 1.0\n",
            ),
            (
                "cimtiny-1.0.dist-info/WHEEL",
                "Wheel-Version: 1.0\nGenerator: code-interpreter-mcp-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            ),
            ("cimtiny-1.0.dist-info/RECORD", ""),
        ];
        for (path, text) in files {
            zip.start_file(path, options).unwrap();
            zip.write_all(text.as_bytes()).unwrap();
        }
        zip.finish().unwrap();
    }
    (name, buf.into_inner())
}

fn start_private_index(dir: &Path) -> PrivateIndex {
    use axum::http::header;
    use axum::response::IntoResponse;

    let (wheel_name, wheel) = tiny_wheel();
    let sha256 = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&wheel)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let wheel_downloads = Arc::new(AtomicUsize::new(0));
    let downloads = wheel_downloads.clone();
    let wheel = Arc::new(wheel);
    let server = crate::tls::TlsServer::start(dir, move |port| {
        axum::Router::new()
            .route(
                "/simple/cimtiny/",
                axum::routing::get(move || {
                    let body = serde_json::json!({
                        "meta": {"api-version": "1.1"},
                        "name": "cimtiny",
                        "versions": ["1.0"],
                        "files": [{
                            "filename": wheel_name,
                            "url": format!("https://localhost:{port}/files/{wheel_name}"),
                            "hashes": {"sha256": sha256},
                        }],
                    });
                    async move {
                        (
                            [(header::CONTENT_TYPE, "application/vnd.pypi.simple.v1+json")],
                            body.to_string(),
                        )
                            .into_response()
                    }
                }),
            )
            .route(
                "/files/{name}",
                axum::routing::get(move || {
                    downloads.fetch_add(1, Ordering::SeqCst);
                    let wheel = wheel.clone();
                    async move { (*wheel).clone().into_response() }
                }),
            )
    });
    PrivateIndex {
        addr: server.addr,
        ca_pem_path: server.ca_pem_path.clone(),
        wheel_downloads,
        _server: server,
    }
}

/// micropip installs from a private HTTPS index whose certificate only extra_ca_certs trusts; the
/// wheel is downloaded once and then served from the in-memory cache to the next sandbox.
#[test]
fn micropip_installs_from_a_private_https_index_trusted_through_extra_ca_certs() {
    let dir = temp_dir("private-index");
    let index = start_private_index(&dir);
    let index_url = format!("https://localhost:{}/simple", index.addr.port());
    let engine = Engine::new(EngineSettings {
        allowed_hosts: vec!["localhost".into()],
        extra_ca_certs: vec![index.ca_pem_path.clone()],
        package_index_urls: vec![index_url.clone()],
        ..engine_settings()
    })
    .expect("engine");
    let code = "import micropip\nawait micropip.install('cimtiny')\nimport cimtiny\ncimtiny.VALUE";
    for _ in 0..2 {
        let result = exec(&engine, code);
        assert_eq!(ok(&result).result.as_deref(), Some("42"));
    }
    assert_eq!(
        index.wheel_downloads.load(Ordering::SeqCst),
        1,
        "the second sandbox must get the wheel from the in-memory cache"
    );
    // A download that fails says so with its HTTP status.
    let missing = format!(
        "import micropip\ntry:\n    await micropip.install('https://localhost:{}/missing/gone-1.0-py3-none-any.whl')\nexcept Exception as e:\n    print(type(e).__name__, e)",
        index.addr.port()
    );
    let result = exec(&engine, &missing);
    let stdout = &ok(&result).stdout;
    assert!(
        stdout.starts_with("OSError download failed (HTTP 404) for https://localhost:"),
        "{stdout}"
    );

    // Without the extra CA the same index is not trusted.
    let untrusted = Engine::new(EngineSettings {
        allowed_hosts: vec!["localhost".into()],
        package_index_urls: vec![index_url],
        ..engine_settings()
    })
    .expect("engine");
    let result = exec(
        &untrusted,
        "from pyodide.http import pyfetch\nawait pyfetch('https://localhost:{}/simple/cimtiny/')"
            .replace("{}", &index.addr.port().to_string())
            .as_str(),
    );
    assert!(!result.success);
    let message = result.error.unwrap().message.to_lowercase();
    assert!(message.contains("certificate"), "{message}");
}

#[test]
fn an_unreadable_extra_ca_certificate_stops_start_up() {
    let missing = temp_dir("ca-missing").join("nope.pem");
    let error = match Engine::new(EngineSettings {
        extra_ca_certs: vec![missing.clone()],
        ..engine_settings()
    }) {
        Ok(_) => panic!("a missing CA file must stop start-up"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("extra_ca_certs"), "{error}");
    assert!(error.contains("nope.pem"), "{error}");
}

/// Opt-in: needs the real Python Package Index (`cargo test -- --ignored package_policy`).
#[test]
#[ignore = "needs network access to the Python Package Index"]
fn package_policy_in_fresh_sandboxes_installs_snowballstemmer_from_pypi() {
    let result = run(r#"
import micropip
await micropip.install("snowballstemmer")
import snowballstemmer
snowballstemmer.stemmer("english").stemWords(["running"])
"#);
    assert_eq!(ok(&result).result.as_deref(), Some("['run']"));
}

fn run_python_code_description(server: &crate::fixture::Server) -> String {
    crate::fixture::list_tools_stateless(server)
        .into_iter()
        .find(|t| t["name"] == "run_python_code")
        .expect("run_python_code listed")["description"]
        .as_str()
        .unwrap()
        .to_string()
}

/// tools/list states the policy: preinstalled packages by name only, micropip.install only when
/// runtime installation is enabled.
#[test]
fn the_tool_description_follows_the_package_policy() {
    let enabled = crate::fixture::Server::start(&[]);
    let text = run_python_code_description(&enabled);
    assert!(text.contains("micropip.install"), "{text}");
    assert!(!text.contains("Preinstalled"), "{text}");
    drop(enabled);

    let dir = temp_dir("description");
    let config = dir.join("policy.toml");
    std::fs::write(
        &config,
        "preinstall_packages = [\"six==1.17.0\", \"pytz >= 2020\"]\nruntime_package_installation = false\n",
    )
    .unwrap();
    let cache = dir.join("cache");
    let disabled = crate::fixture::Server::start_with_args(
        &["--config", config.to_str().unwrap()],
        &[(
            "CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR",
            cache.to_str().unwrap(),
        )],
    );
    let text = run_python_code_description(&disabled);
    assert!(text.contains("Preinstalled packages: six, pytz."), "{text}");
    assert!(!text.contains("micropip"), "{text}");
    assert!(!text.contains("1.17.0") && !text.contains("2020"), "{text}");
    assert!(text.contains("installation is disabled"), "{text}");
}

/// A package that cannot be installed stops the server before it binds, with the reason on stderr.
#[test]
fn a_failed_preinstallation_stops_the_server_before_it_binds() {
    let dir = temp_dir("failed-preinstall");
    let config = dir.join("bad.toml");
    std::fs::write(
        &config,
        format!(
            "preinstall_packages = [\"no-such-package-cim-test\"]\npackage_cache_dir = \"{}\"\n",
            dir.join("cache").display()
        ),
    )
    .unwrap();
    let out = crate::common::server_command()
        .args(["--config", config.to_str().unwrap()])
        .env("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0")
        .env_remove("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("listening"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("preparing the package layer failed"),
        "{stderr}"
    );
    assert!(stderr.contains("no-such-package-cim-test"), "{stderr}");
    assert!(!dir.join("cache/layer").exists());
}
