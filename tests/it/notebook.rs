//! Notebook-grade results through the real server in both protocol eras: notebook syntax (`%pip`,
//! `!pip`, `%time`, `%%time`, `%%capture`, `%who`, refused shell commands) with the user's line
//! numbers; `display()` and IPython's display protocol as ordered `displays` and content blocks;
//! DataFrames as bounded Markdown tables; plotly and seaborn figures captured; text sized for a model
//! with the whole kept; notebook cells copied from pandas' and seaborn's documentation running
//! unchanged.

use serde_json::{Value, json};

use crate::fixture::{LegacyClient, Server, call_stateless, package_mirror};
use crate::mirror_index::MirrorIndex;

fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

fn content(reply: &Value) -> &Vec<Value> {
    reply["result"]["content"]
        .as_array()
        .expect("content blocks")
}

fn mirror_index(name: &str) -> MirrorIndex {
    let lock = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("node_modules/pyodide/pyodide-lock.json"),
    )
    .unwrap();
    MirrorIndex::start(&package_mirror(), &lock, &crate::common::temp_dir(name))
}

#[test]
fn notebook_syntax_runs_with_the_users_line_numbers() {
    let server = Server::start(&[]);
    let code = "%matplotlib inline\ntext = '''\n%pip not a magic\n!not a command\n'''\n%time total = sum(range(1000))\n%timeit -n 10 -r 2 sum(range(10))\n%who\nprint('%d' % 7)\n(total, text.count('%'))";
    let r = structured(&call_stateless(&server, json!({"code": code}))).clone();
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(r["result"], "(499500, 1)");
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.contains("Wall time:"), "{stdout}");
    assert!(
        stdout.contains("per loop (mean ± std. dev. of 2 runs, 10 loops each)"),
        "{stdout}"
    );
    assert!(stdout.contains("text\ttotal"), "{stdout}");
    assert!(stdout.ends_with("7\n"), "{stdout}");

    let r = structured(&call_stateless(
        &server,
        json!({"code": "%%time\nx = 6\nx * 7"}),
    ))
    .clone();
    assert_eq!(r["result"], "42", "{r}");
    assert!(r["stdout"].as_str().unwrap().contains("Wall time:"), "{r}");

    let r = structured(&call_stateless(
        &server,
        json!({"code": "%%capture out\nprint('kept aside')\nout.stdout"}),
    ))
    .clone();
    assert_eq!(r["stdout"], "", "{r}");

    // Shell commands and unknown magics fail at their own line, with a clear Python error.
    for (code, line, says) in [
        (
            "x = 1\n\n!ls -la",
            3,
            "shell commands are not available in the sandbox: !ls -la",
        ),
        ("files = !ls", 1, "shell commands are not available"),
        (
            "\n%load_ext autoreload",
            2,
            "the magic %load_ext is not available in the sandbox",
        ),
        ("x = 1\n%%time", 2, "a cell magic must be the first line"),
    ] {
        let r = structured(&call_stateless(&server, json!({"code": code}))).clone();
        let error = &r["error"];
        assert_eq!(error["kind"], "python", "{code}: {r}");
        assert_eq!(error["type"], "UsageError", "{code}: {r}");
        assert!(
            error["message"].as_str().unwrap().contains(says),
            "{code}: {r}"
        );
        let traceback = error["traceback"].as_str().unwrap();
        assert!(
            traceback.contains(&format!("File \"<code>\", line {line}")),
            "{code}: {traceback}"
        );
        assert!(!traceback.contains("<sandbox-notebook>"), "{traceback}");
    }
}

#[test]
fn pip_magics_install_under_the_servers_policy() {
    let index = mirror_index("nb-pip-index");
    let envs = index.envs();
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::start(&envs);
    let r = structured(&call_stateless(
        &server,
        json!({"code": "!pip install -q tabulate==0.10.0\n%pip install tabulate\nimport tabulate\ntabulate.__version__", "timeout_ms": 60000}),
    ))
    .clone();
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(r["result"], "0.10.0", "{r}");
    assert_eq!(r["stdout"], "Successfully installed tabulate\n", "{r}");

    let disabled = Server::start(&[("CODE_INTERPRETER_MCP_RUNTIME_PACKAGE_INSTALLATION", "false")]);
    let r = structured(&call_stateless(
        &disabled,
        json!({"code": "%pip install tabulate"}),
    ))
    .clone();
    assert_eq!(r["error"]["kind"], "python", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Runtime package installation is disabled"),
        "{r}"
    );
}

