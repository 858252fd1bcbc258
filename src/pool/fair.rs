//! The pool's queue: fair between callers, first come first served within one. Each queued job
//! belongs to a lane (a caller: the pool only sees an opaque number) and gets a start tag when it
//! is queued, `max(V, the lane's last tag + 1)`, where `V` is the tag of the job taken last; workers
//! take the job with the least tag (the older one on a tie). That is start-time fair queuing with
//! one unit per call: one lane's jobs keep their arrival order (so with a single caller this is the
//! FIFO it replaces), and a caller that arrives while another has 100 jobs queued is served after
//! at most one of them, since its tag is `V` and theirs are `V` and up. A lane that has been idle
//! banks nothing (its tag restarts at `V`). Every operation is linear in the queued jobs, which
//! `workers.queue_capacity` bounds.

use std::collections::{HashMap, VecDeque};

/// A queued item with its lane and tag.
struct Entry<T> {
    tag: u64,
    lane: u64,
    item: T,
}

/// Items in fair order (see the module's documentation).
pub struct FairQueue<T> {
    entries: VecDeque<Entry<T>>,
    /// The tag of the item taken last (`V`).
    virtual_time: u64,
    /// The last tag of each lane with items queued (a lane without starts again at `V`): at most
    /// as many as there are items.
    last: HashMap<u64, u64>,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            virtual_time: 0,
            last: HashMap::new(),
        }
    }
}

impl<T> FairQueue<T> {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many items `lane` has queued.
    pub fn lane_len(&self, lane: u64) -> usize {
        if !self.last.contains_key(&lane) {
            return 0;
        }
        self.entries.iter().filter(|e| e.lane == lane).count()
    }

    /// Queues `item` in `lane`.
    pub fn push(&mut self, lane: u64, item: T) {
        let tag = match self.last.get(&lane) {
            Some(&last) => (last + 1).max(self.virtual_time),
            None => self.virtual_time,
        };
        self.last.insert(lane, tag);
        // Kept sorted by (tag, arrival): the new item goes after every item with a tag not above
        // its own.
        let at = self.entries.partition_point(|e| e.tag <= tag);
        self.entries.insert(at, Entry { tag, lane, item });
    }

    /// Takes the next item in fair order.
    pub fn pop(&mut self) -> Option<T> {
        let entry = self.entries.pop_front()?;
        self.virtual_time = entry.tag;
        self.forget(entry.lane);
        Some(entry.item)
    }

    /// Takes the first item `matches` accepts out of turn, as if it were next (for a caller that
    /// waits for its item to be first, then for a slot: the order it took may have changed since).
    pub fn take(&mut self, matches: impl Fn(&T) -> bool) -> Option<T> {
        let index = self.entries.iter().position(|e| matches(&e.item))?;
        let entry = self.entries.remove(index)?;
        self.virtual_time = self.virtual_time.max(entry.tag);
        self.forget(entry.lane);
        Some(entry.item)
    }

    /// Removes and returns the first item `matches` accepts.
    pub fn remove(&mut self, matches: impl Fn(&T) -> bool) -> Option<T> {
        let index = self.entries.iter().position(|e| matches(&e.item))?;
        let entry = self.entries.remove(index)?;
        self.forget(entry.lane);
        Some(entry.item)
    }

    /// Forgets `lane`'s last tag once it has no item queued.
    fn forget(&mut self, lane: u64) {
        if !self.entries.iter().any(|e| e.lane == lane) {
            self.last.remove(&lane);
        }
    }

