//! Model test of the key-ordering bookkeeping: random arrivals, dispatches, completions,
//! failures with retries, expiries (in the queue and while parked), evictions (shed, or held
//! under backpressure and re-admitted) run through the [`KeyGate`] with the release protocol
//! the runtime follows (`Inner::settle` -> `Inner::release`), and recalls: a source takes back
//! every message of one of its streams (a Kafka partition revoked), so the parked ones leave the
//! gate (`KeyGate::drain_where`), those queued, held or waiting to retry are released and free
//! their key, and those running finish (a retry of theirs is released when it would start).
//! After every step: no two messages of one key are inside the runtime together, nothing taken
//! back is parked or inside but what was running, and every key's dispositions, completions
//! among them, are in arrival (offset) order. At the end, every message has exactly one end: a
//! disposition, or released.

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use triage::ordering::{Arrival, KeyGate};
use triage::quanta::Clock;

#[derive(Clone, Copy, Debug)]
enum Action {
    /// A message of key `key` arrives; `expires_parked`: its deadline passes before its turn
    /// if it has to wait behind its key.
    Arrive { key: u8, expires_parked: bool },
    /// A worker takes the `n`-th queued message.
    Start(usize),
    /// The `n`-th running message completes.
    Complete(usize),
    /// The `n`-th running message fails (retried while attempts remain, else `Failed`).
    Fail(usize),
    /// The `n`-th message waiting to retry is offered again (queued).
    RetryDue(usize),
    /// The `n`-th queued message is past its deadline at dequeue: `Expired`.
    Expire(usize),
    /// The `n`-th queued message is evicted by a more important one: shed (`drop` policy) or
    /// held (`backpressure`, and `defer` for a keyed message).
    Evict { n: usize, shed: bool },
    /// The `n`-th held message is admitted again (queued).
    Readmit(usize),
    /// The source takes back every message of `stream` it delivered so far.
    Recall { stream: u8 },
}

/// Streams (partitions) the keys are spread over: a key's messages are all of one stream.
const STREAMS: u8 = 2;

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..6u8, proptest::bool::weighted(0.15))
            .prop_map(|(key, expires_parked)| Action::Arrive { key, expires_parked }),
        4 => (0..8usize).prop_map(Action::Start),
        4 => (0..8usize).prop_map(Action::Complete),
        2 => (0..8usize).prop_map(Action::Fail),
        2 => (0..8usize).prop_map(Action::RetryDue),
        1 => (0..8usize).prop_map(Action::Expire),
        1 => (0..8usize, any::<bool>()).prop_map(|(n, shed)| Action::Evict { n, shed }),
        2 => (0..8usize).prop_map(Action::Readmit),
        1 => (0..STREAMS).prop_map(|stream| Action::Recall { stream }),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Queued,
    Running,
    Retrying,
    Held,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Completed,
    Failed,
    Expired,
    Shed,
    /// Handed back unprocessed (recalled): no disposition; the broker redelivers it.
    Released,
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    key: u64,
    offset: u64,
    attempt: u32,
    expires_parked: bool,
    /// Its stream's recall epoch when it arrived: older than the stream's now, taken back.
    epoch: u32,
}

impl Msg {
    fn stream(&self) -> usize {
        (self.key % u64::from(STREAMS)) as usize
    }
}

const MAX_RETRIES: u32 = 2;

struct Sim {
    gate: KeyGate<Msg>,
    clock: Clock,
    /// Messages past the gate, inside the runtime.
    inside: Vec<(Msg, Phase)>,
    /// Per key, every disposition in the order it happened: (offset, how).
    ends: BTreeMap<u64, Vec<(u64, End)>>,
    arrived: u64,
    /// Per stream, how many recalls it had.
    epochs: [u32; STREAMS as usize],
    /// Offsets of the messages running when their stream was recalled: the only ones taken
    /// back that may stay inside (with their retries) until they end.
    running_at_recall: HashSet<u64>,
    /// Every message that arrived, by offset.
    all: Vec<Msg>,
}

