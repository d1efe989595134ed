//! The group commit against a real `redis-server`: acknowledgements that
//! arrive together share calls, and workers that go away while they wait
//! or while they send leave no slot taken and nobody waiting.

use std::sync::Arc;
use std::time::Duration;

use super::super::worker::tests::shared_on;
use super::*;
use crate::scripts::tests::calls;
use convoy_testkit::RedisServer;

/// A worker that is not answered within this is waiting for a slot that
/// nobody hands on.
const ANSWERED_WITHIN: Duration = Duration::from_secs(20);

const PRIMARY: At = At {
    lane: 0,
    backfill: false,
};

/// The acknowledgement of entry `1-0` of unit `k{i}`, by a token that holds
/// no lease (so the script refuses it: an answer all the same).
fn request(i: usize) -> AckRequest {
    AckRequest {
        unit: Arc::new(Unit::new(
            "g",
            "c",
            &format!("k{i}"),
            ["c"],
            "backfill",
            false,
            1,
        )),
        at: PRIMARY,
        token: Arc::from("no-such-token"),
        inc: Arc::from("i1"),
        ids: Arc::from(["1-0".to_owned()]),
        clear_head: false,
        touch: false,
        trim: false,
    }
}

/// Fifty workers acknowledging at once (one thread: each runs until it
/// waits) make three calls: the first two take the two slots, the other
/// 48 queue, and the first slot freed goes to one of them with all 48.
#[tokio::test]
async fn acknowledgements_that_arrive_together_share_calls() {
    let server = RedisServer::start().expect("redis-server");
    let mut admin = server.connection().await.expect("connection");
    let shared = shared_on(&server.url(), Duration::from_secs(60));
    // Connected, and the script loaded.
    assert!(acknowledge(&shared, request(100)).await.is_ok());
    let before = calls(&mut admin, "evalsha").await;
    let outcomes = tokio::time::timeout(
        ANSWERED_WITHIN,
        futures::future::join_all((0..50).map(|i| acknowledge(&shared, request(i)))),
    )
    .await
    .expect("every worker answered (a freed slot is handed to a waiting one)");
    for (i, o) in outcomes.into_iter().enumerate() {
        assert!(matches!(o, Ok(Acked::Refused(_))), "ack {i}: {:?}", o.err());
    }
    assert_eq!(calls(&mut admin, "evalsha").await - before, 3);
    let lane = shared.acks.lock(0);
    assert_eq!((lane.in_flight, lane.queue.len()), (0, 0));
}

/// While Redis is paused, both senders and six of eight waiting workers go
/// away (their tasks aborted): the freed slots pass over the six gone
/// waiters to one still there, which carries every queued acknowledgement
/// and answers the other; afterwards no slot is taken and nothing queued.
#[tokio::test]
async fn workers_gone_mid_call_or_while_waiting_leave_nobody_waiting() {
    let server = RedisServer::start().expect("redis-server");
    let mut admin = server.connection().await.expect("connection");
    let shared = shared_on(&server.url(), Duration::from_secs(60));
    // Connected before the pause.
    assert!(acknowledge(&shared, request(100)).await.is_ok());
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .arg("ALL")
        .query_async(&mut admin)
        .await
        .expect("CLIENT PAUSE");
    // One thread: tasks first run in the order they were spawned, so 0 and
    // 1 take the slots and 2..=9 queue in order.
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let shared = shared.clone();
            tokio::spawn(async move { acknowledge(&shared, request(i)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    {
        let lane = shared.acks.lock(0);
        assert_eq!((lane.in_flight, lane.queue.len()), (2, 8));
    }
    let mut kept = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        if i == 2 || i == 3 {
            kept.push(task);
        } else {
            task.abort();
        }
    }
    for task in kept {
        let outcome = tokio::time::timeout(ANSWERED_WITHIN, task)
            .await
            .expect("a waiting worker is answered once its leaders are gone")
            .expect("the task ran");
        assert!(
            matches!(outcome, Ok(Acked::Refused(_))),
            "{:?}",
            outcome.err()
        );
    }
    let lane = shared.acks.lock(0);
    assert_eq!((lane.in_flight, lane.queue.len()), (0, 0));
}
