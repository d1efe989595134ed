//! This process's memory: resident set size from `/proc/self/statm`, and,
//! when built with the `heap-stats` feature, the live heap counted by a
//! global allocator wrapper (`stats_alloc` over the system allocator).

use anyhow::{Context as _, Result, anyhow};

#[cfg(feature = "heap-stats")]
#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// Live heap at one moment: bytes allocated and not freed, and how many
/// blocks hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heap {
    /// Bytes requested by live allocations (the allocator's own rounding
    /// and headers not included).
    pub bytes: i64,
    /// Live allocations.
    pub blocks: i64,
}

impl Heap {
    /// The live heap now, when the counting allocator is built in.
    pub fn now() -> Option<Heap> {
        #[cfg(feature = "heap-stats")]
        {
            let s = GLOBAL.stats();
            let signed = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
            Some(Heap {
                bytes: signed(s.bytes_allocated) - signed(s.bytes_deallocated),
                blocks: signed(s.allocations) - signed(s.deallocations),
            })
        }
        #[cfg(not(feature = "heap-stats"))]
        {
            None
        }
    }

    /// `self - before`.
    pub fn since(&self, before: &Heap) -> Heap {
        Heap {
            bytes: self.bytes - before.bytes,
            blocks: self.blocks - before.blocks,
        }
    }
}

/// This process's resident set size, in bytes (`/proc/self/statm`).
pub fn rss_bytes() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow!("unexpected /proc/self/statm format"))?
        .parse()
        .context("resident pages in /proc/self/statm")?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .filter(|p| *p > 0)
        .unwrap_or(4096) as u64;
    Ok(pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_readable_and_heap_follows_the_feature() {
        assert!(rss_bytes().expect("rss") > 0);
        assert_eq!(Heap::now().is_some(), cfg!(feature = "heap-stats"));
        let a = Heap {
            bytes: 10,
            blocks: 2,
        };
        let b = Heap {
            bytes: 25,
            blocks: 3,
        };
        assert_eq!(
            b.since(&a),
            Heap {
                bytes: 15,
                blocks: 1
            }
        );
    }
}
