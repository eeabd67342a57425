//! Key order across a rebalance (issue 30, item 9), on the real broker: two runtimes in one
//! consumer group, `key` mode, slow handlers (200-400 ms, as when a downstream slows and a
//! worker is added to help). The second runtime joins mid-run and takes partitions from the
//! first. No two handler calls of a key may overlap in time, across both runtimes; each key's
//! records are first handled in offset order; nothing is lost: every record is completed and
//! the group's committed positions reach the end of every partition.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use triage::ordering::OrderingMode;
use triage::runtime::{HandlerError, Job, Report, Runtime, RuntimeConfig};
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

use common::{
    broker_shared, create_topic, positions, produce_keyed, rand_name, BROKERS, HANG_GUARD,
};

const KEYS: u32 = 60;
const PER_KEY: u32 = 8;
const PARTITIONS: i32 = 4;
const TOTAL: usize = (KEYS * PER_KEY) as usize;
/// Records the first runtime completes alone before the second one joins.
const BEFORE_JOIN: usize = 48;

/// One handler call: which runtime, the record, and when it ran.
#[derive(Clone, Debug)]
struct Call {
    runtime: u8,
    key: u32,
    seq: u32,
    partition: i32,
    offset: i64,
    start: Instant,
    end: Instant,
}

type Calls = Arc<Mutex<Vec<Call>>>;

