//! `etcdfleet run` as a process, the way Kubernetes runs it: a kubeconfig,
//! signals, the HTTP probes. These prove the wiring the reconcile driver
//! tests skip: shutdown in every state, readiness that follows the first
//! list, logs fit for a collector.

use std::time::{Duration, Instant};

use etcdfleet_tests::controller_process::{
    ControllerProcess, SilentServer, free_port, kubeconfig, repo,
};

/// Kubernetes' default grace is 30 s; the controller promises a few seconds.
const EXIT_WITHIN: Duration = Duration::from_secs(5);

fn assert_exits_cleanly_after_sigterm(p: &mut ControllerProcess) {
    let sent = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(EXIT_WITHIN).unwrap_or_else(|| {
        panic!(
            "{} still running {EXIT_WITHIN:?} after SIGTERM:\n{}",
            p.name,
            p.log()
        )
    });
    let took = sent.elapsed();
    let log = p.log();
    assert!(status.success(), "exit {status} after SIGTERM:\n{log}");
    assert!(log.contains("shutdown requested"), "{log}");
    assert!(log.contains("stopped"), "{log}");
    eprintln!("{}: exited {took:?} after SIGTERM", p.name);
}

#[test]
fn sigterm_with_the_api_server_port_closed_exits_within_seconds_naming_the_server() {
    let server = format!("https://127.0.0.1:{}", free_port());
    let mut p = ControllerProcess::start("closed-port", &kubeconfig(&server, "t", None), &[]);
    // `run` says which server it failed to reach, and keeps trying.
    p.wait_for_log(
        &format!("cannot reach the management API server {server}"),
        Duration::from_secs(20),
    );
    // Alive (the loop has not died) but not ready (nothing listed).
    assert_eq!(p.get("/healthz").map(|r| r.0), Some(200), "{}", p.log());
    let (code, body) = p.get("/readyz").expect("readyz answers");
    assert_eq!(code, 503, "{body}");
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn sigterm_while_the_api_server_accepts_and_never_answers_exits_within_seconds() {
    let silent = SilentServer::start();
    let server = format!("https://{}", silent.addr);
    let mut p = ControllerProcess::start("silent-server", &kubeconfig(&server, "t", None), &[]);
    // The first request is in flight, hanging, when the signal comes.
    p.wait_for_status("/healthz", 200, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(p.get("/readyz").map(|r| r.0), Some(503), "{}", p.log());
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn a_hanging_api_server_is_named_after_the_probe_timeout() {
    let silent = SilentServer::start();
    let server = format!("https://{}", silent.addr);
    let mut p = ControllerProcess::start("silent-named", &kubeconfig(&server, "t", None), &[]);
    p.wait_for_log(
        &format!("cannot reach the management API server {server}: no answer within"),
        Duration::from_secs(20),
    );
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn sigterm_while_waiting_for_the_leader_lease_exits_within_seconds() {
    // Leader election on, API down: the process is in its first wait; the
    // lease wait comes after it and races the same signal.
    let server = format!("https://127.0.0.1:{}", free_port());
    let mut p = ControllerProcess::start(
        "election-no-api",
        &kubeconfig(&server, "t", None),
        &[
            "--leader-elect",
            "true",
            "--lease-namespace",
            "etcdfleet-system",
            "--lease-duration-seconds",
            "3",
        ],
    );
    p.wait_for_log(
        "cannot reach the management API server",
        Duration::from_secs(20),
    );
    let (code, body) = p.get("/readyz").expect("readyz answers");
    assert_eq!(code, 503, "{body}");
    assert_eq!(p.get("/leader").map(|r| r.0), Some(503), "not leading yet");
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn sigint_stops_the_process_like_sigterm() {
    let server = format!("https://127.0.0.1:{}", free_port());
    let mut p = ControllerProcess::start("sigint", &kubeconfig(&server, "t", None), &[]);
    p.wait_for_log(
        "cannot reach the management API server",
        Duration::from_secs(20),
    );
    p.signal(libc::SIGINT);
    let status = p
        .wait_exit(EXIT_WITHIN)
        .unwrap_or_else(|| panic!("still running after SIGINT:\n{}", p.log()));
    assert!(status.success(), "{status}:\n{}", p.log());
    assert!(p.log().contains("signal=\"SIGINT\"") || p.log().contains("SIGINT"));
}

#[test]
fn logs_carry_no_colour_codes_when_stdout_is_not_a_terminal() {
    let server = format!("https://127.0.0.1:{}", free_port());
    let mut p = ControllerProcess::start("no-colour", &kubeconfig(&server, "t", None), &[]);
    p.wait_for_log(
        "cannot reach the management API server",
        Duration::from_secs(20),
    );
    let out = p.stdout_bytes();
    assert!(!out.is_empty(), "logs go to stdout");
    assert!(
        !out.contains(&0x1b),
        "escape codes in a piped log:\n{}",
        String::from_utf8_lossy(&out)
    );
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn json_logs_are_one_object_per_line_naming_the_server() {
    let server = format!("https://127.0.0.1:{}", free_port());
    let mut p = ControllerProcess::start(
        "json",
        &kubeconfig(&server, "t", None),
        &["--log-format", "json"],
    );
    p.wait_for_log(
        "cannot reach the management API server",
        Duration::from_secs(20),
    );
    let out = String::from_utf8(p.stdout_bytes()).expect("utf-8 logs");
    let mut named = false;
    for line in out.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["fields"]["api_server"].as_str() == Some(server.as_str()) {
            named = true;
        }
    }
    assert!(named, "no line carries api_server={server}:\n{out}");
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn run_reads_the_shipped_manager_config_file() {
    // The README's `run --config config/manager/config.yaml`; flags still
    // override it (text logs, the test's own port).
    let server = format!("https://127.0.0.1:{}", free_port());
    let config = repo().join("config/manager/config.yaml");
    let mut p = ControllerProcess::start(
        "shipped-config",
        &kubeconfig(&server, "t", None),
        &[
            "--config",
            config.to_str().expect("utf-8 path"),
            "--log-format",
            "text",
        ],
    );
    p.wait_for_log("starting etcdfleet controller", Duration::from_secs(20));
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn a_bad_config_file_fails_at_once_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "maxConcurrentReconciles: 0\n").unwrap();
    let server = format!("https://127.0.0.1:{}", free_port());
    let mut p = ControllerProcess::start(
        "bad-config",
        &kubeconfig(&server, "t", None),
        &["--config", config.to_str().unwrap()],
    );
    let status = p
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("a bad config must not start:\n{}", p.log()));
    assert_eq!(status.code(), Some(2), "{}", p.log());
    assert!(p.log().contains("maxConcurrentReconciles"), "{}", p.log());
}