impl Sim {
    fn nth(&self, phase: Phase, n: usize) -> Option<usize> {
        let of: Vec<usize> = (0..self.inside.len())
            .filter(|i| self.inside[*i].1 == phase)
            .collect();
        if of.is_empty() {
            None
        } else {
            Some(of[n % of.len()])
        }
    }

    /// What the runtime does on a disposition: record it, then let the key's next message
    /// through; one expired while parked is settled at once and lets the next one through.
    fn settle(&mut self, msg: Msg, end: End) {
        self.ends
            .entry(msg.key)
            .or_default()
            .push((msg.offset, end));
        let mut key = msg.key;
        loop {
            match self.gate.release_next(key) {
                None => return,
                Some(next) if next.expires_parked => {
                    self.ends
                        .entry(next.key)
                        .or_default()
                        .push((next.offset, End::Expired));
                    key = next.key;
                }
                Some(next) => {
                    self.inside.push((next, Phase::Queued));
                    return;
                }
            }
        }
    }

    fn take(&mut self, i: usize) -> Msg {
        self.inside.swap_remove(i).0
    }

    fn recalled(&self, msg: &Msg) -> bool {
        msg.epoch < self.epochs[msg.stream()]
    }

    fn step(&mut self, action: Action) {
        match action {
            Action::Arrive {
                key,
                expires_parked,
            } => {
                let msg = Msg {
                    key: u64::from(key),
                    offset: self.arrived,
                    attempt: 0,
                    expires_parked,
                    epoch: self.epochs[usize::from(key % STREAMS)],
                };
                self.arrived += 1;
                self.all.push(msg);
                match self.gate.arrive(msg.key, msg, self.clock.now()) {
                    Arrival::Admitted(msg) => self.inside.push((msg, Phase::Queued)),
                    Arrival::Parked => {}
                    Arrival::Closed(_) => panic!("the gate is open"),
                }
            }
            Action::Start(n) => {
                if let Some(i) = self.nth(Phase::Queued, n) {
                    if self.recalled(&self.inside[i].0) {
                        // The last check before a handler: taken back, released, never run.
                        let msg = self.take(i);
                        self.settle(msg, End::Released);
                    } else {
                        self.inside[i].1 = Phase::Running;
                    }
                }
            }
            Action::Complete(n) => {
                if let Some(i) = self.nth(Phase::Running, n) {
                    let msg = self.take(i);
                    self.settle(msg, End::Completed);
                }
            }
            Action::Fail(n) => {
                if let Some(i) = self.nth(Phase::Running, n) {
                    if self.inside[i].0.attempt < MAX_RETRIES {
                        self.inside[i].0.attempt += 1;
                        self.inside[i].1 = Phase::Retrying;
                    } else {
                        let msg = self.take(i);
                        self.settle(msg, End::Failed);
                    }
                }
            }
            Action::RetryDue(n) => {
                if let Some(i) = self.nth(Phase::Retrying, n) {
                    self.inside[i].1 = Phase::Queued;
                }
            }
            Action::Expire(n) => {
                if let Some(i) = self.nth(Phase::Queued, n) {
                    let msg = self.take(i);
                    self.settle(msg, End::Expired);
                }
            }
            Action::Evict { n, shed } => {
                if let Some(i) = self.nth(Phase::Queued, n) {
                    if shed {
                        let msg = self.take(i);
                        self.settle(msg, End::Shed);
                    } else {
                        self.inside[i].1 = Phase::Held;
                    }
                }
            }
            Action::Readmit(n) => {
                if let Some(i) = self.nth(Phase::Held, n) {
                    self.inside[i].1 = Phase::Queued;
                }
            }
            Action::Recall { stream } => {
                let stream = usize::from(stream);
                self.epochs[stream] += 1;
                // The parked first: releasing a key below must not let one of them through.
                let epochs = self.epochs;
                let mut parked = self
                    .gate
                    .drain_where(|m| m.stream() == stream && m.epoch < epochs[stream]);
                parked.sort_by_key(|m| m.offset);
                for msg in parked {
                    self.ends
                        .entry(msg.key)
                        .or_default()
                        .push((msg.offset, End::Released));
                }
                let mut i = 0;
                while i < self.inside.len() {
                    let (msg, phase) = self.inside[i];
                    if !self.recalled(&msg) {
                        i += 1;
                    } else if phase == Phase::Running {
                        self.running_at_recall.insert(msg.offset);
                        i += 1;
                    } else {
                        let msg = self.take(i);
                        self.settle(msg, End::Released);
                    }
                }
            }
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let mut keys = HashSet::new();
        for (msg, _) in &self.inside {
            prop_assert!(
                keys.insert(msg.key),
                "two messages of key {} inside together",
                msg.key
            );
        }
        prop_assert_eq!(self.gate.keys_in_flight(), keys.len());
        let ended: usize = self.ends.values().map(Vec::len).sum();
        prop_assert_eq!(
            self.gate.parked() as u64,
            self.arrived - ended as u64 - self.inside.len() as u64,
            "every message is parked, inside or ended"
        );
        for (key, ends) in &self.ends {
            // A released message gets no disposition here: the broker delivers it again.
            let settled: Vec<&(u64, End)> =
                ends.iter().filter(|(_, e)| *e != End::Released).collect();
            prop_assert!(
                settled.windows(2).all(|w| w[0].0 < w[1].0),
                "key {key}: dispositions out of offset order: {ends:?}"
            );
        }
        for (msg, _) in &self.inside {
            prop_assert!(
                !self.recalled(msg) || self.running_at_recall.contains(&msg.offset),
                "taken back, yet inside without having run: {msg:?}"
            );
        }
        // Parked: arrived, neither ended nor inside.
        let ended: HashSet<u64> = self.ends.values().flatten().map(|(o, _)| *o).collect();
        let inside: HashSet<u64> = self.inside.iter().map(|(m, _)| m.offset).collect();
        let parked_recalled: Vec<&Msg> = self
            .all
            .iter()
            .filter(|m| {
                self.recalled(m) && !ended.contains(&m.offset) && !inside.contains(&m.offset)
            })
            .collect();
        prop_assert!(
            parked_recalled.is_empty(),
            "taken back, yet parked: {parked_recalled:?}"
        );
        Ok(())
    }

    /// Serves everything left: every message inside completes, which lets the parked through.
    fn finish(&mut self) {
        while let Some((msg, phase)) = self.inside.pop() {
            let end = if self.recalled(&msg) && phase != Phase::Running {
                End::Released
            } else {
                End::Completed
            };
            self.settle(msg, end);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/ordering_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn one_message_per_key_inside_and_dispositions_in_offset_order(
        actions in proptest::collection::vec(action(), 1..400),
    ) {
        let mut sim = Sim {
            gate: KeyGate::new(),
            clock: Clock::new(),
            inside: Vec::new(),
            ends: BTreeMap::new(),
            arrived: 0,
            epochs: [0; STREAMS as usize],
            running_at_recall: HashSet::new(),
            all: Vec::new(),
        };
        for action in actions {
            sim.step(action);
            sim.check()?;
        }
        sim.finish();
        sim.check()?;
        prop_assert_eq!(sim.gate.parked(), 0);
        prop_assert_eq!(sim.gate.keys_in_flight(), 0);
        let mut offsets: Vec<u64> = sim.ends.values().flatten().map(|(o, _)| *o).collect();
        offsets.sort_unstable();
        prop_assert_eq!(offsets, (0..sim.arrived).collect::<Vec<_>>(), "exactly one disposition each");
    }
}
