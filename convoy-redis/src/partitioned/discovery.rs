//! Discovery: finding partitions to take in the partition indexes, read
//! with SSCAN in bounded steps, shard by shard, round and round; fully
//! (still in bounded steps) only after a change that may have freed units.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redis::Value;

use super::super::reply::text;
use super::Shared;
use crate::tracing;
use convoy_core::envelope::now_ms;
use convoy_core::error::Error;
use convoy_core::names;

/// The most index entries one heartbeat's discovery reads.
const SCAN_BUDGET: usize = 16_384;

/// How many index entries one SSCAN call asks for.
const SCAN_COUNT: usize = 1_024;

/// Where discovery stands.
#[derive(Debug)]
pub(super) struct Discovery {
    /// Where discovery reads the partition indexes next: a position (a
    /// category and a shard) and its SSCAN cursor (bounded work per
    /// heartbeat, however many partitions).
    scan: (u32, u64),
    /// Whether to run a full discovery: something may have freed units
    /// (start, another instance came or went, a reconnect). Cleared by a
    /// whole pass over the indexes that took nothing.
    rescan: bool,
    /// Units taken since the current pass over the indexes began.
    pass_taken: usize,
    /// Full discovery goes on at least until then (leases of an instance
    /// that just went lapse with its liveness, maybe a little later).
    rescan_until: Option<Instant>,
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            scan: (0, 0),
            rescan: true,
            pass_taken: 0,
            rescan_until: None,
        }
    }
}

/// How much one discovery step reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Step {
    /// Candidates wanted.
    pub(super) want: usize,
    /// Index entries read at most.
    pub(super) budget: usize,
    /// SSCAN calls per position at most (0: one call in all).
    pub(super) rounds: u32,
}

impl Step {
    /// A full discovery after a change that may have freed units (start,
    /// another instance came or went, a reconnect); else a slow crawl of
    /// the indexes, a bounded step per heartbeat (the deficit may be only
    /// rounding, with every unit held).
    pub(super) fn for_deficit(deficit: usize, rescan: bool) -> Step {
        if rescan {
            Step {
                want: deficit.saturating_mul(2).clamp(64, SCAN_BUDGET),
                budget: SCAN_BUDGET,
                rounds: 4,
            }
        } else {
            Step {
                want: deficit.saturating_mul(2).clamp(16, 256),
                budget: SCAN_COUNT,
                rounds: 0,
            }
        }
    }
}

/// Where the scan goes after `position` answered with cursor `next`, of
/// `positions` in all; and whether it came round to the first again.
fn advance(position: u32, next: u64, positions: u32) -> ((u32, u64), bool) {
    if next != 0 {
        ((position, next), false)
    } else if position + 1 >= positions {
        ((0, 0), true)
    } else {
        ((position + 1, 0), false)
    }
}

impl Discovery {
    /// Runs full discovery for at least `how_long`.
    pub(super) fn rescan_for(&mut self, how_long: Duration) {
        self.rescan = true;
        self.rescan_until = Some(Instant::now() + how_long);
    }

    /// Whether a full discovery is on.
    pub(super) fn rescanning(&self) -> bool {
        self.rescan
    }

    /// Counts `took` units taken by the last step; a pass that ended
    /// (`wrapped`) having taken nothing ends the full discovery, once its
    /// minimum time is over.
    pub(super) fn taken(&mut self, took: usize, wrapped: bool) {
        self.pass_taken += took;
        if wrapped {
            if self.pass_taken == 0 && self.rescan_until.is_none_or(|t| Instant::now() >= t) {
                self.rescan = false;
            }
            self.pass_taken = 0;
        }
    }

