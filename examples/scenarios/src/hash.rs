//! Per-message draws that do not depend on the order in which messages are served: a
//! message's service time and outcome are a hash of the seed, its id and its attempt, so the
//! FIFO and triage meet the same work for the same message, whatever order they serve it in.

/// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection with good avalanche.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 uniform bits for (`seed`, `stream`, `id`, `attempt`).
fn draw(seed: u64, stream: u64, id: u64, attempt: u32) -> u64 {
    mix64(
        seed ^ mix64(stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            ^ mix64(id.wrapping_add(0x632b_e59b_d9b4_e019))
            ^ mix64(u64::from(attempt).wrapping_mul(0xd1b5_4a32_d192_ed03) + 1),
    )
}

/// A uniform draw in `[0, 1)` for (`seed`, `stream`, `id`, `attempt`).
pub fn unit(seed: u64, stream: u64, id: u64, attempt: u32) -> f64 {
    (draw(seed, stream, id, attempt) >> 11) as f64 / (1u64 << 53) as f64
}

/// 64 uniform bits for (`seed`, `stream`, `id`).
pub fn bits(seed: u64, stream: u64, id: u64) -> u64 {
    draw(seed, stream, id, 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_are_spread_and_repeatable() {
        let n = 100_000u64;
        let mean: f64 = (0..n).map(|i| super::unit(7, 1, i, 0)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        assert_eq!(super::unit(7, 1, 42, 3), super::unit(7, 1, 42, 3));
        assert_ne!(super::unit(7, 1, 42, 3), super::unit(7, 1, 42, 2));
    }
}
