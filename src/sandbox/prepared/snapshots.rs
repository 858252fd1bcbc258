//! The memory snapshots sandboxes start from, and which one a call gets: [`Snapshots`] owns them by
//! their kind ([`Flavor`]). With `preimport_modules` there are two: the plain one, and the one with
//! those modules (and everything they imported) already imported, which costs more to restore (its
//! shared libraries are relinked). A call gets the second only if its code imports one of the
//! packages it holds, so `print(1)` never pays for pandas. The choice reads the code's import
//! statements; code that imports some other way (`importlib`, `exec`) runs in a plain sandbox and
//! imports as usual: the choice affects speed only, never what the code sees.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

pub use crate::sandbox::prepared::memory_snapshot::Flavor;
use crate::sandbox::prepared::memory_snapshot::{SharedSnapshot, SnapshotOrigin};

/// The snapshots of the engine, by kind, filled in once at start-up.
#[derive(Default)]
pub(crate) struct Snapshots {
    /// The plain snapshot (none in full boot), and where it came from.
    plain: OnceLock<(Arc<SharedSnapshot>, SnapshotOrigin)>,
    /// The snapshot with pre-imported modules, when there is a working one, and the packages it
    /// holds imported.
    preimported: OnceLock<(Arc<SharedSnapshot>, PreimportedSet)>,
}

impl Snapshots {
    pub fn set_plain(&self, snapshot: Arc<SharedSnapshot>, origin: SnapshotOrigin) {
        let _ = self.plain.set((snapshot, origin));
    }

    pub fn set_preimported(&self, snapshot: Arc<SharedSnapshot>, packages: PreimportedSet) {
        let _ = self.preimported.set((snapshot, packages));
    }

    /// The snapshot of `flavor`, if the engine has one.
    pub fn get(&self, flavor: Flavor) -> Option<&Arc<SharedSnapshot>> {
        match flavor {
            Flavor::Plain => self.plain.get().map(|(s, _)| s),
            Flavor::Preimported => self.preimported.get().map(|(s, _)| s),
        }
    }

    /// Where the plain snapshot came from.
    pub fn origin(&self) -> Option<SnapshotOrigin> {
        self.plain.get().map(|(_, origin)| *origin)
    }

    /// The kind of sandbox that serves `code` best.
    pub fn flavor_for(&self, code: &str) -> Flavor {
        match self.preimported.get() {
            Some((_, packages)) if packages.imported_by(code) => Flavor::Preimported,
            _ => Flavor::Plain,
        }
    }
}

/// The top-level packages imported in the snapshot with pre-imported modules.
#[derive(Debug, Default)]
pub(crate) struct PreimportedSet(HashSet<String>);

impl PreimportedSet {
    pub fn new(modules: impl IntoIterator<Item = String>) -> Self {
        Self(modules.into_iter().collect())
    }

    /// Whether `code` imports any of the packages (at top level or inside a block).
    pub fn imported_by(&self, code: &str) -> bool {
        imported_packages(code).any(|name| self.0.contains(name))
    }
}

/// The top-level package of every `import a.b, c as d` and `from a.b import c` statement in `code`
/// (relative imports have none).
fn imported_packages(code: &str) -> impl Iterator<Item = &str> {
    code.lines()
        .flat_map(|line| line.split(';'))
        .flat_map(move |statement| {
            let statement = statement.trim_start();
            let names: Vec<&str> = if let Some(rest) = keyword(statement, "import") {
                rest.split(',').filter_map(package).collect()
            } else if let Some(rest) = keyword(statement, "from") {
                package(rest).into_iter().collect()
            } else {
                Vec::new()
            };
            names
        })
}

/// The first component of the dotted name at the start of `name` (none for a relative import).
fn package(name: &str) -> Option<&str> {
    let name = name.trim_start();
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// What follows `word` and whitespace at the start of `statement`.
fn keyword<'a>(statement: &'a str, word: &str) -> Option<&'a str> {
    let rest = statement.strip_prefix(word)?;
    rest.starts_with(char::is_whitespace).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_statements_name_their_top_level_packages() {
        let code = "import os\nimport numpy as np, pandas.io\nfrom matplotlib import pyplot as plt\nif x:\n    import scipy.stats; from . import sibling\nfrom\tsklearn.linear_model import A\nimported = 1\nfromage = 2\n# import fake";
        let names: Vec<&str> = imported_packages(code).collect();
        assert_eq!(
            names,
            ["os", "numpy", "pandas", "matplotlib", "scipy", "sklearn"]
        );
    }

    #[test]
    fn a_call_gets_the_preimported_sandbox_only_when_it_imports_what_it_holds() {
        let set = PreimportedSet::new(["pandas".to_string(), "numpy".to_string()]);
        assert!(set.imported_by("import pandas as pd\npd.DataFrame()"));
        assert!(set.imported_by("def f():\n    from numpy import arange\n"));
        assert!(!set.imported_by("print(1)"));
        assert!(!set.imported_by("import pandasx\nimport os"));
        assert!(!set.imported_by("x = 'import pandas'"));
    }
}
