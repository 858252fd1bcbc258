//! Each client gets nothing newer than the protocol version it negotiated (#45.2): before
//! 2025-06-18 no output schemas, structured content or resource links (files come as embedded
//! resources, and what the text cuts too); before 2025-11-25 no SSE priming events.

use serde_json::{Value, json};

use crate::fixture::{LegacyClient, Server};

/// Whether an SSE body has an event with an id or retry and no data (a priming event).
fn has_priming(body: &str) -> bool {
    body.split("\n\n").any(|event| {
        let lines: Vec<&str> = event.lines().filter(|l| !l.is_empty()).collect();
        !lines.is_empty()
            && lines
                .iter()
                .any(|l| l.starts_with("id:") || l.starts_with("retry:"))
            && lines
                .iter()
                .all(|l| !l.starts_with("data:") || l[5..].trim().is_empty())
    })
}

fn kinds(result: &Value) -> Vec<String> {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap().to_string())
        .collect()
}

/// The embedded resource with `uri` in a result's content.
fn embedded<'a>(result: &'a Value, uri: &str) -> &'a Value {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "resource" && b["resource"]["uri"] == uri)
        .map(|b| &b["resource"])
        .unwrap_or_else(|| panic!("no embedded {uri}: {result}"))
}

const WRITES: &str = "open('notes.txt', 'w').write('hi')\nimport matplotlib\n\
matplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig('p.png')\n\
print('x' * 30000)";

#[test]
fn each_client_gets_only_what_its_protocol_version_has() {
    let server = Server::start(&[]);

    // 2025-03-26 (the `mcp` 1.9.x clients): nothing of 2025-06-18 or later.
    let old = LegacyClient::connect_at(&server, "2025-03-26");
    assert!(
        !has_priming(&old.initialize_body),
        "{}",
        old.initialize_body
    );
    let tools = old.send("tools/list", json!({})).text().unwrap();
    assert!(!has_priming(&tools), "{tools}");
    assert!(!tools.contains("outputSchema"), "{tools}");
    for (arguments, file_uri) in [
        (
            json!({"code": WRITES}),
            "workspace:///notes.txt".to_string(),
        ),
        (json!({"code": WRITES, "session_id": "new"}), String::new()),
    ] {
        let response = old.send(
            "tools/call",
            json!({"name": "run_python_code", "arguments": arguments}),
        );
        let body = response.text().unwrap();
        assert!(!has_priming(&body), "{body}");
        let reply: Value = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .next()
            .unwrap_or_else(|| serde_json::from_str(&body).unwrap());
        let result = &reply["result"];
        assert!(result.get("structuredContent").is_none(), "{result}");
        assert!(
            !kinds(result).contains(&"resource_link".to_string()),
            "{result}"
        );
        let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap())
            .expect("the text block is the result's JSON");
        assert_eq!(text["success"], true, "{text}");
        let uri = if file_uri.is_empty() {
            let id = text["session_id"].as_str().unwrap();
            format!("session://{id}/notes.txt")
        } else {
            file_uri
        };
        let notes = embedded(result, &uri);
        assert_eq!(notes["text"], "hi");
        assert_eq!(notes["mimeType"], "text/plain");
        let said = text["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "notes.txt")
            .unwrap()["content"]
            .clone();
        assert_eq!(said, format!("in the embedded resource {uri}"));
        // The plot is an image block; the cut stdout is whole in an embedded resource.
        assert!(kinds(result).contains(&"image".to_string()), "{result}");
        if text.get("session_id").is_none() {
            let stdout = embedded(result, "output://stdout");
            assert_eq!(stdout["text"].as_str().unwrap().len(), 30001);
            assert!(
                text["stdout"]
                    .as_str()
                    .unwrap()
                    .contains("the whole stdout is the embedded resource output://stdout")
            );
        }
    }
    // Errors, and every other tool, carry no structured content either.
    let session = old.call("list_code_snippets", json!({}));
    assert!(
        session["result"].get("structuredContent").is_none(),
        "{session}"
    );

    // 2025-06-18: structured content, schemas and links, but no priming events.
    let mid = LegacyClient::connect_at(&server, "2025-06-18");
    assert!(!has_priming(&mid.initialize_body));
    let tools = mid.send("tools/list", json!({})).text().unwrap();
    assert!(
        !has_priming(&tools) && tools.contains("outputSchema"),
        "{tools}"
    );
    let result = mid.call(
        "run_python_code",
        json!({"code": "open('a.txt','w').write('a')", "session_id": "new"}),
    );
    assert!(result["result"]["structuredContent"].is_object());
    assert!(kinds(&result["result"]).contains(&"resource_link".to_string()));

    // 2025-11-25: everything, priming events included.
    let new = LegacyClient::connect_at(&server, "2025-11-25");
    assert!(has_priming(&new.initialize_body), "{}", new.initialize_body);
    let tools = new.send("tools/list", json!({})).text().unwrap();
    assert!(
        has_priming(&tools) && tools.contains("outputSchema"),
        "{tools}"
    );
}

