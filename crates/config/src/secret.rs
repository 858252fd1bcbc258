//! Credentials from the configuration: a header or environment value written as a template
//! (`"Bearer ${GITHUB_TOKEN}"`, `"@/run/secrets/token"`) resolved at start-up into a [`Secret`],
//! whose `Debug` never shows it. Errors name the key and the variable or file, never a value.

use std::collections::BTreeMap;

/// A resolved credential. Only the transports read it (`expose`); it is never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Resolves `template` for `key` (named in errors): `@PATH` is the file's contents without the
/// trailing line break; otherwise each `${NAME}` is replaced by that environment variable.
pub fn resolve(key: &str, template: &str) -> Result<Secret, String> {
    if let Some(path) = template.strip_prefix('@') {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{key}: cannot read the file {path}: {}", e.kind()))?;
        return Ok(Secret(text.trim_end_matches(['\r', '\n']).to_string()));
    }
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{key}: an unclosed ${{ in the value"))?;
        let name = &after[..end];
        let value = std::env::var(name)
            .map_err(|_| format!("{key}: the environment variable {name} is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(Secret(out))
}

/// Every value of `map` resolved (keys named `{prefix}.{name}` in errors).
pub fn resolve_all(
    prefix: &str,
    map: &BTreeMap<String, String>,
) -> Result<Vec<(String, Secret)>, String> {
    map.iter()
        .map(|(name, template)| {
            Ok((
                name.clone(),
                resolve(&format!("{prefix}.{name}"), template)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_resolve_without_showing_values() {
        // SAFETY (test): the variable's name is unique to this test.
        unsafe { std::env::set_var("CIM_SECRET_TEST_TOKEN", "s3cr3t") };
        let s = resolve("k", "Bearer ${CIM_SECRET_TEST_TOKEN}!").unwrap();
        assert_eq!(s.expose(), "Bearer s3cr3t!");
        assert_eq!(format!("{s:?}"), "<redacted>");
        let e = resolve("upstream.x.headers.A", "${CIM_SECRET_TEST_MISSING}").unwrap_err();
        assert!(e.contains("CIM_SECRET_TEST_MISSING") && e.contains("upstream.x.headers.A"));
        let dir = std::env::temp_dir().join(format!("cim-secret-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let s = resolve("k", &format!("@{}", file.display())).unwrap();
        assert_eq!(s.expose(), "from-file");
        assert!(
            resolve("k", "@/nonexistent/x")
                .unwrap_err()
                .contains("/nonexistent/x")
        );
        assert_eq!(resolve("k", "plain $HOME").unwrap().expose(), "plain $HOME");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
