//! The engine processes of a Redis fault schedule (`fault_schedules.rs`,
//! `cluster_fault_schedules.rs`) and their faults: this test binary
//! re-executed as a child engine, killed, stopped, resumed and started
//! again in its slot, with every stall and kill on the record server's
//! clock for the checks.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use convoy_runtime::testing::{ChildEngine, current_test_command};

use super::schedule_io::{Notes, record_time};
use crate::faults::StallRecord;

/// One engine slot: the process currently playing it.
pub struct Slot {
    pub instance: String,
    pub proc: usize,
    pub child: Option<ChildEngine>,
}

impl Slot {
    /// `{instance}/p{proc}`.
    pub fn name(&self) -> String {
        format!("{}/p{}", self.instance, self.proc)
    }
}

/// What a child engine is started with: `{prefix}_CHILD` (the URL it
/// connects to), `{prefix}_RECORD`, `{prefix}_NS`, `{prefix}_SCHEDULE`
/// (the seed), `{prefix}_INSTANCE`, `{prefix}_PROC`, the `extra`
/// variables, and `RUST_LOG` from `{prefix}_LOG` (else `log`); without
/// `{prefix}_SEED`, which would make it replay.
pub struct ChildEnv {
    pub prefix: &'static str,
    pub url: String,
    pub record_url: String,
    pub ns: String,
    pub seed: u64,
    pub extra: Vec<(String, String)>,
    pub log: &'static str,
}

/// The engines of a schedule; owned by the thread that runs their faults.
pub struct EngineSlots {
    env: ChildEnv,
    /// Where each process logs (`{instance}-p{proc}.log`).
    dir: PathBuf,
    pub slots: Vec<Slot>,
    next_proc: usize,
    next_id: usize,
    clock: redis::Connection,
    pub notes: Notes,
    pub stalls: Vec<StallRecord>,
    /// Slot -> (process, stopped at).
    pub stopped: HashMap<usize, (usize, u64)>,
    pub kills: HashMap<usize, u64>,
    /// Engines that exited without being killed.
    pub crashed: Vec<String>,
}

impl EngineSlots {
    /// Starts `engines` engines, `e0`, `e1`, …, one per slot.
    pub fn start(
        env: ChildEnv,
        dir: PathBuf,
        engines: usize,
        clock: redis::Connection,
        notes: Notes,
    ) -> Self {
        let mut e = EngineSlots {
            env,
            dir,
            slots: Vec::new(),
            next_proc: 0,
            next_id: engines,
            clock,
            notes,
            stalls: Vec::new(),
            stopped: HashMap::new(),
            kills: HashMap::new(),
            crashed: Vec::new(),
        };
        for slot in 0..engines {
            let s = e.spawn(&format!("e{slot}"));
            e.slots.push(s);
        }
        e
    }

    /// µs of the record server's clock.
    pub fn now_us(&mut self) -> u64 {
        record_time(&mut self.clock)
    }

    pub fn note(&mut self, what: String) {
        self.notes.push(&mut self.clock, what);
    }

