//! MCP Apps (the `io.modelcontextprotocol/ui` extension) as clients see it over the wire, in both
//! protocol eras: a client that declares the extension gets run_python_code's view named in
//! `_meta.ui` and the view listed as a `ui://` resource; every other client gets exactly what it got
//! before; the view reads for anyone; a missing script stops the server at start-up with the fix.
//! (The views rendering in a browser: tests/apps.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixture::{
    LegacyClient, Server, client, message, request_stateless, send_stateless, server_command,
    stateless_meta,
};

const EXTENSION: &str = "io.modelcontextprotocol/ui";
const MIME: &str = "text/html;profile=mcp-app";

fn apps_capabilities() -> Value {
    json!({"extensions": {EXTENSION: {"mimeTypes": [MIME]}}})
}

fn run_tool(tools: &Value) -> &Value {
    tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "run_python_code")
        .unwrap()
}

/// A 2026-07-28 request whose `_meta` declares `capabilities`.
fn stateless_with(server: &Server, method: &str, params: Value, capabilities: Value) -> Value {
    let mut params = params;
    let mut meta = stateless_meta();
    meta["io.modelcontextprotocol/clientCapabilities"] = capabilities;
    params["_meta"] = meta;
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params});
    let name = params["name"].as_str();
    message(send_stateless(&client(), &server.url, method, name, &body).unwrap())
}

#[test]
fn only_clients_that_declare_the_extension_see_the_view_in_either_era() {
    let server = Server::start(&[]);

    // The session era: the extension in `initialize`.
    let apps = LegacyClient::connect_with(&server, "2025-11-25", apps_capabilities());
    let plain = LegacyClient::connect(&server);
    assert!(
        apps.initialize_body.contains(EXTENSION),
        "{}",
        apps.initialize_body
    );

    let tools = apps.request("tools/list", json!({}));
    let uri = run_tool(&tools)["_meta"]["ui"]["resourceUri"]
        .as_str()
        .unwrap_or_else(|| panic!("no _meta.ui: {tools}"))
        .to_string();
    assert!(
        uri.starts_with("ui://code-interpreter-mcp/result-") && uri.ends_with(".html"),
        "{uri}"
    );
    assert_eq!(run_tool(&tools)["_meta"]["ui/resourceUri"], uri.as_str());
    let files_uri = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "list_session_files")
        .map(|t| {
            t["_meta"]["ui"]["resourceUri"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .unwrap_or_else(|| panic!("{tools}"));
    assert!(
        files_uri.starts_with("ui://code-interpreter-mcp/files-"),
        "{files_uri}"
    );
    let plain_tools = plain.request("tools/list", json!({}));
    assert!(
        run_tool(&plain_tools).get("_meta").is_none(),
        "{plain_tools}"
    );
    assert!(!plain_tools.to_string().contains("ui://"), "{plain_tools}");

    let listed = apps.request("resources/list", json!({}));
    let view = &listed["result"]["resources"][0];
    assert_eq!(view["uri"], uri.as_str(), "{listed}");
    assert_eq!(view["mimeType"], MIME);
    assert_eq!(view["_meta"]["ui"]["csp"]["connectDomains"], json!([]));
    assert_eq!(listed["result"]["resources"][1]["uri"], files_uri.as_str());
    let files = apps.request("resources/read", json!({"uri": files_uri}));
    let html = files["result"]["contents"][0]["text"].as_str().unwrap();
    assert!(html.contains("ExtApps") && !html.contains("plotly-source"));
    let plain_listed = plain.request("resources/list", json!({}));
    assert!(
        !plain_listed.to_string().contains("ui://"),
        "{plain_listed}"
    );

    // The view reads for any client, whole, with its own policy and nothing from the network.
    for reader in [&apps, &plain] {
        let read = reader.request("resources/read", json!({"uri": uri}));
        let contents = &read["result"]["contents"][0];
        assert_eq!(contents["mimeType"], MIME, "{read}");
        assert_eq!(contents["_meta"]["ui"]["prefersBorder"], true);
        let html = contents["text"].as_str().unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("http-equiv=\"Content-Security-Policy\""));
        assert!(html.contains("connect-src 'none'") && html.contains("default-src 'none'"));
        assert!(!html.contains("unsafe-eval"));
        assert!(
            !html.contains("src=\"http"),
            "a script or image from the network"
        );
        assert!(html.contains("Plotly") && html.contains("ExtApps"));
    }
    // A ui:// URI that is not a view is still not found.
    let unknown = plain.request(
        "resources/read",
        json!({"uri": "ui://code-interpreter-mcp/nothing.html"}),
    );
    assert!(unknown.get("error").is_some(), "{unknown}");

    // The call's result is the same for both clients.
    let code = json!({"code": "print('hi')\n6 * 7"});
    let with = apps.call("run_python_code", code.clone());
    let without = plain.call("run_python_code", code);
    assert_eq!(with["result"]["content"], without["result"]["content"]);
    assert_eq!(
        with["result"]["structuredContent"],
        without["result"]["structuredContent"]
    );
    assert_eq!(with["result"].get("_meta"), without["result"].get("_meta"));

    // 2026-07-28: the extension in each request's `_meta`; the list is then private to the client.
    let tools = stateless_with(&server, "tools/list", json!({}), apps_capabilities());
    assert_eq!(run_tool(&tools)["_meta"]["ui"]["resourceUri"], uri.as_str());
    assert_eq!(tools["result"]["cacheScope"], "private", "{tools}");
    let plain_tools = request_stateless(&server, "tools/list", json!({}));
    assert!(run_tool(&plain_tools).get("_meta").is_none());
    assert_eq!(plain_tools["result"]["cacheScope"], "public");
    let listed = stateless_with(&server, "resources/list", json!({}), apps_capabilities());
    assert_eq!(listed["result"]["resources"][0]["uri"], uri.as_str());
    let discover = request_stateless(&server, "server/discover", json!({}));
    assert!(
        discover["result"]["capabilities"]["extensions"]
            .get(EXTENSION)
            .is_some(),
        "{discover}"
    );
}

#[test]
fn with_apps_off_nothing_of_the_extension_is_there() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_RESULTS_APPS", "false")]);
    let apps = LegacyClient::connect_with(&server, "2025-11-25", apps_capabilities());
    assert!(!apps.initialize_body.contains(EXTENSION));
    let tools = apps.request("tools/list", json!({}));
    assert!(run_tool(&tools).get("_meta").is_none(), "{tools}");
    let listed = apps.request("resources/list", json!({}));
    assert!(!listed.to_string().contains("ui://"), "{listed}");
}