fn runtime(id: u8, calls: &Calls) -> Runtime<KafkaMessage> {
    let config = RuntimeConfig {
        workers: 16.try_into().unwrap(),
        // The default policies: Medium and Sheddable would be dropped if refused. A backlog
        // pulled ahead into the key gate before the lag is measured is not an overload, so
        // nothing is refused and every record is handled.
        ..RuntimeConfig::default()
    };
    let calls = Arc::clone(calls);
    Runtime::builder(config)
        .start(move |job: Job<KafkaMessage>| {
            let calls = Arc::clone(&calls);
            async move {
                let start = Instant::now();
                let m = job.payload();
                let text = std::str::from_utf8(m.payload.as_deref().unwrap_or_default())
                    .unwrap()
                    .to_owned();
                let (key, seq) = text.split_once(':').unwrap();
                tokio::time::sleep(Duration::from_millis(fastrand::u64(200..=400))).await;
                calls.lock().push(Call {
                    runtime: id,
                    key: key.parse().unwrap(),
                    seq: seq.parse().unwrap(),
                    partition: m.partition,
                    offset: m.offset,
                    start,
                    end: Instant::now(),
                });
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap()
}

fn source(group: &str, topic: &str) -> KafkaSource {
    let mut config = KafkaSourceConfig::new(BROKERS, group, [topic]);
    config.commit_interval_ms = 100;
    // A member learns of a rebalance at its next heartbeat: keep the join prompt.
    config
        .properties
        .insert("heartbeat.interval.ms".into(), "300".into());
    config
        .properties
        .insert("session.timeout.ms".into(), "6000".into());
    KafkaSource::builder(config)
        .ordering(OrderingMode::Key)
        .build()
        .unwrap()
}

/// A call as (runtime, seq).
type Who = (u8, u32);

/// Pairs of calls of one key that overlap in time, across both runtimes: (key, the two calls).
fn overlaps(calls: &[Call]) -> Vec<(u32, Who, Who)> {
    let mut by_key: BTreeMap<u32, Vec<&Call>> = BTreeMap::new();
    for c in calls {
        by_key.entry(c.key).or_default().push(c);
    }
    let mut out = Vec::new();
    for (key, mut v) in by_key {
        v.sort_by_key(|c| c.start);
        for (i, a) in v.iter().enumerate() {
            for b in &v[i + 1..] {
                if b.start < a.end {
                    out.push((key, (a.runtime, a.seq), (b.runtime, b.seq)));
                }
            }
        }
    }
    out
}

/// Keys whose records were not first handled in offset order: per key, the seqs in the order
/// of their first call's start.
fn first_handling_out_of_order(calls: &[Call]) -> Vec<(u32, Vec<u32>)> {
    let mut first: BTreeMap<(u32, u32), Instant> = BTreeMap::new();
    for c in calls {
        let at = first.entry((c.key, c.seq)).or_insert(c.start);
        *at = (*at).min(c.start);
    }
    let mut by_key: BTreeMap<u32, Vec<(Instant, u32)>> = BTreeMap::new();
    for ((key, seq), at) in first {
        by_key.entry(key).or_default().push((at, seq));
    }
    by_key
        .into_iter()
        .filter_map(|(key, mut v)| {
            v.sort();
            let seqs: Vec<u32> = v.into_iter().map(|(_, s)| s).collect();
            (!seqs.windows(2).all(|w| w[0] < w[1])).then_some((key, seqs))
        })
        .collect()
}

fn check_ledger(name: &str, report: &Report) {
    assert!(report.stats.balances(), "{name}: {report}");
    let total = report.stats.ledger.total();
    // Every record taken was completed or handed back; nothing else, nothing left inside.
    assert_eq!(
        (total.consumed, report.stats.alive),
        (total.completed + total.released, 0),
        "{name}: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_runtime_never_overlaps_a_key_with_the_one_it_takes_partitions_from() {
    let _broker = broker_shared().await;
    let (topic, group) = (rand_name("rebalance"), rand_name("g-rebalance"));
    create_topic(&topic, PARTITIONS, &[]).await;
    produce_keyed(&topic, KEYS, PER_KEY).await;
    let calls: Calls = Arc::default();

    let mut first = runtime(1, &calls);
    let source_1 = source(&group, &topic);
    // The source's own counters stay readable once it is inside the runtime.
    let stats_1 = source_1.stats_handle();
    first.attach(source_1);
    let waited = tokio::time::timeout(HANG_GUARD, async {
        while calls.lock().len() < BEFORE_JOIN {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "hang guard: {}", first.stats());

    // The second runtime joins mid-run: the group rebalances and it takes partitions.
    let mut second = runtime(2, &calls);
    let source_2 = source(&group, &topic);
    let stats_2 = source_2.stats_handle();
    second.attach(source_2);

    let all_done = tokio::time::timeout(HANG_GUARD, async {
        loop {
            let done: BTreeSet<(u32, u32)> = calls.lock().iter().map(|c| (c.key, c.seq)).collect();
            if done.len() == TOTAL {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        all_done.is_ok(),
        "hang guard: not every record completed\nfirst: {}\nsecond: {}",
        first.stats(),
        second.stats(),
    );
    // Nothing lost: the committed positions reach the end of every partition.
    let (g, t) = (group.clone(), topic.clone());
    let reached = tokio::time::timeout(HANG_GUARD, async {
        loop {
            let (g, t) = (g.clone(), t.clone());
            let at = tokio::task::spawn_blocking(move || positions(&g, &t, PARTITIONS))
                .await
                .unwrap();
            if at.iter().all(|(c, h)| c == h) {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("hang guard: the committed positions did not reach the end");
    assert_eq!(
        reached.iter().map(|(_, h)| *h).sum::<i64>(),
        TOTAL as i64,
        "{reached:?}"
    );

    let calls = calls.lock().clone();
    let by_runtime = |id| calls.iter().filter(|c| c.runtime == id).count();
    eprintln!(
        "group {group}: {} calls ({} by the first runtime, {} by the second) for {TOTAL} records",
        calls.len(),
        by_runtime(1),
        by_runtime(2)
    );
    assert!(by_runtime(2) > 0, "the second runtime took no partition");
    let overlapping = overlaps(&calls);
    let keys: BTreeSet<u32> = overlapping.iter().map(|(k, _, _)| *k).collect();
    assert!(
        overlapping.is_empty(),
        "{} pairs of overlapping calls on {} keys, e.g. {:?}",
        overlapping.len(),
        keys.len(),
        &overlapping[..overlapping.len().min(5)]
    );
    assert_eq!(first_handling_out_of_order(&calls), vec![]);
    // Each partition's records are each handled, and with offsets in partition order.
    let mut offsets: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
    for c in &calls {
        offsets.entry(c.partition).or_default().insert(c.offset);
    }
    for (p, (_, high)) in reached.iter().enumerate() {
        let seen = offsets.remove(&(p as i32)).unwrap_or_default();
        assert_eq!(seen, (0..*high).collect::<BTreeSet<_>>(), "partition {p}");
    }

    // The first member gave its partitions up once (eager rebalance: all of them) and got
    // some back; the second got its share; every handler of a revoked partition finished
    // within the wait; what the first held of them went back unprocessed.
    let (s1, s2) = (stats_1.snapshot(), stats_2.snapshot());
    eprintln!("first source: {s1:?}\nsecond source: {s2:?}");
    assert!(s1.revocations >= 1 && s1.assignments >= 2, "{s1:?}");
    assert!(s2.assignments >= 1, "{s2:?}");
    assert_eq!(s1.revoke_wait_exceeded + s2.revoke_wait_exceeded, 0);
    assert!(s1.revoke_released > 0, "{s1:?}");

    let report = first.shutdown(Duration::from_secs(20)).await;
    eprintln!("first runtime:\n{report}");
    check_ledger("first", &report);
    let released = report.stats.ledger.total().released;
    assert!(released >= s1.revoke_released, "{released} < {s1:?}");
    let report = second.shutdown(Duration::from_secs(20)).await;
    eprintln!("second runtime:\n{report}");
    check_ledger("second", &report);
}
