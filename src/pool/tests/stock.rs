//! A worker's stock of ready sandboxes, against the fake backend: how it is served from and
//! refilled, which flavor it keeps and how many, the order its sandboxes are dropped in, and what
//! an idle worker does with it (rest, give back memory).

use super::*;

#[test]
fn a_stock_serves_queued_calls_without_booting_and_refills_after_them() {
    let fake = Arc::new(Fake::default());
    let pool = stocked_pool(&fake, 1, 8, 1, 3);
    let boots = || fake.boots.load(Ordering::SeqCst);
    // Start-up waits for the first sandbox only; the worker fills the rest of its stock after it.
    wait_until("a full stock", || boots() == 3 && ready_idle(&pool));
    // Three calls back to back (two queued behind a running one): each is served from the stock,
    // newest first, and no boot happens between them.
    let (first, started, release) = FakeJob::held("first");
    let mut a = pool.submit(first).unwrap();
    started.recv().unwrap();
    let mut b = pool.submit(FakeJob::quick("second")).unwrap();
    let mut c = pool.submit(FakeJob::quick("third")).unwrap();
    release.send(()).unwrap();
    let served: Vec<_> = [&mut a, &mut b, &mut c]
        .into_iter()
        .map(|t| block_on(t.wait()).result.unwrap())
        .collect();
    // (A call that waited for a boot would have run in sandbox 4.)
    assert_eq!(served, [("first", 3), ("second", 2), ("third", 1)]);
    // Once the calls stop, the stock is refilled.
    wait_until("the stock refilled", || boots() == 6);
    let mut t = pool.submit(FakeJob::quick("later")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("later", 6));
    pool.shutdown();
    wait_until("the worker to exit", || pool.workers_exited());
    assert_eq!(fake.out_of_order.load(Ordering::SeqCst), 0);
    assert!(
        fake.alive.lock().unwrap().is_empty(),
        "shutdown drops the stock"
    );
}

#[test]
fn a_worker_rests_once_its_stock_is_full_and_again_only_after_more_work() {
    let fake = Arc::new(Fake::default());
    let pool = stocked_pool(&fake, 1, 8, 1, 3);
    let rests = || fake.rests.lock().unwrap().clone();
    // The first rest comes after the whole stock is booted.
    wait_until("a rest", || !rests().is_empty());
    assert_eq!(rests(), [3]);
    // With nothing to do, the worker does not rest again and again.
    std::thread::sleep(crate::pool::worker::REST_PAUSE * 3);
    assert_eq!(rests(), [3]);
    assert!(
        fake.given_back.lock().unwrap().is_empty(),
        "no memory is given back unless configured"
    );
    // A call, then the refill of its sandbox, then one rest.
    let mut t = pool.submit(FakeJob::quick("call")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("call", 3));
    wait_until("another rest", || rests().len() == 2);
    assert_eq!(rests(), [3, 4]);
    pool.shutdown();
    wait_until("the worker to exit", || pool.workers_exited());
}

#[test]
fn sandboxes_are_dropped_newest_first_whatever_the_flavors() {
    let fake = Arc::new(Fake::default());
    let pool = stocked_pool(&fake, 1, 8, 1, 2);
    wait_until("a full stock", || {
        fake.boots.load(Ordering::SeqCst) == 2 && ready_idle(&pool)
    });
    // Calls of another flavor are booted on demand above the stock, then the stock follows them;
    // a default call after that boots its own again.
    for (name, flavor) in [("data", 1), ("more", 1), ("plain", 0), ("again", 1)] {
        let mut t = pool.submit(FakeJob::of_flavor(name, flavor)).unwrap();
        block_on(t.wait()).result.unwrap();
    }
    // A drained stock: more queued calls than ready sandboxes, the rest booted on demand.
    let (first, started, release) = FakeJob::held("held");
    let mut tickets = vec![pool.submit(first).unwrap()];
    started.recv().unwrap();
    for name in ["q1", "q2", "q3"] {
        tickets.push(pool.submit(FakeJob::quick(name)).unwrap());
    }
    release.send(()).unwrap();
    for t in &mut tickets {
        block_on(t.wait()).result.unwrap();
    }
    pool.shutdown();
    wait_until("the worker to exit", || pool.workers_exited());
    assert_eq!(fake.out_of_order.load(Ordering::SeqCst), 0);
    assert!(fake.alive.lock().unwrap().is_empty());
}

#[test]
fn a_kind_the_backend_keeps_fewer_of_gets_a_smaller_stock() {
    let fake = Arc::new(Fake::default());
    let pool = stocked_pool(&fake, 1, 8, 1, 3);
    let boots = || fake.boots.load(Ordering::SeqCst);
    wait_until("a full stock", || boots() == 3 && ready_idle(&pool));
    // A call of the heavier kind boots on demand (4); the stock becomes one of its kind (5).
    let mut t = pool.submit(FakeJob::of_flavor("heavy", 2)).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("heavy", 4));
    wait_until("the stock replaced", || boots() == 5 && ready_idle(&pool));
    // Well past the refill pause, nothing more is booted for it.
    std::thread::sleep(REFILL_WAIT);
    assert_eq!(boots(), 5);
    assert_eq!(*fake.flavors.lock().unwrap(), [0, 0, 0, 2, 2]);
    // Back to the plain kind: its full stock again.
    let mut t = pool.submit(FakeJob::of_flavor("plain", 0)).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("plain", 6));
    wait_until("a full plain stock", || boots() == 9 && ready_idle(&pool));
    pool.shutdown();
    wait_until("the worker to exit", || pool.workers_exited());
    assert_eq!(fake.out_of_order.load(Ordering::SeqCst), 0);
}

