//! The pool's queue: fair between callers, first come first served within one. Each queued job
//! belongs to a lane (a caller: the pool only sees an opaque number) and gets a start tag when it
//! is queued, `max(V, the lane's finish tag)`, where `V` is the start tag of the job taken last and
//! a lane's finish tag is its last job's start tag plus its step; workers take the job with the
//! least tag (the older one on a tie). That is start-time fair queuing (SFQ) with one unit per call:
//! one lane's jobs keep their arrival order (so with a single caller this is the FIFO it replaces),
//! and a caller that arrives while another has 100 jobs queued is served after at most one of them,
//! since its tag is `V` and theirs are `V` and up. A lane keeps its finish tag after its last job
//! is taken, so a caller whose calls come back to back (each sent when the last returns) alternates
//! with a backlogged one instead of going first every time; a lane whose finish tag `V` has passed
//! banks nothing (its tag restarts at `V`) and is forgotten. Weights scale the step: a lane of
//! weight `w` advances `MAX_WEIGHT / w` per job (a step of 100 at weight 1), so it gets `w` turns to
//! another's one. Every operation is linear in the queued jobs, which `workers.queue_capacity`
//! bounds, and at most [`MAX_REMEMBERED`] lanes without queued jobs are remembered (passed ones
//! are dropped first once there are more).

use std::collections::{HashMap, VecDeque};

/// The largest weight: a lane of weight `w` advances its tag by `MAX_WEIGHT / w` per item, so one
/// of weight 2 is served twice as often as one of weight 1 while both wait.
pub const MAX_WEIGHT: u32 = 100;

