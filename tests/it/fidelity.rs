//! A restored or forked session is exactly the session that was saved (issue 44, point 2): a table
//! of Python states, each set up in a session, then read in the session itself and in two sandboxes
//! restored from its image (as a spill/resume and as a fork restore it, the second finished from a
//! parked sandbox); every row reads the same in all three. What an image cannot carry is refused,
//! with the reason, instead of coming back different.

use std::collections::BTreeMap;
use std::time::Duration;

use code_interpreter_mcp::sandbox::{Engine, EngineSettings, ExecRequest, Flavor, Sandbox};

use crate::common::{engine_settings, temp_dir};

/// (row, set-up, read-out): the set-up runs once; the read-out is an expression whose value (its
/// repr) must be the same in the session and in its restored copies. Read-outs that move a state
/// on (a generator, a random stream) move it the same way in each.
const ROWS: &[(&str, &str, &str)] = &[
    (
        "random",
        "import random\nrandom.seed(7)\nrandom.random()",
        "[random.random() for _ in range(3)]",
    ),
    (
        "numpy RNGs",
        "import numpy as np\nrng = np.random.default_rng(3)\nnp.random.seed(5)\nrng.random()",
        "(rng.random(3).tolist(), np.random.rand(2).tolist())",
    ),
    (
        "generator",
        "gen = (i * i for i in range(10))\nnext(gen), next(gen)",
        "[next(gen), next(gen)]",
    ),
    (
        "closure",
        "def counter():\n    n = [0]\n    def inc():\n        n[0] += 1\n        return n[0]\n    return inc\ninc = counter()\ninc()",
        "[inc(), inc()]",
    ),
    (
        "class instance",
        "class Point:\n    def __init__(self):\n        self.v = [1, 2]\n    def norm(self):\n        return sum(x * x for x in self.v)\np = Point()\np.v.append(3)",
        "(type(p).__name__, p.v, p.norm(), isinstance(p, Point))",
    ),
    (
        "sys.modules entry",
        "import sys, types\nmine = types.ModuleType('mine')\nmine.k = 5\nsys.modules['mine'] = mine",
        "__import__('mine').k",
    ),
    (
        "os.chdir",
        "import os\nos.makedirs('sub', exist_ok=True)\nos.chdir('sub')",
        "os.getcwd()",
    ),
    (
        "environment variable",
        "os.environ['MY_VAR'] = 'v1'",
        "(os.environ.get('MY_VAR'), os.getenv('MY_VAR'))",
    ),
    (
        "warnings filter",
        "import warnings\nwarnings.simplefilter('error', DeprecationWarning)",
        "[(f[0], f[2].__name__) for f in warnings.filters[:2]]",
    ),
    (
        "decimal context",
        "import decimal\ndecimal.getcontext().prec = 5",
        "str(decimal.Decimal(1) / decimal.Decimal(7))",
    ),
    (
        "atexit handlers",
        "import atexit\natexit.register(print, 'bye')",
        "atexit._ncallbacks()",
    ),
    (
        "matplotlib figure in progress",
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3])\nax.set_title('in progress')",
        "(ax.get_title(), len(ax.lines), list(ax.lines[0].get_ydata()), fig.get_size_inches().tolist())",
    ),
    (
        "pandas option",
        "import pandas as pd\npd.set_option('display.max_rows', 7)\ndf = pd.DataFrame({'a': range(5)})",
        "(pd.get_option('display.max_rows'), int(df.a.sum()))",
    ),
    (
        "file under /tmp",
        "import tempfile\nwith tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as f:\n    f.write('kept in /tmp')\ntmp = f.name",
        "(tmp.startswith('/tmp/'), open(tmp).read())",
    ),
    (
        "file under /workspace",
        "with open('notes.txt', 'w') as f:\n    f.write('kept')",
        "open('notes.txt').read()",
    ),
];

/// States an image does not carry: (row, set-up, what the refusal says).
const REFUSED: &[(&str, &str, &str)] = &[
    (
        "open file",
        "f = open('data.txt', 'w')\nf.write('abc')",
        "file(s) open",
    ),
    (
        "asyncio pending work",
        "import asyncio\ntask = asyncio.ensure_future(asyncio.sleep(3600))",
        "asyncio",
    ),
    (
        "JavaScript object",
        "import js\nheld = js.Object.new()",
        "JavaScript object",
    ),
];

fn run(sandbox: &mut Sandbox, code: &str) -> String {
    crate::common::run_in(sandbox, code).unwrap_or_default()
}

/// Every row's read-out, by row.
fn read_out(sandbox: &mut Sandbox) -> BTreeMap<&'static str, String> {
    ROWS.iter()
        .map(|(row, _, read)| (*row, run(sandbox, &format!("repr({read})"))))
        .collect()
}

/// An engine whose package layer has numpy, pandas and matplotlib (a session image carries what it
/// imported from there).
fn engine() -> Engine {
    Engine::new(EngineSettings {
        preinstall_packages: vec!["pandas".into(), "matplotlib".into()],
        package_cache_dir: temp_dir("fidelity-cache"),
        ..engine_settings()
    })
    .expect("engine")
}

#[test]
fn every_state_reads_the_same_after_spill_resume_and_fork() {
    let engine = engine();
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    for (row, setup, _) in ROWS {
        let result = session.run(
            ExecRequest {
                code: (*setup).into(),
                timeout: Duration::from_secs(120),
                ..Default::default()
            },
            None,
        );
        assert!(result.error.is_none(), "{row}: {:?}", result.error);
        assert_eq!(session.check_image(), None, "{row}");
    }
    let image = session.save_image().unwrap();
    let expected = read_out(&mut session);
    drop(session);

    // (One sandbox at a time: a thread's isolates are entered and left in order.)
    for how in ["resumed", "forked"] {
        let parked = (how == "forked").then(|| engine.park_session().expect("a parked sandbox"));
        let mut sandbox = engine.restore_session(parked, image.clone()).unwrap();
        let got = read_out(&mut sandbox);
        let differ: Vec<String> = ROWS
            .iter()
            .filter(|(row, _, _)| got[row] != expected[row])
            .map(|(row, _, _)| format!("{row}: {} != {}", got[row], expected[row]))
            .collect();
        assert!(differ.is_empty(), "{how}: {differ:#?}");
    }
    println!("{} states identical: {expected:#?}", ROWS.len());
    // (Kept between the session's own calls too: its context variables persist.)
    assert_eq!(expected["decimal context"], "'0.14286'");

    // What is not carried is refused, with the reason; undone, the session is saveable again.
    for (row, setup, says) in REFUSED {
        let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
        run(&mut session, setup);
        let reason = session.check_image().unwrap_or_else(|| panic!("{row}"));
        assert!(reason.contains(says), "{row}: {reason}");
        assert!(session.save_image().is_err(), "{row}");
    }
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run(&mut session, "f = open('data.txt', 'w')\nf.write('abc')");
    run(&mut session, "f.close()");
    assert_eq!(session.check_image(), None);
}