/// The content blocks after the JSON text: their types, and the MIME type of embedded resources.
fn block_kinds(reply: &Value) -> Vec<String> {
    content(reply)[1..]
        .iter()
        .map(|b| match b["type"].as_str().unwrap() {
            "resource" => format!("resource:{}", b["resource"]["mimeType"].as_str().unwrap()),
            other => other.to_string(),
        })
        .collect()
}

#[test]
fn displays_come_back_in_order_as_bundles_and_content_blocks_in_both_eras() {
    let server = Server::start(&[]);
    let code = r##"
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import HTML, Markdown, SVG, JSON, Latex, display
display(HTML("<b>bold</b>"))
display(Markdown("# A title"))
fig, ax = plt.subplots()
ax.plot([1, 2, 3])
display(fig)
plt.close(fig)
display(SVG('<svg xmlns="http://www.w3.org/2000/svg"/>'), JSON({"a": 1}), Latex(r"$x^2$"))
class Rich:
    def _repr_markdown_(self):
        return "**rich**"
display(Rich())
pd.DataFrame({"n": range(1000), "sq": [i * i for i in range(1000)]})
"##;
    let legacy = LegacyClient::connect(&server);
    for reply in [
        call_stateless(&server, json!({"code": code})),
        legacy.call("run_python_code", json!({"code": code})),
    ] {
        let r = structured(&reply);
        assert_eq!(r["success"], true, "{r}");
        let displays = r["displays"].as_array().unwrap();
        let types: Vec<Vec<&str>> = displays
            .iter()
            .map(|d| {
                d["data"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(String::as_str)
                    .collect()
            })
            .collect();
        assert_eq!(displays.len(), 8, "{types:?}");
        assert_eq!(types[0], ["text/html", "text/plain"]);
        assert_eq!(types[1], ["text/markdown", "text/plain"]);
        assert_eq!(types[2], ["image/png", "text/plain"]);
        assert!(types[3].contains(&"image/svg+xml"));
        assert_eq!(displays[4]["data"]["application/json"], "{\"a\": 1}");
        assert!(types[5].contains(&"text/latex"));
        assert_eq!(displays[6]["data"]["text/markdown"], "**rich**");
        // The final DataFrame: displayed as a result, with a Markdown table of at most 20 rows.
        assert_eq!(displays[7]["source"], "result");
        let table = displays[7]["data"]["text/markdown"].as_str().unwrap();
        assert!(
            table.starts_with("|  | n | sq |\n|---|---|---|\n| 0 | 0 | 0 |"),
            "{table}"
        );
        assert!(table.contains("| 999 | 999 | 998001 |"), "{table}");
        assert!(
            table.ends_with("*DataFrame, 1000 rows × 2 columns (showing 20 rows and 2 columns)*"),
            "{table}"
        );
        assert_eq!(table.lines().count(), 2 + 20 + 1 + 2, "{table}");
        assert_eq!(
            block_kinds(&reply),
            [
                "resource:text/html",
                "text",
                "image",
                "resource:image/svg+xml",
                "resource:application/json",
                "resource:text/latex",
                "text",
                "text",
            ],
            "{}",
            reply["result"]["content"]
        );
    }
}

#[test]
fn an_image_that_is_not_one_never_becomes_an_image_block() {
    let server = Server::start(&[]);
    let code = r#"
class Garbage:
    def _repr_png_(self):
        return "!!! not base64 <script>alert(1)</script>"
    def _repr_markdown_(self):
        return "garbage"
class Svg:
    def _repr_png_(self):
        return b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
class Png:
    def _repr_png_(self):
        return b"\x89PNG\r\n\x1a\n" + bytes(16)
display(Garbage(), Svg(), Png())
open("fake.png", "w").write("<svg/>")
"#;
    let reply = call_stateless(&server, json!({"code": code}));
    let r = structured(&reply);
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(r["output_truncated"], true, "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert_eq!(
        stderr.matches("is not a valid image/png image").count(),
        2,
        "{stderr}"
    );
    let images: Vec<&Value> = content(&reply)
        .iter()
        .filter(|b| b["type"] == "image")
        .collect();
    assert_eq!(
        images.len(),
        1,
        "only the real PNG: {}",
        reply["result"]["content"]
    );
    assert_eq!(images[0]["data"], "iVBORw0KGgoAAAAAAAAAAAAAAAAAAAAA");
    assert!(block_kinds(&reply).contains(&"text".to_string()));
    // The fake PNG file is still returned as a file, not as an image block.
    assert_eq!(r["files"][0]["path"], "fake.png", "{r}");
}

#[test]
fn plotly_and_seaborn_figures_are_captured_in_a_session() {
    let index = mirror_index("nb-figures-index");
    let mut envs = index.envs();
    // figure-N.html gets plotly.js from where the operator says (results.figure_plotly_js).
    envs.push((
        "CODE_INTERPRETER_MCP_RESULTS_FIGURE_PLOTLY_JS",
        "/static/plotly-3.1.0.min.js".to_string(),
    ));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::start(&envs);
    let legacy = LegacyClient::connect(&server);
    let installed = legacy.call(
        "run_python_code",
        json!({"code": "%pip install -q narwhals==2.29.0 plotly==7.1.0 seaborn==0.13.2\nopen('figure-1.html', 'w').write('mine')", "session_id": "new", "timeout_ms": 120000}),
    );
    let r = structured(&installed);
    assert_eq!(r["success"], true, "{r}");
    let id = r["session_id"].as_str().unwrap().to_string();
    let plot = legacy.call(
        "run_python_code",
        json!({"session_id": id, "timeout_ms": 120000, "code": "import pandas\nimport plotly.express as px\nfig = px.scatter(x=[1, 2, 3], y=[3, 1, 2], title='t')\nfig.show()\nfig"}),
    );
    let r = structured(&plot);
    assert_eq!(r["success"], true, "{r}");
    let displays = r["displays"].as_array().unwrap();
    assert_eq!(displays.len(), 2, "shown, then the final expression: {r}");
    for display in displays {
        let json: Value = serde_json::from_str(
            display["data"]["application/vnd.plotly.v1+json"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(json["layout"]["title"]["text"], "t");
    }
    let files: Vec<&str> = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        ["figure-2.html", "figure-3.html"],
        "the user's figure-1.html is kept"
    );
    assert!(block_kinds(&plot).contains(&"resource:application/vnd.plotly.v1+json".to_string()));
    let html = r["files"][0]["content_base64"].as_str().unwrap();
    let html = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, html).unwrap(),
    )
    .unwrap();
    assert!(
        html.contains("src=\"/static/plotly-3.1.0.min.js\"")
            && !html.contains("src=\"https://cdn.plot.ly/plotly"),
        "{}",
        &html[..html.len().min(2000)]
    );
    let mine = legacy.call(
        "run_python_code",
        json!({"session_id": id, "code": "open('figure-1.html').read()"}),
    );
    assert_eq!(structured(&mine)["result"], "mine");

    let seaborn = legacy.call(
        "run_python_code",
        json!({"session_id": id, "timeout_ms": 120000, "code": "import seaborn as sns\nimport pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3, 4], 'y': [2, 4, 1, 3]})\nsns.lineplot(data=df, x='x', y='y')"}),
    );
    let r = structured(&seaborn);
    assert_eq!(r["success"], true, "{r}");
    let png = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "figure-1.png")
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(png["mime_type"], "image/png");
    assert!(block_kinds(&seaborn).contains(&"image".to_string()));
}

