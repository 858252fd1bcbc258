//! Credentials from the configuration: a header or environment value written as a template
//! (`"Bearer ${GITHUB_TOKEN}"`, `"@/run/secrets/token"`) resolved at start-up into a [`Secret`],
//! whose `Debug` never shows it. Errors name the key and the variable or file, never a value.

use std::collections::BTreeMap;

/// A resolved credential. Only the transports read it (`expose`); it is never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// What the template took from the environment or a file (each `${NAME}`'s value, the file's
    /// contents): the parts that are secret even when the rest of the value is not.
    parts: Vec<String>,
}

/// Shortest part searched for in what comes back (shorter ones would match by chance).
pub const MIN_SEARCHED: usize = 4;

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// What must never come back from where the value is sent, to be refused or redacted: each
    /// part the template read from the environment or a file, or (when `whole_if_literal` and it
    /// read none) the whole value; parts shorter than [`MIN_SEARCHED`] are left out.
    pub fn needles(&self, whole_if_literal: bool) -> Vec<&str> {
        let parts: Vec<&str> = if self.parts.is_empty() && whole_if_literal {
            vec![self.value.as_str()]
        } else {
            self.parts.iter().map(String::as_str).collect()
        };
        parts
            .into_iter()
            .filter(|p| p.len() >= MIN_SEARCHED)
            .collect()
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
        let value = text.trim_end_matches(['\r', '\n']).to_string();
        return Ok(Secret {
            parts: vec![value.clone()],
            value,
        });
    }
    let mut out = String::with_capacity(template.len());
    let mut parts = Vec::new();
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
        parts.push(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(Secret { value: out, parts })
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
        assert_eq!(s.needles(false), ["s3cr3t"]);
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
        assert!(
            resolve("k", "plain $HOME")
                .unwrap()
                .needles(false)
                .is_empty()
        );
        assert_eq!(
            resolve("k", "plain $HOME").unwrap().needles(true),
            ["plain $HOME"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
