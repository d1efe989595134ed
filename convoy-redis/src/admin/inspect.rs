//! Inspecting one unit: its status and its head entry, decoded.

use redis::Value;
use serde::Serialize;

use super::status::{PartitionStatus, group_infos, ok_int, status, string_map};
use super::{Admin, AdminError, Lane};
use crate::reply::{Entry, int, text};
use convoy_core::envelope::Envelope;
use convoy_core::error::Error;
use convoy_core::names;

/// A unit's head entry, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Head {
    /// The stream entry id.
    pub entry_id: String,
    /// The lane it is in.
    pub lane: Lane,
    /// The stream it is in.
    pub stream: String,
    /// Delivered to the group and not acknowledged.
    pub pending: bool,
    /// The consumer (fence token) it is pending for.
    pub consumer: Option<String>,
    /// How many times it was delivered (0 when not yet delivered).
    pub delivery_count: u64,
    /// Milliseconds since its last delivery.
    pub idle_ms: Option<u64>,
    /// The envelope, when the entry is one.
    pub envelope: Option<Envelope>,
    /// Why the entry could not be decoded (deleted, not an envelope).
    pub decode_error: Option<String>,
}

/// What [`Admin::inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inspection {
    /// The unit's status (lease, halt, counts).
    pub status: PartitionStatus,
    /// The head, if the partition has one for this group.
    pub head: Option<Head>,
}

impl Admin {
    /// The unit's status and its head entry, decoded (see the module docs
    /// for what the head is).
    pub async fn inspect(
        &self,
        category: &str,
        key: &str,
        group: &str,
    ) -> Result<Inspection, AdminError> {
        super::check_category(category)?;
        let scope = self.scope(group, category).await?;
        let shards = self.shards(category).await?;
        let unit = self.unit(group, &scope, category, key, shards);
        let primary = names::partition_stream(unit.shard, category, key);
        let backfill = names::backfill_stream(unit.shard, category, key, &self.backfill_suffix);
        // Every key of the unit is in the key's shard: one hash slot.
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for s in [&primary, &backfill] {
            pipe.cmd("XLEN").arg(s);
            pipe.cmd("XINFO").arg("GROUPS").arg(s);
            pipe.cmd("XPENDING")
                .arg(s)
                .arg(group)
                .arg("-")
                .arg("+")
                .arg(1);
        }
        pipe.cmd("GET").arg(&unit.lease);
        pipe.cmd("HGETALL").arg(&unit.state);
        pipe.cmd("SISMEMBER")
            .arg(names::partition_index(unit.shard, category))
            .arg(key);
        let mut c = self.conn.clone();
        let v: Vec<Value> = pipe
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the partition", e))?;
        let get = |i: usize| v.get(i).cloned().unwrap_or(Value::Nil);
        let lens = [ok_int(&get(0)).max(0) as u64, ok_int(&get(3)).max(0) as u64];
        let infos = [group_infos(&get(1)), group_infos(&get(4))];
        let pendings = [first_pending(&get(2)), first_pending(&get(5))];
        let state = string_map(&get(7));
        // No stream, no lease, no state and not in the index: a key the
        // category never had (a typo), not an unowned partition.
        if lens == [0, 0] && get(6) == Value::Nil && state.is_empty() && ok_int(&get(8)) != 1 {
            return Err(AdminError::UnknownKey {
                category: category.to_owned(),
                key: key.to_owned(),
            });
        }
        let mut rows = [status(
            key,
            unit.shard,
            group,
            &get(6),
            &state,
            [(lens[0], &infos[0]), (lens[1], &infos[1])],
        )];
        self.liveness(category, &mut rows, &[state.get("inc").cloned()])
            .await?;
        let [mut status] = rows;
        status.key_pause = crate::pause::read(&mut self.conn.clone(), category)
            .await
            .map_err(|e| Error::redis("reading the pauses", e))?
            .into_iter()
            .find(|p| p.holds(group, key));
        let lanes = [(Lane::Primary, &primary), (Lane::Backfill, &backfill)];

        // The first pending entry, else the first not yet delivered.
        let mut head = None;
        for (i, (lane, stream)) in lanes.iter().enumerate() {
            if let Some(p) = &pendings[i] {
                let found = self.range(stream, &p.id, &p.id, Some(1)).await?;
                let entry = found.into_iter().next();
                head = Some(make_head(*lane, stream, &p.id, Some(p), entry.as_ref()));
                break;
            }
        }
        if head.is_none() {
            for (i, (lane, stream)) in lanes.iter().enumerate() {
                if lens[i] == 0 {
                    continue;
                }
                let start = match infos[i].iter().find(|g| g.name == group) {
                    Some(g) => format!("({}", g.last_delivered),
                    None => "-".to_owned(),
                };
                if let Some(e) = self
                    .range(stream, &start, "+", Some(1))
                    .await?
                    .into_iter()
                    .next()
                {
                    head = Some(make_head(*lane, stream, &e.id, None, Some(&e)));
                    break;
                }
            }
        }
        Ok(Inspection { status, head })
    }
}

/// A pending entry summary (XPENDING - + 1).
#[derive(Debug, Clone)]
struct Pending {
    id: String,
    consumer: String,
    idle_ms: u64,
    deliveries: u64,
}

fn first_pending(v: &Value) -> Option<Pending> {
    let Value::Array(items) = v else {
        return None;
    };
    let Value::Array(p) = items.first()? else {
        return None;
    };
    Some(Pending {
        id: text(p.first()?)?,
        consumer: p.get(1).and_then(text).unwrap_or_default(),
        idle_ms: p.get(2).and_then(int).unwrap_or(0).max(0) as u64,
        deliveries: p.get(3).and_then(int).unwrap_or(0).max(0) as u64,
    })
}

fn make_head(
    lane: Lane,
    stream: &str,
    id: &str,
    pending: Option<&Pending>,
    entry: Option<&Entry>,
) -> Head {
    let (envelope, decode_error) = match entry {
        None => (
            None,
            Some("the entry was deleted from the stream".to_owned()),
        ),
        Some(e) => match e.envelope(stream) {
            Ok(env) => (Some(env), None),
            Err(err) => (None, Some(err.to_string())),
        },
    };
    Head {
        entry_id: id.to_owned(),
        lane,
        stream: stream.to_owned(),
        pending: pending.is_some(),
        consumer: pending.map(|p| p.consumer.clone()),
        delivery_count: pending.map_or(0, |p| p.deliveries),
        idle_ms: pending.map(|p| p.idle_ms),
        envelope,
        decode_error,
    }
}
