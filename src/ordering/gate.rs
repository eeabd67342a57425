//! [`KeyGate`]: at most one message per key past the gate, the rest parked in arrival order.

use crate::sync::{AtomicUsize, Ordering};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use parking_lot::Mutex;
use quanta::Instant;

/// What [`KeyGate::arrive`] did with a message.
#[derive(PartialEq, Eq)]
pub enum Arrival<T> {
    /// The key was free: the message goes on (it is now the key's message in flight).
    Admitted(T),
    /// The key is busy: the message waits in the gate behind the earlier ones of its key.
    Parked,
    /// The gate is closed (shutdown): the message is handed back to be released.
    Closed(T),
}

impl<T> fmt::Debug for Arrival<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arrival::Admitted(_) => "Admitted(..)",
            Arrival::Parked => "Parked",
            Arrival::Closed(_) => "Closed(..)",
        })
    }
}

struct State<T> {
    /// A key is present while one of its messages is past the gate; its deque holds the
    /// messages parked behind it, oldest first, with the instant each was parked.
    lanes: HashMap<u64, VecDeque<(T, Instant)>>,
    closed: bool,
}

/// The key gate of [ordered processing](crate::ordering): admit-or-park on arrival,
/// release-next on disposition.
///
/// A message whose key has no message past the gate is admitted (and its key becomes busy);
/// otherwise it is parked behind the earlier ones of its key. When the key's message has its
/// disposition, [`release_next`](KeyGate::release_next) hands out the next parked one (which
/// becomes the key's message) or frees the key. So no two messages of a key are ever past the
/// gate together, and they pass it in arrival order. The caller decides what a disposition is
/// (see the module docs for the runtime's rules): the gate only counts.
///
/// One mutex over a hash map of busy keys; each call holds it for a hash-map operation.
///
/// # Examples
///
/// ```
/// use triage::ordering::{Arrival, KeyGate};
///
/// let gate = KeyGate::new();
/// let now = triage::quanta::Clock::new().now();
/// assert_eq!(gate.arrive(7, "a", now), Arrival::Admitted("a"));
/// assert_eq!(gate.arrive(7, "b", now), Arrival::Parked);     // behind "a"
/// assert_eq!(gate.arrive(8, "c", now), Arrival::Admitted("c")); // another key runs at once
/// assert_eq!(gate.parked(), 1);
/// assert_eq!(gate.release_next(7), Some("b"));                 // "a" is done: "b" goes on
/// assert_eq!(gate.release_next(7), None);                      // "b" is done: key 7 is free
/// assert_eq!(gate.keys_in_flight(), 1);                        // key 8
/// ```
pub struct KeyGate<T> {
    state: Mutex<State<T>>,
    parked: AtomicUsize,
    keys: AtomicUsize,
}

impl<T> Default for KeyGate<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for KeyGate<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyGate")
            .field("keys_in_flight", &self.keys_in_flight())
            .field("parked", &self.parked())
            .finish()
    }
}

impl<T> KeyGate<T> {
    /// An open gate with no key busy.
    pub fn new() -> Self {
        KeyGate {
            state: Mutex::new(State {
                lanes: HashMap::new(),
                closed: false,
            }),
            parked: AtomicUsize::new(0),
            keys: AtomicUsize::new(0),
        }
    }

    /// A message of `key` arrives at `now`: admitted if its key is free (the key becomes
    /// busy), parked behind the key's earlier messages otherwise, handed back once the gate is
    /// [closed](KeyGate::close).
    pub fn arrive(&self, key: u64, item: T, now: Instant) -> Arrival<T> {
        let mut st = self.state.lock();
        if st.closed {
            return Arrival::Closed(item);
        }
        match st.lanes.get_mut(&key) {
            Some(lane) => {
                lane.push_back((item, now));
                self.parked.fetch_add(1, Ordering::Relaxed);
                Arrival::Parked
            }
            None => {
                st.lanes.insert(key, VecDeque::new());
                self.keys.fetch_add(1, Ordering::Relaxed);
                Arrival::Admitted(item)
            }
        }
    }

    /// The key's message past the gate has its disposition: the next parked message of `key`,
    /// now past the gate in its place, or `None` when none waits (the key is free again).
    /// Calling it for a key that is not busy does nothing and returns `None`.
    pub fn release_next(&self, key: u64) -> Option<T> {
        self.release_next_waited(key).map(|(item, _)| item)
    }

