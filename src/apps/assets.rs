//! The views' two third-party scripts, pinned: plotly.js (the cartesian bundle, the version the
//! plotly wheel of the package mirror is built against) and the extension's app library
//! (`App`, the view side of the MCP Apps bridge). Both come from npm, are read once at start-up,
//! and must match the sha256 digests below, as the Pyodide files must match their pinned version.
//! [`compose`] puts a view together: one self-contained HTML document whose Content Security
//! Policy allows exactly its own two scripts (by hash) and nothing from the network.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::{URI_PREFIX, View};

/// One pinned script: its npm package, its path in the package, the name it has in an asset
/// directory, and its digest.
struct Pinned {
    package: &'static str,
    in_package: &'static str,
    file: &'static str,
    sha256: &'static str,
}

const PLOTLY: Pinned = Pinned {
    package: "plotly.js-cartesian-dist-min@4.1.1",
    in_package: "plotly.js-cartesian-dist-min/plotly-cartesian.min.js",
    file: "plotly-cartesian.min.js",
    sha256: "79542150855a52c567260e3137095dbe2b744e6d702a5cabe67da246942fba7a",
};

const APP: Pinned = Pinned {
    package: "@modelcontextprotocol/ext-apps@2.0.4",
    in_package: "@modelcontextprotocol/ext-apps/dist/src/app-with-deps.js",
    file: "app-with-deps.js",
    sha256: "d24b6ae50dbc989539db8287e217f41f0833f2b0a81ac4c6dbde444715ef5cd0",
};

/// Why the views cannot be composed.
#[derive(Debug, thiserror::Error)]
pub enum AppsError {
    #[error(
        "the MCP Apps views need {file} from npm {package}, not found at {path} (run `npm ci` in the \
         project directory, point results.apps_asset_dir / CODE_INTERPRETER_MCP_RESULTS_APPS_ASSET_DIR at a \
         directory holding it, or turn the views off with results.apps = false)"
    )]
    Missing {
        file: &'static str,
        package: &'static str,
        path: PathBuf,
    },
    #[error("cannot read {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not npm {package}'s {file} (sha256 {found}, expected {expected}); reinstall it \
         with `npm ci`, or turn the views off with results.apps = false"
    )]
    Mismatch {
        path: PathBuf,
        file: &'static str,
        package: &'static str,
        found: String,
        expected: &'static str,
    },
    #[error("cannot compose the {view} view: {reason}")]
    Compose { view: &'static str, reason: String },
}

/// The two scripts, checked.
#[derive(Debug)]
pub struct Scripts {
    plotly: String,
    app: String,
}

impl Scripts {
    /// Reads both scripts from `dir` (flat, by file name), or else from their npm packages
    /// ([`crate::assets::npm_path`]).
    pub fn load(dir: Option<&Path>) -> Result<Self, AppsError> {
        Ok(Self {
            plotly: read(&PLOTLY, dir)?,
            app: read(&APP, dir)?,
        })
    }
}

fn read(pinned: &Pinned, dir: Option<&Path>) -> Result<String, AppsError> {
    let path = match dir {
        Some(dir) => dir.join(pinned.file),
        None => crate::assets::npm_path(pinned.in_package),
    };
    if !path.is_file() {
        return Err(AppsError::Missing {
            file: pinned.file,
            package: pinned.package,
            path,
        });
    }
    let bytes = std::fs::read(&path).map_err(|source| AppsError::Unreadable {
        path: path.clone(),
        source,
    })?;
    let found = hex::encode(Sha256::digest(&bytes));
    if found != pinned.sha256 {
        return Err(AppsError::Mismatch {
            path,
            file: pinned.file,
            package: pinned.package,
            found,
            expected: pinned.sha256,
        });
    }
    // The digest pins the content, and the pinned files are UTF-8.
    String::from_utf8(bytes).map_err(|_| AppsError::Mismatch {
        path,
        file: pinned.file,
        package: pinned.package,
        found: "not UTF-8".into(),
        expected: pinned.sha256,
    })
}

/// The app library is an ES module that ends in one `export{local as Name,…}`; a view's code
/// follows it in the same inline module (inline modules cannot import each other, and `blob:` or
/// `data:` module URLs would need sources the policy refuses), so the export becomes
/// `const ExtApps={Name:local,…};`.
fn app_as_object(app: &str) -> Result<String, String> {
    let body = app.trim_end();
    let at = body
        .rfind("export{")
        .ok_or("the app library has no export list")?;
    let list = body[at + "export{".len()..]
        .strip_suffix("};")
        .ok_or("the app library does not end with its export list")?;
    if body[..at].contains("export{") {
        return Err("the app library has more than one export list".into());
    }
    let identifier = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    let mut fields = Vec::new();
    for item in list.split(',') {
        let (local, name) = match item.split_once(" as ") {
            Some((local, name)) => (local.trim(), name.trim()),
            None => (item.trim(), item.trim()),
        };
        if !identifier(local) || !identifier(name) {
            return Err(format!("unexpected export {item:?}"));
        }
        fields.push(format!("{name}:{local}"));
    }
    Ok(format!(
        "{}\nconst ExtApps={{{}}};\n",
        &body[..at],
        fields.join(",")
    ))
}