#[test]
fn a_missing_or_altered_script_stops_the_start_and_says_how_to_fix_it() {
    let dir = crate::common::temp_dir("apps-assets");
    std::fs::write(dir.join("plotly-cartesian.min.js"), "altered").unwrap();
    for (case, expected) in [
        ("missing", "app-with-deps.js"),
        ("altered", "plotly-cartesian.min.js"),
    ] {
        if case == "missing" {
            std::fs::remove_file(dir.join("plotly-cartesian.min.js")).ok();
            let plotly = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("node_modules/plotly.js-cartesian-dist-min/plotly-cartesian.min.js");
            std::fs::copy(plotly, dir.join("plotly-cartesian.min.js")).unwrap();
        } else {
            std::fs::write(dir.join("plotly-cartesian.min.js"), "altered").unwrap();
        }
        let mut child = server_command()
            .env("CODE_INTERPRETER_MCP_RESULTS_APPS_ASSET_DIR", &dir)
            .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "0")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{case}: the server kept running"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "{case}: {stderr}");
        assert!(stderr.contains(expected), "{case}: {stderr}");
        assert!(stderr.contains("results.apps = false"), "{case}: {stderr}");
        assert!(!stderr.contains("panicked"), "{case}: {stderr}");
    }
}

/// A DataFrame's grid data reaches a client that draws the view, in the result's `_meta` only: the
/// text and the structured content (what a model reads) are the same as every other client's, the
/// Markdown table of 20 rows included; rows are capped by `results.max_table_rows_app`, bytes by
/// the runner and again in Rust; sessions and the 2026-07-28 era carry it too.
#[test]
fn dataframes_reach_the_view_as_grid_data_and_the_model_reads_what_it_did() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_RESULTS_MAX_TABLE_ROWS_APP", "1000")]);
    let apps = LegacyClient::connect_with(&server, "2025-11-25", apps_capabilities());
    let plain = LegacyClient::connect(&server);
    let code = r#"