/// Lanes remembered at most beside those with queued jobs: past it, the idle ones are forgotten
/// (they restart at `V`, as if they had been idle long).
pub const MAX_REMEMBERED: usize = 4096;

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
    /// The finish tag of each lane with items queued, and of idle lanes (at most
    /// [`MAX_REMEMBERED`] beyond the queued ones).
    finish: HashMap<u64, u64>,
    /// How many items each lane has queued (lanes with none are absent).
    queued: HashMap<u64, usize>,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            virtual_time: 0,
            finish: HashMap::new(),
            queued: HashMap::new(),
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
        self.queued.get(&lane).copied().unwrap_or(0)
    }

    /// Queues `item` in `lane`, whose share is `weight` (1 to [`MAX_WEIGHT`]).
    pub fn push(&mut self, lane: u64, weight: u32, item: T) {
        let step = u64::from(MAX_WEIGHT / weight.clamp(1, MAX_WEIGHT));
        let tag = match self.finish.get(&lane) {
            Some(&finish) => finish.max(self.virtual_time),
            None => self.virtual_time,
        };
        self.finish.insert(lane, tag + step);
        *self.queued.entry(lane).or_default() += 1;
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

    /// Counts `lane`'s item out; past [`MAX_REMEMBERED`] idle lanes, forgets those whose finish
    /// tag `V` has reached (they restart at `V` anyway), then if need be every idle one.
    fn forget(&mut self, lane: u64) {
        if let Some(n) = self.queued.get_mut(&lane) {
            *n -= 1;
            if *n == 0 {
                self.queued.remove(&lane);
            }
        }
        if self.finish.len() <= self.queued.len() + MAX_REMEMBERED {
            return;
        }
        let (now, queued) = (self.virtual_time, &self.queued);
        self.finish
            .retain(|lane, finish| *finish > now || queued.contains_key(lane));
        if self.finish.len() > self.queued.len() + MAX_REMEMBERED {
            self.finish.retain(|lane, _| queued.contains_key(lane));
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
        self.finish.clear();
        self.queued.clear();
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
                queue.push(3, 1, n);
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
    fn a_lane_calling_back_to_back_alternates_with_a_backlogged_one() {
        let mut queue = FairQueue::default();
        for item in ["a1", "a2", "a3", "a4"] {
            queue.push(1, 1, item);
        }
        assert_eq!(queue.pop(), Some("a1"));
        // b sends its next call only when the last returns: its lane is empty at every push.
        let mut order = Vec::new();
        for item in ["b1", "b2", "b3"] {
            queue.push(2, 1, item);
            order.push(queue.pop().unwrap());
            order.push(queue.pop().unwrap());
        }
        // One each: b waits for one of a's, and a for one of b's.
        assert_eq!(order, ["b1", "a2", "b2", "a3", "b3", "a4"]);
    }

    #[test]
    fn idle_lanes_are_forgotten_once_passed_and_past_the_bound() {
        let mut queue = FairQueue::default();
        for lane in 0..(MAX_REMEMBERED as u64 + 10) {
            queue.push(lane, 1, lane);
            queue.pop();
        }
        assert!(
            queue.finish.len() <= MAX_REMEMBERED + 1,
            "{}",
            queue.finish.len()
        );
        queue.push(u64::MAX, 1, 0);
        queue.push(u64::MAX, 1, 1);
        queue.pop();
        queue.pop();
        assert!(queue.finish.len() <= MAX_REMEMBERED + 1);
    }

    #[test]
    fn a_heavier_lane_gets_its_weight_in_turns() {
        let mut queue = FairQueue::default();
        for n in 0..6 {
            queue.push(1, 1, ("light", n));
            queue.push(2, 2, ("heavy", n));
        }
        let order: Vec<&str> = (0..6).map(|_| queue.pop().unwrap().0).collect();
        // Tags: light 0, 100, 200...; heavy 0, 50, 100, 150...: two heavy turns to one light.
        assert_eq!(
            order,
            ["light", "heavy", "heavy", "light", "heavy", "heavy"]
        );
    }

    #[test]
    fn a_lanes_length_counts_its_items_only() {
        let mut queue = FairQueue::default();
        for (lane, item) in [(1, "a1"), (2, "b1"), (1, "a2"), (1, "a3")] {
            queue.push(lane, 1, item);
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
            queue.push(1, 1, item);
        }
        assert_eq!(queue.pop(), Some("a1"));
        queue.push(2, 1, "b1");
        queue.push(2, 1, "b2");
        // b1's tag is V, below a2's: it is next; b2 ties with a2 and comes after it.
        assert_eq!(queue.position(|i| *i == "b1"), Some(1));
        assert_eq!(order(&mut queue), ["b1", "a2", "b2", "a3", "a4", "a5"]);
    }

    #[test]
    fn lanes_alternate_and_an_idle_lane_banks_nothing() {
        let mut queue = FairQueue::default();
        for item in ["a1", "a2", "a3"] {
            queue.push(1, 1, item);
        }
        for item in ["b1", "b2", "b3"] {
            queue.push(2, 1, item);
        }
        queue.push(3, 1, "c1");
        assert_eq!(
            order(&mut queue),
            ["a1", "b1", "c1", "a2", "b2", "a3", "b3"]
        );
        // Lane 3 was idle while the others were served: it starts again at V, owed nothing for the
        // turns it did not take; lane 1 starts at its finish tag (its last job was just served),
        // so lane 3 goes first and then the two alternate.
        for item in ["a4", "a5"] {
            queue.push(1, 1, item);
        }
        for item in ["c2", "c3", "c4"] {
            queue.push(3, 1, item);
        }
        assert_eq!(order(&mut queue), ["c2", "a4", "c3", "a5", "c4"]);
    }

    #[test]
    fn removal_position_and_drain() {
        let mut queue = FairQueue::default();
        for (lane, item) in [(1, "a1"), (1, "a2"), (2, "b1"), (2, "b2")] {
            queue.push(lane, 1, item);
        }
        assert_eq!(queue.position(|i| *i == "b1"), Some(2));
        assert_eq!(queue.remove(|i| *i == "a1"), Some("a1"));
        assert_eq!(queue.remove(|i| *i == "zz"), None);
        assert_eq!(queue.position(|i| *i == "b1"), Some(1));
        assert_eq!(queue.drain(), ["b1", "a2", "b2"]);
        assert!(queue.is_empty());
        // Taking an item moves the queue's time on as popping it would.
        for (lane, item) in [(1, "a1"), (1, "a2"), (1, "a3"), (2, "b1")] {
            queue.push(lane, 1, item);
        }
        assert_eq!(queue.take(|i| *i == "a2"), Some("a2"));
        queue.push(3, 1, "c1");
        assert_eq!(order(&mut queue), ["a1", "b1", "c1", "a3"]);
    }

    #[test]
    fn the_lane_table_stays_bounded() {
        let mut queue = FairQueue::default();
        queue.push(u64::MAX, 1, 0);
        for lane in 0..10_000_u64 {
            queue.push(lane, 1, lane);
            queue.push(lane, 1, lane);
            queue.pop();
            let _ = queue.remove(|&item| item == lane);
            assert!(
                queue.finish.len() <= queue.len() + MAX_REMEMBERED,
                "{} lanes",
                queue.finish.len()
            );
        }
    }
}