#[test]
fn text_is_sized_for_a_model_and_the_whole_is_kept() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_RESULTS_MAX_TEXT_CHARS", "2000")]);
    let code = "for n in range(5000):\n    print(f'line {n}')";
    let reply = call_stateless(&server, json!({"code": code}));
    let text = content(&reply)[0]["text"].as_str().unwrap();
    assert!(text.len() < 4000, "{} characters", text.len());
    assert!(text.contains("line 0\\n"), "the head is kept");
    assert!(text.contains("line 4999\\n"), "the tail is kept");
    assert!(
        text.contains(
            "characters cut here; the whole stdout is in the structured content (`stdout`)"
        ),
        "{text}"
    );
    let full = structured(&reply)["stdout"].as_str().unwrap();
    assert!(
        full.contains("line 2500\n"),
        "the structured content is whole"
    );

    // In a session the whole output is a session file, readable as a resource.
    let legacy = LegacyClient::connect(&server);
    let reply = legacy.call(
        "run_python_code",
        json!({"code": code, "session_id": "new"}),
    );
    let id = structured(&reply)["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let text = content(&reply)[0]["text"].as_str().unwrap();
    let at = text
        .find(&format!("session://{id}/.outputs/call-"))
        .expect(text);
    let uri: String = text[at..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ')' && *c != ']')
        .collect();
    assert!(uri.ends_with("-stdout.txt"), "{uri}");
    let read = legacy.request("resources/read", json!({"uri": uri}));
    let whole = read["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{read}"));
    assert!(whole.starts_with("line 0\n") && whole.ends_with("line 4999\n"));
    // 0 turns the cap off: the text is the whole JSON.
    let uncapped = Server::start(&[("CODE_INTERPRETER_MCP_RESULTS_MAX_TEXT_CHARS", "0")]);
    let reply = call_stateless(&uncapped, json!({"code": code}));
    let text: Value = serde_json::from_str(content(&reply)[0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text, structured(&reply));
}

