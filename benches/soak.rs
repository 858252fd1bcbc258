//! Soak benchmark: the mix of calls that must leave nothing behind (`tests/it/growth.rs`: timeouts
//! of four kinds, abandoned calls, sessions created and cleared, tasks, plain calls) against the
//! server, 10,000 calls from 4 clients by default (`SOAK_CALLS`), and what the server holds before
//! and after: file descriptors, threads, resident memory, store files, live tasks. Run with
//! `cargo bench --bench soak` (the release build).

#[path = "../tests/it/fixture.rs"]
mod fixture;
#[path = "../tests/it/growth.rs"]
mod growth;

fn main() {
    let calls: usize = std::env::var("SOAK_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let store = std::env::temp_dir().join(format!("cim-soak-{}", std::process::id()));
    std::fs::create_dir_all(&store).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = growth::start(&store, port, &[]);
    let report = growth::run(&server, &store, port, calls);
    println!("{report}");
    let per_call = report.elapsed.as_secs_f64() * 1e3 / calls as f64;
    println!("{per_call:.1} ms per call (wall, c=4)");
    drop(server);
    let _ = std::fs::remove_dir_all(&store);
}