import pandas as pd
n = 2500
df = pd.DataFrame({
    "id": range(n),
    "value": [None if i == 7 else i / 4 for i in range(n)],
    "when": pd.date_range("2024-01-01", periods=n, freq="h"),
    "<b>name</b>": ["<script>alert(1)</script>"] * n,
})
display(df)
df["value"].head(3)
"#;
    let with = apps.call("run_python_code", json!({"code": code}));
    let without = plain.call("run_python_code", json!({"code": code}));
    assert_eq!(with["result"]["content"], without["result"]["content"]);
    assert_eq!(
        with["result"]["structuredContent"],
        without["result"]["structuredContent"]
    );
    assert!(without["result"].get("_meta").is_none(), "{without}");
    let text = with["result"]["content"].to_string();
    assert!(
        text.contains("2500 rows × 4 columns (showing 20 rows"),
        "{text}"
    );
    assert!(!text.contains("table+json"), "{text}");

    let tables = with["result"]["_meta"]["code-interpreter-mcp/view"]["tables"]
        .as_array()
        .unwrap_or_else(|| panic!("no tables: {with}"))
        .clone();
    assert_eq!(tables.len(), 2, "the display and the final expression");
    let frame = &tables[0];
    assert_eq!(frame["display"], 0);
    assert_eq!(
        frame["columns"],
        json!(["id", "value", "when", "<b>name</b>"])
    );
    assert_eq!(frame["total_rows"], 2500);
    assert_eq!(frame["total_columns"], 4);
    let rows = frame["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1000, "results.max_table_rows_app");
    assert_eq!(frame["index"].as_array().unwrap().len(), 1000);
    assert_eq!(
        rows[7],
        json!([
            7,
            null,
            "2024-01-01T07:00:00.000",
            "<script>alert(1)</script>"
        ])
    );
    assert_eq!(frame["dtypes"][0], "int64");
    let series = &tables[1];
    assert_eq!(series["display"], 1);
    assert_eq!(series["data"], json!([[0.0], [0.25], [0.5]]));

    // A table too large for its byte cap comes with fewer rows, never more bytes.
    let wide = apps.call(
        "run_python_code",
        json!({"code": "import pandas as pd\npd.DataFrame({'s': ['x' * 5000] * 10000})"}),
    );
    let table = &wide["result"]["_meta"]["code-interpreter-mcp/view"]["tables"][0];
    let sent = table["data"].as_array().unwrap().len();
    assert!((500..1000).contains(&sent), "{sent}");
    assert!(table.to_string().len() <= 4 * 1024 * 1024 + 64 * 1024);
    assert_eq!(table["total_rows"], 10000);

    // A session's call, and a 2026-07-28 call declaring the extension in its own `_meta`.
    let session = apps.call(
        "run_python_code",
        json!({"session_id": "new", "code": "import pandas as pd\npd.Series([3, 1, 2], name='s')"}),
    );
    let table = &session["result"]["_meta"]["code-interpreter-mcp/view"]["tables"][0];
    assert_eq!(table["data"], json!([[3], [1], [2]]), "{session}");
    assert_eq!(table["columns"], json!(["s"]));
    let call = json!({"name": "run_python_code", "arguments": {"code": "import pandas as pd\npd.DataFrame({'a': [1]})"}});
    let stateless = stateless_with(&server, "tools/call", call.clone(), apps_capabilities());
    assert_eq!(
        stateless["result"]["_meta"]["code-interpreter-mcp/view"]["tables"][0]["data"],
        json!([[1]]),
        "{stateless}"
    );
    let plain_stateless = request_stateless(&server, "tools/call", call);
    assert!(
        !plain_stateless
            .to_string()
            .contains("code-interpreter-mcp/view"),
        "{plain_stateless}"
    );
}