    /// As [`release_next`](KeyGate::release_next), with the instant the released message was
    /// parked (for the time it waited behind its key).
    pub fn release_next_waited(&self, key: u64) -> Option<(T, Instant)> {
        let mut st = self.state.lock();
        let lane = st.lanes.get_mut(&key)?;
        match lane.pop_front() {
            Some(next) => {
                self.parked.fetch_sub(1, Ordering::Relaxed);
                Some(next)
            }
            None => {
                st.lanes.remove(&key);
                self.keys.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keys with a message past the gate.
    pub fn keys_in_flight(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Messages parked behind a busy key.
    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    /// How long the longest-parked message has waited at `now` (zero when none is parked).
    /// Scans the busy keys: for a sampler, not for every message.
    pub fn longest_wait(&self, now: Instant) -> Duration {
        if self.parked() == 0 {
            return Duration::ZERO;
        }
        let st = self.state.lock();
        st.lanes
            .values()
            .filter_map(|lane| lane.front())
            .map(|(_, at)| now.saturating_duration_since(*at))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Takes out of the gate the first parked message of each key for which `pred` returns
    /// `true`, **with every message parked behind it** (the later ones of its key): none of
    /// them may pass the gate before it, so they leave together. Each key's messages come out
    /// oldest first; the keys in no particular order. The keys stay busy: their messages past
    /// the gate still have their dispositions to come (and a release then lets through the
    /// next message still parked, if any). `pred` sees the parked messages of each key in
    /// order up to its first match, and none after it.
    ///
    /// For a caller that must withdraw parked messages without serving them: those of a
    /// source that lost them (a revoked partition: every message of the key matches), or
    /// those that have waited as long as their broker allows unacknowledged. Visits every
    /// parked message at most once, under the gate's lock: for events and periodic sweeps,
    /// not for every message.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::ordering::KeyGate;
    ///
    /// let gate = KeyGate::new();
    /// let now = triage::quanta::Clock::new().now();
    /// // (partition, offset): key 7 of partition 0, key 8 of partition 1; the first message
    /// // of each is past the gate.
    /// for (key, m) in [(7, (0, 1)), (7, (0, 2)), (8, (1, 3)), (8, (1, 4)), (7, (0, 5))] {
    ///     let _ = gate.arrive(key, m, now);
    /// }
    /// // Partition 1 was revoked: its parked message leaves, the others wait on.
    /// assert_eq!(gate.drain_where(|&(p, _)| p == 1), [(1, 4)]);
    /// assert_eq!(gate.parked(), 2);
    /// // A parked message that must leave takes the later ones of its key with it.
    /// assert_eq!(gate.drain_where(|&(_, offset)| offset == 2), [(0, 2), (0, 5)]);
    /// assert_eq!((gate.parked(), gate.keys_in_flight()), (0, 2));
    /// ```
    pub fn drain_where(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut st = self.state.lock();
        let mut out = Vec::new();
        for lane in st.lanes.values_mut() {
            if let Some(first) = lane.iter().position(|(item, _)| pred(item)) {
                out.extend(lane.drain(first..).map(|(item, _)| item));
            }
        }
        self.parked.fetch_sub(out.len(), Ordering::Relaxed);
        out
    }

    /// The message of `key` past the gate left without a disposition (handed back to its
    /// source unprocessed): frees the key and returns every message parked behind it, oldest
    /// first, which must leave with it (served now, they would run before it comes back).
    /// Returns nothing, and changes nothing, for a key that is not busy. One hash-map removal,
    /// where [`drain_where`](KeyGate::drain_where) would visit every parked message.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::ordering::{Arrival, KeyGate};
    ///
    /// let gate = KeyGate::new();
    /// let now = triage::quanta::Clock::new().now();
    /// assert_eq!(gate.arrive(7, "a", now), Arrival::Admitted("a"));
    /// assert_eq!(gate.arrive(7, "b", now), Arrival::Parked);
    /// // "a" is handed back to the broker: "b" goes back with it, and key 7 is free.
    /// assert_eq!(gate.withdraw(7), ["b"]);
    /// assert_eq!((gate.keys_in_flight(), gate.parked()), (0, 0));
    /// assert_eq!(gate.arrive(7, "a", now), Arrival::Admitted("a"));
    /// assert!(gate.withdraw(8).is_empty());
    /// ```
    pub fn withdraw(&self, key: u64) -> Vec<T> {
        let mut st = self.state.lock();
        let Some(lane) = st.lanes.remove(&key) else {
            return Vec::new();
        };
        self.keys.fetch_sub(1, Ordering::Relaxed);
        self.parked.fetch_sub(lane.len(), Ordering::Relaxed);
        lane.into_iter().map(|(item, _)| item).collect()
    }

    /// Closes the gate (shutdown): returns every parked message, oldest first per key, and
    /// hands back every later arrival. Keys stay busy until their message past the gate is
    /// released, which then frees them.
    pub fn close(&self) -> Vec<T> {
        let mut st = self.state.lock();
        st.closed = true;
        let mut out = Vec::with_capacity(self.parked());
        for lane in st.lanes.values_mut() {
            out.extend(lane.drain(..).map(|(item, _)| item));
        }
        self.parked.fetch_sub(out.len(), Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_hands_back_parked_and_later_arrivals_and_frees_keys_on_release() {
        let gate = KeyGate::new();
        let now = quanta::Clock::new().now();
        assert_eq!(gate.arrive(1, 10, now), Arrival::Admitted(10));
        assert_eq!(gate.arrive(1, 11, now), Arrival::Parked);
        assert_eq!(gate.arrive(1, 12, now), Arrival::Parked);
        assert_eq!(gate.close(), vec![11, 12]);
        assert_eq!(gate.parked(), 0);
        assert_eq!(gate.arrive(2, 20, now), Arrival::Closed(20));
        assert_eq!(gate.keys_in_flight(), 1);
        assert_eq!(gate.release_next(1), None);
        assert_eq!(gate.keys_in_flight(), 0);
    }

    /// Withdrawing from the middle of a key's parked messages takes the rest of the key with
    /// it and leaves the earlier ones in order; keys without a match are untouched; the keys
    /// stay busy; the counts follow.
    #[test]
    fn drain_where_takes_the_rest_of_a_key_with_its_first_match() {
        let gate = KeyGate::new();
        let now = quanta::Clock::new().now();
        assert_eq!(gate.arrive(1, 10, now), Arrival::Admitted(10));
        for n in 11..=14 {
            assert_eq!(gate.arrive(1, n, now), Arrival::Parked);
        }
        assert_eq!(gate.arrive(2, 20, now), Arrival::Admitted(20));
        assert_eq!(gate.arrive(2, 21, now), Arrival::Parked);
        let mut seen = Vec::new();
        let mut out = gate.drain_where(|&n| {
            seen.push(n);
            n == 12 || n == 14
        });
        out.sort_unstable();
        assert_eq!(out, [12, 13, 14]);
        seen.sort_unstable();
        assert_eq!(
            seen,
            [11, 12, 21],
            "nothing after a key's first match is offered"
        );
        assert_eq!((gate.parked(), gate.keys_in_flight()), (2, 2));
        // Key 1 goes on in order; key 2 stays busy, so a later arrival parks.
        assert_eq!(gate.arrive(2, 22, now), Arrival::Parked);
        assert_eq!(gate.release_next(1), Some(11));
        assert_eq!(gate.release_next(1), None);
        assert_eq!(gate.release_next(2), Some(21));
        assert_eq!(gate.release_next(2), Some(22));
        assert_eq!(gate.release_next(2), None);
        assert!(gate.drain_where(|_| true).is_empty());
        assert_eq!((gate.parked(), gate.keys_in_flight()), (0, 0));
    }

    #[test]
    fn longest_wait_is_the_oldest_parked() {
        let (clock, mock) = quanta::Clock::mock();
        let gate = KeyGate::new();
        assert_eq!(gate.arrive(1, 1, clock.now()), Arrival::Admitted(1));
        assert_eq!(gate.arrive(1, 2, clock.now()), Arrival::Parked);
        mock.increment(Duration::from_millis(30));
        assert_eq!(gate.arrive(2, 3, clock.now()), Arrival::Admitted(3));
        assert_eq!(gate.arrive(2, 4, clock.now()), Arrival::Parked);
        mock.increment(Duration::from_millis(20));
        assert_eq!(gate.longest_wait(clock.now()), Duration::from_millis(50));
        assert_eq!(gate.release_next(1), Some(2));
        assert_eq!(gate.longest_wait(clock.now()), Duration::from_millis(20));
    }
}