    fn spawn(&mut self, instance: &str) -> Slot {
        let proc = self.next_proc;
        self.next_proc += 1;
        let log = self.dir.join(format!("{instance}-p{proc}.log"));
        let out = File::create(&log).expect("engine log file");
        let err = out.try_clone().expect("engine log file");
        let mut cmd: Command = current_test_command("child_engine").expect("test binary");
        let p = self.env.prefix;
        cmd.env(format!("{p}_CHILD"), &self.env.url)
            .env(format!("{p}_RECORD"), &self.env.record_url)
            .env(format!("{p}_NS"), &self.env.ns)
            .env(format!("{p}_SCHEDULE"), self.env.seed.to_string())
            .env(format!("{p}_INSTANCE"), instance)
            .env(format!("{p}_PROC"), proc.to_string())
            .envs(self.env.extra.iter().map(|(k, v)| (k, v)))
            .env(
                "RUST_LOG",
                std::env::var(format!("{p}_LOG")).unwrap_or_else(|_| self.env.log.into()),
            )
            .env_remove(format!("{p}_SEED"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = ChildEngine::spawn(&mut cmd).expect("spawn an engine");
        self.note(format!("started {instance}/p{proc} (pid {})", child.pid()));
        Slot {
            instance: instance.to_owned(),
            proc,
            child: Some(child),
        }
    }

    pub fn name(&self, slot: usize) -> String {
        self.slots[slot].name()
    }

    /// `kill -9` of the engine in `slot`.
    pub fn kill(&mut self, slot: usize) {
        let name = self.name(slot);
        let proc = self.slots[slot].proc;
        if let Some(mut child) = self.slots[slot].child.take() {
            let _ = child.kill9();
        }
        let at = self.now_us();
        self.kills.insert(proc, at);
        self.note(format!("kill -9 {name}"));
    }

    /// A new engine in `slot`, under its instance id or a new one.
    pub fn respawn(&mut self, slot: usize, same_id: bool) {
        let instance = if same_id {
            self.slots[slot].instance.clone()
        } else {
            self.next_id += 1;
            format!("e{}", self.next_id - 1)
        };
        self.slots[slot] = self.spawn(&instance);
    }

    /// `SIGSTOP` of the engine in `slot`.
    pub fn stop(&mut self, slot: usize) {
        let proc = self.slots[slot].proc;
        let from = self.now_us();
        if let Some(child) = self.slots[slot].child.as_mut()
            && child.stop().is_ok()
        {
            self.stopped.insert(slot, (proc, from));
        }
        let name = self.name(slot);
        self.note(format!("SIGSTOP {name}"));
    }

    /// `SIGCONT` of the engine in `slot`; its stall is recorded.
    pub fn cont(&mut self, slot: usize) {
        if let Some(child) = self.slots[slot].child.as_mut() {
            let _ = child.cont();
        }
        if let Some((proc, from_us)) = self.stopped.remove(&slot) {
            let to_us = self.now_us();
            self.stalls.push(StallRecord {
                proc,
                from_us,
                to_us,
            });
        }
        let name = self.name(slot);
        self.note(format!("SIGCONT {name}"));
    }

    /// Resumes every stopped engine.
    pub fn cont_all(&mut self) {
        let stopped: Vec<usize> = self.stopped.keys().copied().collect();
        for slot in stopped {
            self.cont(slot);
        }
    }

    /// Starts an engine in every empty slot (under the slot's instance
    /// id), then [`watch_children`](Self::watch_children).
    pub fn fill(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].child.is_none() {
                let instance = self.slots[slot].instance.clone();
                self.slots[slot] = self.spawn(&instance);
            }
        }
        self.watch_children();
    }

    /// Notes engines that exited although nobody killed them, and starts
    /// them again (every slot keeps an engine running).
    pub fn watch_children(&mut self) {
        let mut gone = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(child) = s.child.as_mut()
                && let Ok(Some(status)) = child.try_status()
            {
                gone.push((
                    i,
                    format!("{}/p{} exited by itself ({status})", s.instance, s.proc),
                ));
                s.child = None;
            }
        }
        for (slot, what) in gone {
            self.note(what.clone());
            self.crashed.push(what);
            let instance = self.slots[slot].instance.clone();
            self.slots[slot] = self.spawn(&instance);
        }
    }

    /// The names of the engines running now.
    pub fn live(&self) -> Vec<String> {
        self.slots
            .iter()
            .filter(|s| s.child.is_some())
            .map(Slot::name)
            .collect()
    }
}

/// Runs `timeline` from now: `step` on each action at its time.
pub fn run_timeline<A>(timeline: &[(Duration, A)], mut step: impl FnMut(&A)) {
    let start = Instant::now();
    for (at, action) in timeline {
        if let Some(wait) = (start + *at).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        step(action);
    }
}
