//! The MCP tools: `run_python_code` (validate, then execute on the worker pool) with its input and
//! output schemas, and the server's MCP identity.

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};

use crate::executor::{Completed, Executor};
use crate::sandbox::{ErrorKind, ExecError, ExecRequest, ExecResult};
use crate::validation::{FileInput, InputLimits, validate};

/// Largest accepted `timeout_ms`.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// `timeout_ms` when the client sends none.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// Arguments of `run_python_code`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct RunPythonCodeArgs {
    /// Python source to run. Top-level `await` is allowed; the value of a final expression is returned
    /// as `result`.
    pub code: String,
    /// Files to place under /workspace (the working directory) before the code runs.
    #[serde(default)]
    pub files: Vec<FileInput>,
    /// Time limit for the code in milliseconds (start-up and package loading are not counted).
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1, max = 120000))]
    pub timeout_ms: u64,
}

/// The MCP server: tools over the executor.
#[derive(Clone)]
pub struct CodeInterpreter {
    executor: Executor,
    limits: InputLimits,
    #[allow(dead_code, reason = "read by the tool_handler macro")]
    tool_router: ToolRouter<Self>,
}

impl CodeInterpreter {
    pub fn new(executor: Executor, limits: InputLimits) -> Self {
        Self {
            executor,
            limits,
            tool_router: Self::tool_router(),
        }
    }

    /// Validates and runs one call; the structured result. Logs one line per call with its outcome and
    /// timings, never the code, file contents or paths.
    pub async fn run(&self, args: RunPythonCodeArgs) -> ExecResult {
        let started = std::time::Instant::now();
        let completed = self.validate_and_execute(args).await;
        let result = &completed.result;
        let outcome = match &result.error {
            None => "success",
            Some(e) => match e.kind {
                ErrorKind::Python => "python_error",
                ErrorKind::Timeout => "timeout",
                ErrorKind::Runtime => "runtime_failure",
                ErrorKind::Validation => "validation_error",
                ErrorKind::Overload => "overload",
            },
        };
        tracing::info!(
            tool = "run_python_code",
            outcome,
            queue_wait_ms = completed.queue_wait.as_millis() as u64,
            execution_ms = completed.execution.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            output_truncated = result.output_truncated,
            "tool call"
        );
        completed.result
    }

    async fn validate_and_execute(&self, args: RunPythonCodeArgs) -> Completed {
        if !(1..=MAX_TIMEOUT_MS).contains(&args.timeout_ms) {
            return validation_error(format!(
                "timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, got {}",
                args.timeout_ms
            ));
        }
        let files = match validate(&args.code, &args.files, self.limits) {
            Ok(files) => files,
            Err(message) => return validation_error(message),
        };
        self.executor
            .execute(ExecRequest {
                code: args.code,
                files,
                timeout: Duration::from_millis(args.timeout_ms),
            })
            .await
    }
}

fn validation_error(message: String) -> Completed {
    Completed {
        result: ExecResult::failure(ExecError::new(
            ErrorKind::Validation,
            "ValidationError",
            message,
        )),
        queue_wait: Duration::ZERO,
        execution: Duration::ZERO,
    }
}

#[tool_router]
impl CodeInterpreter {
    #[tool(
        name = "run_python_code",
        description = "Run Python 3 code in a fresh, isolated Pyodide (WebAssembly) sandbox and return \
stdout, stderr, the str() of the final expression, and any new files written under /workspace \
(the working directory). Every call starts from a clean interpreter: nothing persists between calls. \
Top-level await is supported. Pass input files as Base64 in `files`; they appear under /workspace. \
Packages of the Pyodide distribution (numpy, pandas, matplotlib, scipy, ...) load automatically on import.",
        output_schema = rmcp::handler::server::tool::schema_for_type::<ExecResult>()
    )]
    async fn run_python_code(
        &self,
        Parameters(args): Parameters<RunPythonCodeArgs>,
    ) -> CallToolResult {
        let result = self.run(args).await;
        let value = serde_json::to_value(&result).unwrap_or_default();
        if result.success {
            CallToolResult::structured(value)
        } else {
            CallToolResult::structured_error(value)
        }
    }
}

#[tool_handler]
impl ServerHandler for CodeInterpreter {
    fn get_info(&self) -> ServerConfig {
        // Prompts and resources are declared with empty lists so that clients (and the conformance
        // suite's caching checks) that list them get an answer rather than "method not found".
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(
                "code-interpreter-mcp",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Use run_python_code to execute Python in a fresh sandbox per call. State does not \
             persist between calls; send input files with each call.",
            )
    }
}
