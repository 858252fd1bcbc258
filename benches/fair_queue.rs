//! The pool's fair queue (`src/pool/fair.rs`) against the first-come queue it replaced (a
//! `VecDeque`), at one caller and at eight, with `FAIR_DEPTHS` (default 1,8,64) items kept queued:
//! one push and one pop per operation, `FAIR_OPS` (default 1,000,000) operations a round,
//! `FAIR_ROUNDS` (default 15) rounds alternating the three, so drift hits them alike. Reports the
//! median and p90 nanoseconds per operation and the ratio to the first-come queue. (A call takes
//! milliseconds; the queue's share of it is what this measures.)
//!
//! `cargo bench --bench fair_queue`

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

use code_interpreter_mcp::pool::fair::FairQueue;

/// About a queued job's size.
type Item = [u64; 8];

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn fifo(depth: usize, ops: usize) -> f64 {
    let mut queue: VecDeque<Item> = (0..depth).map(|n| [n as u64; 8]).collect();
    let started = Instant::now();
    for n in 0..ops {
        queue.push_back([n as u64; 8]);
        black_box(queue.pop_front());
    }
    started.elapsed().as_nanos() as f64 / ops as f64
}

fn fair(depth: usize, ops: usize, lanes: u64) -> f64 {
    let mut queue = FairQueue::default();
    for n in 0..depth {
        queue.push(n as u64 % lanes, 1, [n as u64; 8]);
    }
    let started = Instant::now();
    for n in 0..ops {
        queue.push(n as u64 % lanes, 1, [n as u64; 8]);
        black_box(queue.pop());
    }
    started.elapsed().as_nanos() as f64 / ops as f64
}

fn quantile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let depths = env_list("FAIR_DEPTHS", "1,8,64");
    let ops = env_list("FAIR_OPS", "1000000")[0];
    let rounds = env_list("FAIR_ROUNDS", "15")[0];
    println!("depth  queue              p50 ns/op  p90 ns/op  p50 ratio");
    for depth in depths {
        let mut samples = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..rounds {
            samples[0].push(fifo(depth, ops));
            samples[1].push(fair(depth, ops, 1));
            samples[2].push(fair(depth, ops, 8));
        }
        let base = quantile(&mut samples[0], 0.5);
        for (name, cell) in ["first come (before)", "fair, one caller", "fair, 8 callers"]
            .iter()
            .zip(samples.iter_mut())
        {
            let p50 = quantile(cell, 0.5);
            let p90 = quantile(cell, 0.9);
            println!(
                "{depth:>5}  {name:<19} {p50:>9.1}  {p90:>9.1}  {:>8.2}",
                p50 / base
            );
        }
    }
}
