//! Configuration of pull-based admission.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Pull-based admission: what a consumer sheds, and when, from the arrival rate it infers from
/// the broker's lag against the capacity it measures. See [`PullAdmission`](super::PullAdmission).
///
/// # Examples
///
/// ```
/// use triage::admission::PullAdmissionConfig;
///
/// let config: PullAdmissionConfig = toml::from_str("window_ms = 2000\noverload_ratio = 1.1\n")?;
/// config.validate()?;
/// assert_eq!(config.headroom, 0.95);
///
/// let bad: PullAdmissionConfig = toml::from_str("headroom = 1.5")?;
/// assert_eq!(bad.validate().unwrap_err().field(), "headroom");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PullAdmissionConfig {
    /// Whether pulled messages are ever refused for overload. When `false`, a pull-based source
    /// is bounded only by the queue's capacity and `max_held` (backpressure), and nothing is
    /// deferred but what eviction moves out of the way. Default `true`.
    pub enabled: bool,
    /// How often the arrival rate, capacity and shed level are re-estimated, in milliseconds.
    /// Allowed `10..=10_000`. Default `100`.
    pub tick_ms: u64,
    /// The sliding window over which the arrival and completion rates are measured, in
    /// milliseconds: longer is steadier, shorter reacts sooner. At least two ticks, and at
    /// least the interval at which the sources refresh their lag (Kafka's statistics
    /// interval). Allowed `tick_ms × 2..=600_000`. Default `1000`.
    pub window_ms: u64,
    /// The longer window over which arrival beyond capacity counts as *sustained*, in
    /// milliseconds. A tier is refused only when the arrival of the admitted tiers exceeds
    /// `overload_ratio ×` capacity over `window_ms` **and** either the backlog would make the
    /// lowest admitted tier miss its deadlines, or the excess holds over this window too, with
    /// the backlog growing over it. Arrival that reaches the broker in bursts (a producer or a
    /// broker that stalls, then catches up) averages out over it; sustained overload does not.
    /// A value below `window_ms` acts as `window_ms`. Allowed `tick_ms × 2..=600_000`.
    /// Default `3000`.
    pub sustained_ms: u64,
    /// Arrival beyond capacity is arrival above `overload_ratio ×` the measured capacity. Above
    /// 1 so that a worker offered exactly its capacity (1x) sheds nothing.
    /// Allowed `1.0..=10.0`. Default `1.05`.
    pub overload_ratio: f64,
    /// While overloaded, the highest tiers are admitted whose combined arrival rate fits
    /// within `headroom ×` capacity; the rest, from Sheddable up, are refused (Critical never is).
    /// Allowed `0.5..=1.0`. Default `0.95`.
    pub headroom: f64,
    /// Shed tiers are re-admitted (bottom-up: the most important first) once, with them
    /// admitted, the arrival has fitted `headroom ×` capacity, or has fitted `overload_ratio ×`
    /// capacity over both windows with no deadline miss predicted, for this long, in
    /// milliseconds. Allowed `0..=600_000`. Default `500`.
    pub recover_ms: u64,
    /// While not overloaded, the intake pulls only while fewer than `prefetch_per_slot ×` the
    /// concurrency limit messages are queued: enough that no worker idles, few enough that a
    /// backlog stays in the broker (the buffer) and is served in order. While overloaded the
    /// intake pulls ahead to reach more important work behind the refused tiers. Allowed
    /// `1..=1000`. Default `2`.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 1, 1000>")]
    pub prefetch_per_slot: usize,
    /// Whether the zero-configuration controls are on, derived from the measured capacity and
    /// the deadline slack messages arrive with:
    /// - **How far the intake pulls ahead** while not overloaded: as many messages as the
    ///   workers clear within the shortest slack of the admitted tiers, at most half of
    ///   `queue.capacity`, never fewer than the prefetch (the prefetch alone while a message is
    ///   parked behind a busy key); in key mode also how far it looks past messages parked
    ///   behind busy keys, at least 8 × the prefetch (see
    ///   [`derived_lookahead`](super::derived_lookahead)).
    /// - **Deadline-ordered service**: the queue serves the tier whose head is due first ahead
    ///   of the weighted order when every more important tier's queued work would still meet
    ///   its deadlines at the measured capacity, the job served early taking as long as its
    ///   tier's longest run (slack stealing), and then a tier past its
    ///   concurrency share may be served too (with `work_conserving`); in key mode only while
    ///   no message waits behind a busy key (one served late would hold them all).
    /// - **Cohorts weighed at what their users send**: of the tier admitted in part, a cohort
    ///   refused within the window counts at its rate while admitted, not at its pulls, which
    ///   its producers' re-submissions inflate (a retry storm).
    ///
    /// An expert setting: `false` restores the controls before them (8 × the prefetch, service
    /// by weight alone, cohorts weighed at their pulls), whatever the deadlines. Default `true`.
    pub derive_bounds: bool,
}

impl Default for PullAdmissionConfig {
    fn default() -> Self {
        PullAdmissionConfig {
            enabled: true,
            tick_ms: 100,
            window_ms: 1000,
            sustained_ms: 3000,
            overload_ratio: 1.05,
            headroom: 0.95,
            recover_ms: 500,
            prefetch_per_slot: 2,
            derive_bounds: true,
        }
    }
}

impl PullAdmissionConfig {
    /// Pull-based admission switched off.
    pub fn disabled() -> Self {
        PullAdmissionConfig {
            enabled: false,
            ..PullAdmissionConfig::default()
        }
    }

    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range (paths relative to this table).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(10..=10_000).contains(&self.tick_ms) {
            return Err(ConfigError::new("tick_ms", self.tick_ms, "10..=10000"));
        }
        let min_window = self.tick_ms * 2;
        if !(min_window..=600_000).contains(&self.window_ms) {
            return Err(ConfigError::new(
                "window_ms",
                self.window_ms,
                format!("{min_window}..=600000 (at least two ticks)"),
            ));
        }
        if !(min_window..=600_000).contains(&self.sustained_ms) {
            return Err(ConfigError::new(
                "sustained_ms",
                self.sustained_ms,
                format!("{min_window}..=600000 (at least two ticks)"),
            ));
        }
        if !(1.0..=10.0).contains(&self.overload_ratio) {
            return Err(ConfigError::new(
                "overload_ratio",
                self.overload_ratio,
                "1.0..=10.0",
            ));
        }
        if !(0.5..=1.0).contains(&self.headroom) {
            return Err(ConfigError::new("headroom", self.headroom, "0.5..=1.0"));
        }
        if self.recover_ms > 600_000 {
            return Err(ConfigError::new(
                "recover_ms",
                self.recover_ms,
                "0..=600000",
            ));
        }
        if !(1..=1000).contains(&self.prefetch_per_slot) {
            return Err(ConfigError::new(
                "prefetch_per_slot",
                self.prefetch_per_slot,
                "1..=1000",
            ));
        }
        Ok(())
    }
}
