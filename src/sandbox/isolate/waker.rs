//! The waker a call into the isolate is polled with, released when the call is dropped.
//!
//! `JsRuntime::call` keeps the future it returns alive from the promise's `then` handler, a boxed
//! closure that V8 frees only when the promise settles; the future keeps the waker it was last
//! polled with. A call that the watchdog terminates (a timeout) never settles, so that closure is
//! never freed, and with tokio's own waker it kept the sandbox runtime's I/O driver handle alive:
//! one `eventfd` and one `eventpoll` per timed-out call, for good. Polled through [`Released`],
//! the closure holds only an empty slot once the call is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// Where the real waker is kept while the call is alive.
struct Slot(Mutex<Option<Waker>>);

impl Slot {
    fn put(&self, waker: Option<Waker>) -> Option<Waker> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *held, waker)
    }
}

impl Wake for Slot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waker = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// `fut`, polled with a waker that forwards to the real one until this is dropped.
pub(crate) struct Released<F> {
    fut: F,
    slot: Arc<Slot>,
}

/// Wraps `fut` (see the module doc).
pub(crate) fn released<F>(fut: F) -> Released<F> {
    Released {
        fut,
        slot: Arc::new(Slot(Mutex::new(None))),
    }
}

impl<F: Future + Unpin> Future for Released<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.slot.put(Some(cx.waker().clone()));
        let waker = Waker::from(self.slot.clone());
        Pin::new(&mut self.fut).poll(&mut Context::from_waker(&waker))
    }
}

impl<F> Drop for Released<F> {
    fn drop(&mut self) {
        drop(self.slot.put(None));
    }
}

#[cfg(test)]
mod tests {
    use super::released;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Wake, Waker};

    /// A future that keeps every waker it is polled with (as deno_core's promise future does).
    struct Keeps(Arc<Mutex<Vec<Waker>>>);

    impl Future for Keeps {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.lock().unwrap().push(cx.waker().clone());
            Poll::Pending
        }
    }

    struct Counted;
    impl Wake for Counted {
        fn wake(self: Arc<Self>) {}
    }

    #[test]
    fn a_dropped_call_no_longer_holds_the_real_waker() {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let real = Arc::new(Counted);
        let waker = Waker::from(real.clone());
        let mut call = released(Keeps(kept.clone()));
        assert!(
            Pin::new(&mut call)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        drop(waker);
        assert_eq!(Arc::strong_count(&real), 2, "held while the call is alive");
        drop(call);
        assert_eq!(Arc::strong_count(&real), 1, "released when it is dropped");
        // What the future kept still wakes (nothing) without panicking.
        kept.lock().unwrap().drain(..).for_each(Waker::wake);
    }
}