/// `'sha256-…'`, the policy source allowing one inline script.
fn hash_source(script: &str) -> String {
    let digest = Sha256::digest(script.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The view's own policy, whatever the host's is (policies intersect, so a laxer host cannot
/// loosen it): its two scripts by hash, inline styles (plotly.js inserts style rules), images and
/// fonts from `data:` only, no network, frames, workers, plugins, base URL or forms.
fn policy(scripts: &[&str]) -> String {
    let hashes: Vec<String> = scripts.iter().map(|s| hash_source(s)).collect();
    format!(
        "default-src 'none'; script-src {}; style-src 'unsafe-inline'; img-src data:; \
font-src data:; connect-src 'none'; frame-src 'none'; child-src 'none'; worker-src 'none'; \
object-src 'none'; media-src 'none'; manifest-src 'none'; base-uri 'none'; form-action 'none'",
        hashes.join(" ")
    )
}

/// What a view is made of, beside the scripts.
pub struct Parts<'a> {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub css: &'a str,
    /// The view's module code (after the app library's).
    pub code: &'a str,
    /// Whether the view carries plotly.js (as inert text its code runs for a figure).
    pub plotly: bool,
}

/// One view: its stylesheet and code with the scripts, in one HTML document.
pub fn compose(scripts: &Scripts, parts: Parts<'_>) -> Result<View, AppsError> {
    let Parts {
        name,
        title,
        description,
        css,
        code,
        plotly: with_plotly,
    } = parts;
    let fail = |reason: String| AppsError::Compose { view: name, reason };
    let module = format!("{}{code}", app_as_object(&scripts.app).map_err(fail)?);
    for (what, text, closing) in [
        ("plotly.js", scripts.plotly.as_str(), "</script"),
        ("the module", module.as_str(), "</script"),
        ("the stylesheet", css, "</style"),
    ] {
        let lower = text.to_ascii_lowercase();
        if lower.contains(closing) || lower.contains("<!--") {
            return Err(fail(format!("{what} contains {closing} or <!--")));
        }
        // The HTML parser rewrites these, and the hash would no longer match the script it runs.
        if text.contains(['\r', '\0']) {
            return Err(fail(format!("{what} contains a carriage return or NUL")));
        }
    }
    // plotly.js is inert text until a result has a figure: the view then runs it as a script of
    // its own (allowed by the same hash). Compiling and running it is most of a first paint
    // (~0.55 s of ~1.1 s on the team's machine), and most results have no figure.
    let (csp, plotly) = if with_plotly {
        let csp = policy(&[scripts.plotly.as_str(), module.as_str()]);
        let text = &scripts.plotly;
        let element =
            format!("<script type=\"text/x-deferred\" id=\"plotly-source\">{text}</script>\n");
        (csp, element)
    } else {
        (policy(&[module.as_str()]), String::new())
    };
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<title>{title}</title>\n<style>{css}</style>\n</head>\n<body>\n<main id=\"view\"></main>\n\
{plotly}<script type=\"module\">{module}</script>\n</body>\n</html>\n"
    );
    let digest = hex::encode(Sha256::digest(html.as_bytes()));
    Ok(View {
        uri: format!("{URI_PREFIX}{name}-{}.html", &digest[..12]),
        name,
        title,
        description,
        html: html.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_export_list_becomes_an_object() {
        let out = app_as_object("var a=1,b=2;export{a as App,b};\n").unwrap();
        assert_eq!(out, "var a=1,b=2;\nconst ExtApps={App:a,b:b};\n");
        assert!(app_as_object("var a=1;").is_err());
        assert!(app_as_object("export{a};export{b};").is_err());
        assert!(app_as_object("export{a as x.y};").is_err());
        assert!(app_as_object("export{a};alert(1)").is_err());
    }

    #[test]
    fn a_script_that_could_close_its_element_is_refused() {
        let scripts = Scripts {
            plotly: "var p=1;".into(),
            app: "var a=1;export{a as App};".into(),
        };
        for code in ["x='</script>'", "x='</SCRIPT '", "x='<!--'"] {
            assert!(compose(&scripts, parts("", code, true)).is_err(), "{code}");
        }
        assert!(compose(&scripts, parts("</style>", "", true)).is_err());
        let view = compose(&scripts, parts("b{}", "go()", true)).unwrap();
        assert!(
            view.uri.starts_with("ui://code-interpreter-mcp/t-"),
            "{}",
            view.uri
        );
        let module = "var a=1;\nconst ExtApps={App:a};\ngo()";
        assert!(view.html.contains(&hash_source(module)), "{}", view.html);
        assert!(view.html.contains(&hash_source("var p=1;")));
        assert!(view.html.contains("connect-src 'none'"));
        // Without plotly.js: neither its text nor its hash.
        let view = compose(&scripts, parts("b{}", "go()", false)).unwrap();
        assert!(!view.html.contains(&hash_source("var p=1;")));
        assert!(!view.html.contains("var p=1;"));
        assert!(view.html.contains(&hash_source(module)));
    }

    fn parts<'a>(css: &'a str, code: &'a str, plotly: bool) -> Parts<'a> {
        Parts {
            name: "t",
            title: "T",
            description: "d",
            css,
            code,
            plotly,
        }
    }
}