    /// Up to `step.want` partition keys from the indexes for which `known`
    /// is false (owned, or known to be held elsewhere), read with SSCAN
    /// from where the last call stopped (shard by shard, round and round):
    /// at most `step.budget` index entries, and one SSCAN call per shard
    /// and category times `step.rounds` (at least one call). Also returns
    /// whether the read came round to the first shard again (a pass ended).
    pub(super) async fn discover(
        &mut self,
        s: &Shared,
        step: Step,
        known: impl Fn(&str) -> bool,
    ) -> Result<(Vec<String>, bool), Error> {
        let mut conn = s.redis.shared().await?;
        let categories = s.categories();
        let positions = s.shards.saturating_mul(categories.len() as u32).max(1);
        let max_calls = positions.saturating_mul(step.rounds).max(1);
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let mut read = 0usize;
        let mut calls = 0u32;
        let mut wrapped = false;
        let mut failures = 0u32;
        let within = s.settings.heartbeat;
        while found.len() < step.want && read < step.budget && calls < max_calls {
            calls += 1;
            let (position, cursor) = self.scan;
            let category = categories[(position / s.shards) as usize % categories.len()];
            let index = names::partition_index(position % s.shards, category);
            let mut sscan = redis::cmd("SSCAN");
            sscan.arg(&index).arg(cursor).arg("COUNT").arg(SCAN_COUNT);
            let read_index = sscan.query_async::<(u64, Vec<Value>)>(&mut conn);
            let (next, members) = match tokio::time::timeout(within, read_index).await {
                Ok(Ok(r)) => r,
                failed => {
                    // A shard that does not answer is passed over (read
                    // again in the next pass), so the others are reached.
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no reply within {within:?}"),
                    };
                    tracing::warn!(
                        handler = s.group(),
                        index,
                        error,
                        "cannot read a partition index now; going on with the next"
                    );
                    failures += 1;
                    if failures >= positions {
                        return Err(Error::redis(
                            "failed to read the partition indexes",
                            redis::RedisError::from(std::io::Error::other(error)),
                        ));
                    }
                    (0, Vec::new())
                }
            };
            read += members.len();
            // A member that is not UTF-8 (written by hand: keys are checked
            // when raised) cannot name a unit; it is passed over, not a
            // reason to stop scanning.
            let keys = members.iter().filter_map(text);
            for k in keys {
                if !known(&k) && seen.insert(k.clone()) {
                    found.push(k);
                }
            }
            let (scan, came_round) = advance(position, next, positions);
            self.scan = scan;
            wrapped |= came_round;
        }
        Ok((found, wrapped))
    }
}

/// A cheap deterministic shuffle, different per instance, so instances
/// competing for free units mostly try different ones first.
pub(super) fn shuffle(v: &mut [String], seed: &str) {
    let mut x: u64 = seed.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) ^ now_ms();
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_discovery_reads_more_than_the_crawl() {
        assert_eq!(
            Step::for_deficit(1, true),
            Step {
                want: 64,
                budget: SCAN_BUDGET,
                rounds: 4
            }
        );
        assert_eq!(Step::for_deficit(100_000, true).want, SCAN_BUDGET);
        assert_eq!(
            Step::for_deficit(1, false),
            Step {
                want: 16,
                budget: SCAN_COUNT,
                rounds: 0
            }
        );
        assert_eq!(Step::for_deficit(100, false).want, 200);
        assert_eq!(Step::for_deficit(usize::MAX, false).want, 256);
    }

    #[test]
    fn the_scan_goes_shard_by_shard_round_and_round() {
        assert_eq!(advance(0, 17, 4), ((0, 17), false));
        assert_eq!(advance(0, 0, 4), ((1, 0), false));
        assert_eq!(advance(3, 0, 4), ((0, 0), true));
        assert_eq!(advance(0, 0, 1), ((0, 0), true));
    }

    #[test]
    fn a_pass_that_took_nothing_ends_the_full_discovery() {
        let mut d = Discovery::default();
        assert!(d.rescanning());
        d.taken(2, false);
        d.taken(0, true);
        // The pass took units: another full pass.
        assert!(d.rescanning());
        d.taken(0, true);
        assert!(!d.rescanning());
        // Not before its minimum time is over.
        d.rescan_for(Duration::from_secs(60));
        d.taken(0, true);
        assert!(d.rescanning());
    }

    #[test]
    fn the_shuffle_keeps_every_key() {
        let mut v: Vec<String> = (0..50).map(|i| i.to_string()).collect();
        shuffle(&mut v, "e0");
        v.sort_by_key(|k| k.parse::<u32>().unwrap_or(0));
        assert_eq!(v, (0..50).map(|i| i.to_string()).collect::<Vec<_>>());
    }
}
