//! The testing kit's own PostgreSQL server: started on a free port in a
//! directory of its own, it keeps committed data across a stop, a crash
//! (`kill -9`) and a restart, and a frozen server answers nothing until it
//! is thawed.
#![cfg(feature = "testing")]

use std::time::{Duration, Instant};

use convoy_runtime::testing::PgServer;

#[test]
fn a_server_of_its_own_survives_stop_crash_and_freeze() {
    let mut pg = PgServer::start().expect("start PostgreSQL");
    assert!(pg.url().starts_with("postgres://postgres@127.0.0.1:"));
    let db = pg.create_database("kit").expect("create database");
    assert!(db.ends_with("/kit"), "{db}");
    pg.psql("kit", "CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
        .expect("write");

    pg.stop().expect("stop");
    assert!(
        pg.psql("kit", "SELECT 1").is_err(),
        "stopped: nothing answers"
    );
    pg.restart().expect("restart");
    pg.psql("kit", "INSERT INTO t VALUES (2)").expect("write");

    pg.kill().expect("kill -9");
    pg.restart().expect("restart after a crash");
    assert_eq!(
        pg.psql("kit", "SELECT string_agg(n::text, ',' ORDER BY n) FROM t")
            .expect("read"),
        "1,2",
        "committed rows survive a crash"
    );

    pg.freeze().expect("SIGSTOP");
    let started = Instant::now();
    let probe = std::thread::spawn({
        let url = pg.database_url("kit");
        move || {
            std::process::Command::new("psql")
                .args(["-X", "-A", "-t", "-c", "SELECT 3", &url])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!probe.is_finished(), "a frozen server answers nothing");
    pg.thaw().expect("SIGCONT");
    let answer = probe.join().expect("probe").expect("psql");
    assert_eq!(answer, "3");
    assert!(started.elapsed() >= Duration::from_millis(500));
}