/// Longer than the worker's refill pause (25 ms), with room for a slow machine.
const REFILL_WAIT: Duration = Duration::from_millis(300);

#[test]
fn the_whole_stock_follows_the_flavor_of_the_last_call() {
    let fake = Arc::new(Fake::default());
    let pool = stocked_pool(&fake, 1, 8, 1, 2);
    let boots = || fake.boots.load(Ordering::SeqCst);
    wait_until("a full stock", || boots() == 2 && ready_idle(&pool));
    // A call of another flavor boots on demand (3); then the stock is replaced by two of its
    // flavor (4, 5).
    let mut t = pool.submit(FakeJob::of_flavor("data", 1)).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("data", 3));
    wait_until("the stock replaced", || boots() == 5 && ready_idle(&pool));
    assert_eq!(*fake.flavors.lock().unwrap(), [0, 0, 1, 1, 1]);
    // Two calls of that flavor, one queued behind the other: both start from the stock.
    let (first, started, release) = FakeJob::held("first");
    let first = FakeJob { flavor: 1, ..first };
    let mut a = pool.submit(first).unwrap();
    started.recv().unwrap();
    let mut b = pool.submit(FakeJob::of_flavor("second", 1)).unwrap();
    release.send(()).unwrap();
    assert_eq!(block_on(a.wait()).result.unwrap(), ("first", 5));
    assert_eq!(block_on(b.wait()).result.unwrap(), ("second", 4));
    pool.shutdown();
    wait_until("the worker to exit", || pool.workers_exited());
    assert_eq!(fake.out_of_order.load(Ordering::SeqCst), 0);
}

#[test]
fn an_idle_worker_has_its_stock_give_back_memory_once_per_idle_spell() {
    let fake = Arc::new(Fake::default());
    let pause = Duration::from_millis(100);
    let pool = giving_back(&fake, pause);
    let given_back = || fake.given_back.lock().unwrap().clone();
    // The whole stock, once the worker has rested and then stayed idle for the pause.
    wait_until("the stock to give back", || given_back().len() == 2);
    assert_eq!(given_back(), [1, 2]);
    assert_eq!(fake.rests.lock().unwrap().clone(), [2]);
    // Not again while nothing happens.
    std::thread::sleep(crate::pool::worker::REST_PAUSE + pause * 3);
    assert_eq!(given_back(), [1, 2]);
    // A call takes the newest; its replacement is booted, and the next idle spell gives back the
    // stock as it is then.
    let mut t = pool.submit(FakeJob::quick("call")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("call", 2));
    wait_until("the stock to give back again", || given_back().len() == 4);
    assert_eq!(given_back(), [1, 2, 1, 3]);
    pool.shutdown();
    wait_until("the worker to exit", || pool.workers_exited());
}

#[test]
fn a_stock_that_fails_to_give_back_is_dropped_newest_first_and_booted_again() {
    let fake = Arc::new(Fake::default());
    fake.fail_give_back.store(true, Ordering::SeqCst);
    let pause = Duration::from_millis(100);
    let pool = giving_back(&fake, pause);
    // The first sandbox fails: the whole stock goes (the second without being asked), and two
    // new ones are booted.
    wait_until("the stock to be replaced", || {
        fake.boots.load(Ordering::SeqCst) >= 4
    });
    fake.fail_give_back.store(false, Ordering::SeqCst);
    let given_back = fake.given_back.lock().unwrap().clone();
    assert_eq!(given_back[0], 1);
    assert!(!given_back.contains(&2), "{given_back:?}");
    assert!(!fake.alive.lock().unwrap().contains(&1));
    assert_eq!(fake.out_of_order.load(Ordering::SeqCst), 0);
    // A call is served by the new stock.
    let mut t = pool.submit(FakeJob::quick("call")).unwrap();
    let (name, number) = block_on(t.wait()).result.unwrap();
    assert_eq!(name, "call");
    assert!(
        number >= 4,
        "served by a sandbox booted after the failure: {number}"
    );
    pool.shutdown();
    wait_until("the worker to exit", || pool.workers_exited());
    assert_eq!(fake.out_of_order.load(Ordering::SeqCst), 0);
}

/// One prewarmed worker keeping two ready sandboxes, which give back memory after `pause` idle.
fn giving_back(fake: &Arc<Fake>, pause: Duration) -> Pool<Fake> {
    let settings = WorkerSettings {
        idle_give_back: Some(pause),
        ..settings(1, 8, 1, 2)
    };
    Pool::start(fake.clone(), settings).expect("pool starts")
}
