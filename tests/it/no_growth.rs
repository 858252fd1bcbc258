//! Nothing grows with calls (issue 44, point 4): a server taken through the mix of `growth.rs`
//! (timeouts of four kinds, abandoned calls, sessions created and cleared, tasks, plain calls)
//! comes back to its baseline in file descriptors, threads, memory, store files and live tasks.
//! `CIM_GROWTH_CALLS` sets how many calls (1,000 by default); `cargo bench --bench soak` runs
//! 10,000 against the release build.

use crate::growth;
use crate::metrics::free_port;

#[test]
fn nothing_grows_with_calls() {
    let calls: usize = std::env::var("CIM_GROWTH_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let store = crate::common::temp_dir("no-growth-store");
    let port = free_port();
    let server = growth::start(&store, port, &[]);
    let report = growth::run(&server, &store, port, calls);
    println!("{report}");
    let (before, after) = (report.before, report.after);
    assert!(
        after.fds <= before.fds + 8,
        "file descriptors grew: {report}"
    );
    assert!(
        after.threads <= before.threads + 4,
        "threads grew: {report}"
    );
    assert!(
        after.rss_mib <= before.rss_mib + 150.0,
        "memory grew: {report}"
    );
    assert!(
        after.store_files <= before.store_files + 2,
        "store files grew: {report}: {:?}",
        growth::walk(&store)
    );
    assert_eq!(after.live_tasks, 0.0, "tasks still live: {report}");
}
