//! Balance: a second and a third instance start later; partitions owned per
//! instance over time, and whether each owns P/k within 10% two lease
//! periods after the last start.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::failover::LeaseArgs;
use super::{Env, progress};
use crate::harness::{self, Tuning};
use crate::model::{self, ProbeState, key_name};
use crate::report::{Cell, Row, Section, Table};
use crate::stats;

/// Options of the balance scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct BalanceArgs {
    /// Partitions (keys) to share.
    #[arg(long, default_value_t = 300)]
    pub balance_partitions: usize,
    /// Instances started one after the other.
    #[arg(long, default_value_t = 3)]
    pub balance_instances: usize,
    /// Seconds between two starts.
    #[arg(long, default_value_t = 3.0)]
    pub stagger_secs: f64,
    /// Seconds between two samples of the lease owners.
    #[arg(long, default_value_t = 0.1)]
    pub sample_secs: f64,
}

/// One sample of lease ownership.
struct Sample {
    at_s: f64,
    owners: BTreeMap<String, usize>,
    unowned: usize,
}

/// Runs the staggered starts and samples ownership.
pub async fn run(env: &mut Env, args: &BalanceArgs, lease: LeaseArgs) -> Result<Section> {
    let n = args.balance_instances;
    let p = args.balance_partitions;
    if n < 2 || p < n || args.stagger_secs <= 0.0 || args.sample_secs <= 0.0 {
        bail!(
            "balance needs at least 2 instances, at least as many partitions, and positive times"
        );
    }
    let timing: Tuning = lease.timing();
    let ttl_s = timing.ttl_ms as f64 / 1000.0;
    let last_start = args.stagger_secs * (n - 1) as f64;
    let check_at = last_start + 2.0 * ttl_s;
    let end_at = check_at + ttl_s;
    let share = p as f64 / n as f64;
    let (lo, hi) = (share * 0.9, share * 1.1);
    let mut section = Section::new("balance");
    section.param("partitions (P)", p);
    section.param(
        "instances",
        format!(
            "{n} in-process engines, started {} s apart (e1 at 0 s, last at {last_start:.1} s)",
            args.stagger_secs
        ),
    );
    section.param("engines", timing.describe());
    section.param(
        "check",
        format!(
            "at last start + 2 x lease_ttl = {check_at:.1} s, each instance owns P/{n} = {share:.1} within 10% ({lo:.1}..{hi:.1})"
        ),
    );
    section.param(
        "ownership",
        "counted from the lease keys {s}convoy:lease:{group}:bench:{key} (MGET), every sample",
    );

    env.reset().await?;
    let state = ProbeState::new();
    let keys: Vec<String> = (0..p).map(key_name).collect();
    let publisher = harness::publisher(&env.url)?;
    harness::publish(&publisher, &model::spread(p, p)).await?;
    let names: Vec<String> = (1..=n).map(|i| format!("e{i}")).collect();
    let mut engines = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    let start = Instant::now();
    let sample_every = Duration::from_secs_f64(args.sample_secs);
    let mut next_sample = Duration::ZERO;
    loop {
        let now = start.elapsed();
        let due = (now.as_secs_f64() / args.stagger_secs).floor() as usize + 1;
        while engines.len() < due.min(n) {
            let name = &names[engines.len()];
            progress(
                "balance",
                format!("{:.1} s: starting {name}", now.as_secs_f64()),
            );
            let d = harness::engine_domain(&env.url, timing, name, state.clone())?;
            engines.push(d.engine().spawn());
        }
        if now >= next_sample {
            let (owners, unowned) = stats::lease_owners(&mut env.admin, env.group, &keys).await?;
            samples.push(Sample {
                at_s: now.as_secs_f64(),
                owners,
                unowned,
            });
            next_sample += sample_every;
            if now.as_secs_f64() >= end_at {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    harness::stop_engines(engines).await?;

    let within = |s: &Sample| {
        names.iter().all(|name| {
            let v = s.owners.get(name).copied().unwrap_or(0) as f64;
            v >= lo && v <= hi
        })
    };
    let at_check = samples
        .iter()
        .find(|s| s.at_s >= check_at)
        .or(samples.last());
    if let Some(s) = at_check {
        section.rows.push(Row::new(
            format!("all at {:.1} s", s.at_s),
            "partitions unowned",
            s.unowned as f64,
            Cell::Text("n/a".into()),
        ));
        for name in &names {
            let owned = s.owners.get(name).copied().unwrap_or(0) as f64;
            section.rows.push(
                Row::new(
                    format!("{name} at {:.1} s", s.at_s),
                    "partitions owned",
                    owned,
                    Cell::Text("n/a".into()),
                )
                .target(format!("{lo:.0}..{hi:.0}"), owned >= lo && owned <= hi),
            );
        }
    }
    // First sample after the last start from which every later sample is
    // within 10%.
    let mut settled: Option<f64> = None;
    for s in samples.iter().filter(|s| s.at_s >= last_start) {
        if within(s) {
            settled.get_or_insert(s.at_s);
        } else {
            settled = None;
        }
    }
    let settle_ok = settled.is_some_and(|t| t <= check_at);
    section.rows.push(
        Row::new(
            "after the last start",
            "s until all within 10%",
            match settled {
                Some(t) => Cell::Num(t - last_start),
                None => Cell::Text("never".into()),
            },
            Cell::Text("n/a".into()),
        )
        .target(format!("<= {:.1} s", 2.0 * ttl_s), settle_ok),
    );
    // Partitions without an owner wait: the last sample after the last start
    // with some unowned, if any.
    let orphaned = samples
        .iter()
        .rev()
        .find(|s| s.at_s >= last_start && s.unowned > 0)
        .map(|s| s.at_s);
    section.rows.push(Row::new(
        "after the last start",
        "s until none unowned",
        match orphaned {
            None => Cell::Num(0.0),
            Some(t) if t + args.sample_secs >= end_at => {
                Cell::Text(format!("> {:.1}", end_at - last_start))
            }
            Some(t) => Cell::Num(t + args.sample_secs - last_start),
        },
        Cell::Text("n/a".into()),
    ));
    let mut header = vec!["t (s)".to_owned()];
    header.extend(names.iter().cloned());
    header.push("unowned".into());
    // The timeline: the first and last samples, and every sample where the
    // counts changed.
    let counts = |s: &Sample| -> Vec<usize> {
        names
            .iter()
            .map(|n| s.owners.get(n).copied().unwrap_or(0))
            .chain(std::iter::once(s.unowned))
            .collect()
    };
    let mut rows = Vec::new();
    let mut previous: Option<Vec<usize>> = None;
    for (i, s) in samples.iter().enumerate() {
        let c = counts(s);
        if previous.as_ref() != Some(&c) || i + 1 == samples.len() {
            let mut r = vec![format!("{:.1}", s.at_s)];
            r.extend(c.iter().map(ToString::to_string));
            rows.push(r);
        }
        previous = Some(c);
    }
    section.tables.push(Table {
        title: format!(
            "partitions owned per instance over time (sampled every {} s; rows where a count changed)",
            args.sample_secs
        ),
        header,
        rows,
    });
    section.note("The baseline has no ownership to balance (every consumer of a plain group reads every key), hence n/a.");
    section.note(
        "unowned: partitions between owners (released by one instance, not yet taken by another).",
    );
    Ok(section)
}