    /// The 1-based position of the first item `matches` accepts: how many are taken before it,
    /// plus one.
    pub fn position(&self, matches: impl Fn(&T) -> bool) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| matches(&e.item))
            .map(|p| p + 1)
    }

    /// Takes every item, in fair order.
    pub fn drain(&mut self) -> Vec<T> {
        self.last.clear();
        self.entries.drain(..).map(|e| e.item).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(queue: &mut FairQueue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| queue.pop()).collect()
    }

    #[test]
    fn one_lane_is_first_come_first_served() {
        let mut queue = FairQueue::default();
        let mut model = VecDeque::new();
        // Pushes and pops interleaved: the same order as a plain FIFO.
        let mut seed = 7_u64;
        for n in 0..2_000_u32 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if seed >> 62 == 0 {
                assert_eq!(queue.pop(), model.pop_front());
            } else {
                queue.push(3, n);
                model.push_back(n);
            }
            assert_eq!(queue.len(), model.len());
        }
        while let Some(n) = model.pop_front() {
            assert_eq!(queue.pop(), Some(n));
        }
        assert_eq!(queue.pop(), None);
    }

    #[test]
    fn a_lanes_length_counts_its_items_only() {
        let mut queue = FairQueue::default();
        for (lane, item) in [(1, "a1"), (2, "b1"), (1, "a2"), (1, "a3")] {
            queue.push(lane, item);
        }
        assert_eq!(
            (queue.lane_len(1), queue.lane_len(2), queue.lane_len(3)),
            (3, 1, 0)
        );
        assert_eq!(queue.pop(), Some("a1"));
        assert_eq!(queue.pop(), Some("b1"));
        assert_eq!((queue.lane_len(1), queue.lane_len(2)), (2, 0));
    }

    #[test]
    fn a_newcomer_waits_for_at_most_one_of_a_busy_lanes_items() {
        let mut queue = FairQueue::default();
        for item in ["a1", "a2", "a3", "a4", "a5"] {
            queue.push(1, item);
        }
        assert_eq!(queue.pop(), Some("a1"));
        queue.push(2, "b1");
        queue.push(2, "b2");
        // b1's tag is V, below a2's: it is next; b2 ties with a2 and comes after it.
        assert_eq!(queue.position(|i| *i == "b1"), Some(1));
        assert_eq!(order(&mut queue), ["b1", "a2", "b2", "a3", "a4", "a5"]);
    }

    #[test]
    fn lanes_alternate_and_an_idle_lane_banks_nothing() {
        let mut queue = FairQueue::default();
        for item in ["a1", "a2", "a3"] {
            queue.push(1, item);
        }
        for item in ["b1", "b2", "b3"] {
            queue.push(2, item);
        }
        queue.push(3, "c1");
        assert_eq!(
            order(&mut queue),
            ["a1", "b1", "c1", "a2", "b2", "a3", "b3"]
        );
        // Lane 3 was idle while the others were served: it starts again at V, owed nothing for the
        // turns it did not take, so the two lanes alternate.
        for item in ["a4", "a5"] {
            queue.push(1, item);
        }
        for item in ["c2", "c3", "c4"] {
            queue.push(3, item);
        }
        assert_eq!(order(&mut queue), ["a4", "c2", "a5", "c3", "c4"]);
    }

    #[test]
    fn removal_position_and_drain() {
        let mut queue = FairQueue::default();
        for (lane, item) in [(1, "a1"), (1, "a2"), (2, "b1"), (2, "b2")] {
            queue.push(lane, item);
        }
        assert_eq!(queue.position(|i| *i == "b1"), Some(2));
        assert_eq!(queue.remove(|i| *i == "a1"), Some("a1"));
        assert_eq!(queue.remove(|i| *i == "zz"), None);
        assert_eq!(queue.position(|i| *i == "b1"), Some(1));
        assert_eq!(queue.drain(), ["b1", "a2", "b2"]);
        assert!(queue.is_empty());
        // Taking an item moves the queue's time on as popping it would.
        for (lane, item) in [(1, "a1"), (1, "a2"), (1, "a3"), (2, "b1")] {
            queue.push(lane, item);
        }
        assert_eq!(queue.take(|i| *i == "a2"), Some("a2"));
        queue.push(3, "c1");
        assert_eq!(order(&mut queue), ["a1", "b1", "c1", "a3"]);
    }

    #[test]
    fn the_lane_table_stays_bounded() {
        let mut queue = FairQueue::default();
        queue.push(u64::MAX, 0);
        for lane in 0..10_000_u64 {
            queue.push(lane, lane);
            queue.push(lane, lane);
            queue.pop();
            let _ = queue.remove(|&item| item == lane);
            assert!(
                queue.last.len() <= queue.len(),
                "{} lanes",
                queue.last.len()
            );
        }
    }
}