/// Every place in `schema` that a single-type or strict dialect refuses (#45.5).
fn unportable(schema: &Value, at: &str, found: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                let here = format!("{at}/{key}");
                let bad = match key.as_str() {
                    "$ref" | "$defs" => true,
                    "format" => value
                        .as_str()
                        .is_some_and(|f| f.starts_with("uint") || f.starts_with("int")),
                    "default" => value.is_null(),
                    "type" => value.is_array(),
                    _ => false,
                };
                if bad {
                    found.push(here.clone());
                }
                unportable(value, &here, found);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| unportable(i, at, found)),
        _ => {}
    }
}

#[test]
fn schemas_are_portable_and_wrong_arguments_are_named() {
    use crate::fixture::{call_stateless, call_tool_stateless, list_tools_stateless};
    let server = Server::start(&[]);
    let tools = list_tools_stateless(&server);
    assert_eq!(tools.len(), 6);
    for tool in &tools {
        let mut found = Vec::new();
        unportable(&tool["inputSchema"], "", &mut found);
        assert!(found.is_empty(), "{}: {found:?}", tool["name"]);
        let output = tool["outputSchema"].to_string();
        assert!(
            !output.contains("\"format\":\"uint") && !output.contains("\"format\":\"int"),
            "{output}"
        );
    }
    let run = tools
        .iter()
        .find(|t| t["name"] == "run_python_code")
        .unwrap();
    assert_eq!(
        run["inputSchema"]["properties"]["files"]["items"]["required"],
        json!(["path", "content_base64"])
    );

    // A wrong argument is a tool error naming it, in the tool's usual form.
    let wrong = call_stateless(&server, json!({"code": "1", "timeout_ms": "5000"}));
    let result = &wrong["result"];
    assert_eq!(result["isError"], true, "{wrong}");
    assert_eq!(result["structuredContent"]["error"]["kind"], "validation");
    assert_eq!(
        result["structuredContent"]["error"]["message"],
        "invalid arguments for run_python_code: argument `timeout_ms` must be an integer from 1 \
to 86400000; got the string \"5000\""
    );
    let missing = call_stateless(&server, json!({"files": [{"path": "a.csv"}]}));
    assert!(
        missing["result"]["structuredContent"]["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("missing required argument `code` (a string)"),
        "{missing}"
    );
    let snippet = call_tool_stateless(&server, "get_code_snippet", json!({"id": 5}));
    assert_eq!(snippet["result"]["isError"], true, "{snippet}");
    assert_eq!(
        snippet["result"]["content"][0]["text"],
        "invalid arguments for get_code_snippet: argument `id` must be a string; got the number 5"
    );

    // What a strict-mode model sends for "no session" and "the default": "none" and null.
    let strict = call_stateless(
        &server,
        json!({"code": "1 + 1", "session_id": "none", "timeout_ms": null, "files": []}),
    );
    let result = &strict["result"]["structuredContent"];
    assert_eq!(result["result"], "2", "{strict}");
    assert!(
        result.get("session_id").is_none_or(Value::is_null),
        "{strict}"
    );
}

#[test]
fn without_structured_content_every_client_is_served_as_a_2025_03_26_one() {
    // results.structured_content = false: for clients that hand a model the structured content
    // whole (pydantic-ai), where returned files' Base64 would reach it as text.
    let server = Server::start(&[("CODE_INTERPRETER_MCP_RESULTS_STRUCTURED_CONTENT", "false")]);
    let client = LegacyClient::connect_at(&server, "2025-11-25");
    assert!(
        has_priming(&client.initialize_body),
        "the transport is unchanged"
    );
    let tools = client.request("tools/list", json!({}));
    assert!(!tools.to_string().contains("outputSchema"), "{tools}");
    let reply = client.call(
        "run_python_code",
        json!({"code": "open('t.csv', 'w').write('a,b\\n1,2\\n')"}),
    );
    let result = &reply["result"];
    assert!(result.get("structuredContent").is_none(), "{reply}");
    assert_eq!(embedded(result, "workspace:///t.csv")["text"], "a,b\n1,2\n");
}