/// Cells copied verbatim from pandas' "10 minutes to pandas" and seaborn's tutorial, as a notebook
/// user pastes them: they run unchanged.
#[test]
fn documentation_cells_run_unchanged() {
    let index = mirror_index("nb-docs-index");
    let envs = index.envs();
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::start(&envs);
    let pandas_cell = r#"import numpy as np
import pandas as pd
s = pd.Series([1, 3, 5, np.nan, 6, 8])
dates = pd.date_range("20130101", periods=6)
df = pd.DataFrame(np.random.randn(6, 4), index=dates, columns=list("ABCD"))
df2 = pd.DataFrame(
    {
        "A": 1.0,
        "B": pd.Timestamp("20130102"),
        "C": pd.Series(1, index=list(range(4)), dtype="float32"),
        "D": np.array([3] * 4, dtype="int32"),
        "E": pd.Categorical(["test", "train", "test", "train"]),
        "F": "foo",
    }
)
df2.dtypes
df.describe()"#;
    let r = structured(&call_stateless(&server, json!({"code": pandas_cell}))).clone();
    assert_eq!(r["success"], true, "{r}");
    assert!(
        r["displays"][0]["data"]["text/markdown"]
            .as_str()
            .unwrap()
            .contains("| count |"),
        "{r}"
    );
    let seaborn_cell = r##"%pip install -q narwhals==2.29.0 seaborn==0.13.2
# Import seaborn
import seaborn as sns

# Apply the default theme
sns.set_theme()

# Load an example dataset
import pandas as pd
tips = pd.DataFrame({"total_bill": [16.99, 10.34, 21.01, 23.68], "tip": [1.01, 1.66, 3.5, 3.31], "smoker": ["No", "No", "Yes", "Yes"], "time": ["Dinner", "Dinner", "Lunch", "Lunch"], "size": [2, 3, 3, 2]})

# Create a visualization
sns.relplot(
    data=tips,
    x="total_bill", y="tip", col="time",
    hue="smoker", style="smoker", size="size",
)"##;
    let r = structured(&call_stateless(
        &server,
        json!({"code": seaborn_cell, "timeout_ms": 120000}),
    ))
    .clone();
    assert_eq!(r["success"], true, "{r}");
    assert!(
        r["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "figure-1.png"),
        "{r}"
    );
}

/// `results.figure_plotly_js = "inline"`: figure-N.html carries plotly.js itself and opens offline.
#[test]
fn figure_html_carries_plotly_js_inline_when_configured() {
    use code_interpreter_mcp::sandbox::{Engine, EngineSettings, ExecRequest, InputFile};
    let engine = Engine::new(EngineSettings {
        figure_plotly_js: "inline".into(),
        ..crate::common::engine_settings()
    })
    .expect("engine");
    let wheels = [
        "plotly-7.1.0-py3-none-any.whl",
        "narwhals-2.29.0-py3-none-any.whl",
    ];
    let files = wheels
        .iter()
        .map(|name| InputFile {
            path: name.to_string(),
            content: std::fs::read(package_mirror().join(name)).unwrap(),
        })
        .collect();
    let code = format!(
        "import micropip\nawait micropip.install([{}])\nimport plotly.graph_objects as go\n\
go.Figure(go.Scatter(x=[1, 2], y=[2, 1])).show()",
        wheels.map(|w| format!("'emfs:/workspace/{w}'")).join(", ")
    );
    let result = engine.execute(ExecRequest {
        code,
        files,
        timeout: std::time::Duration::from_secs(120),
        ..Default::default()
    });
    assert!(result.error.is_none(), "{:?}", result.error);
    let file = result
        .files
        .iter()
        .find(|f| f.path == "figure-1.html")
        .unwrap_or_else(|| {
            panic!(
                "{:?}",
                result.files.iter().map(|f| &f.path).collect::<Vec<_>>()
            )
        });
    let html = String::from_utf8(
        base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            &file.content_base64,
        )
        .unwrap(),
    )
    .unwrap();
    assert!(html.len() > 3_000_000, "{} bytes", html.len());
    assert!(
        !html.contains("src=\"https://cdn.plot.ly/plotly"),
        "plotly.js from its CDN"
    );
    assert!(html.contains("Plotly.newPlot"));
}
