//! `etcdfleet run` as a process, the way Kubernetes runs it: a kubeconfig,
//! signals, the HTTP probes. These prove the wiring the reconcile driver
//! tests skip: shutdown in every state, readiness that follows the first
//! list, logs fit for a collector.

use std::time::{Duration, Instant};

use etcdfleet_tests::apiserver::{ApiServer, CONTROLLER_USER};
use etcdfleet_tests::controller_process::{
    ControllerProcess, SilentServer, free_port, kubeconfig, repo,
};
use etcdfleet_tests::fleet::{ApiOp, OpRecorder};
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

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

/// `run` against a closed port, once it has said it cannot reach it (and
/// keeps trying): the API server's URL and the process.
fn started_against_a_closed_port(name: &str, args: &[&str]) -> (String, ControllerProcess) {
    let server = format!("https://127.0.0.1:{}", free_port());
    let mut p = ControllerProcess::start(name, &kubeconfig(&server, "t", None), args);
    p.wait_for_log(
        &format!("cannot reach the management API server {server}"),
        Duration::from_secs(20),
    );
    (server, p)
}

#[test]
fn sigterm_with_the_api_server_port_closed_exits_within_seconds_naming_the_server() {
    // `run` says which server it failed to reach, and keeps trying.
    let (_, mut p) = started_against_a_closed_port("closed-port", &[]);
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
    let (_, mut p) = started_against_a_closed_port(
        "election-no-api",
        &[
            "--leader-elect",
            "true",
            "--lease-namespace",
            "etcdfleet-system",
            "--lease-duration-seconds",
            "3",
        ],
    );
    let (code, body) = p.get("/readyz").expect("readyz answers");
    assert_eq!(code, 503, "{body}");
    assert_eq!(p.get("/leader").map(|r| r.0), Some(503), "not leading yet");
    assert_exits_cleanly_after_sigterm(&mut p);
}

#[test]
fn sigint_stops_the_process_like_sigterm() {
    let (_, mut p) = started_against_a_closed_port("sigint", &[]);
    p.signal(libc::SIGINT);
    let status = p
        .wait_exit(EXIT_WITHIN)
        .unwrap_or_else(|| panic!("still running after SIGINT:\n{}", p.log()));
    assert!(status.success(), "{status}:\n{}", p.log());
    assert!(p.log().contains("signal=\"SIGINT\"") || p.log().contains("SIGINT"));
}

#[test]
fn logs_carry_no_colour_codes_when_stdout_is_not_a_terminal() {
    let (_, mut p) = started_against_a_closed_port("no-colour", &[]);
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
    let (server, mut p) = started_against_a_closed_port("json", &["--log-format", "json"]);
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
    // `run --config config/manager/controller.yaml` (the help's example); flags still
    // override it (text logs, the test's own port).
    let server = format!("https://127.0.0.1:{}", free_port());
    // The plain file the ConfigMap is generated from (config/manager/
    // controller.yaml) where the manifests ship one, else the ConfigMap
    // manifest itself: `run --config` reads both forms.
    let config = ["controller.yaml", "config.yaml"]
        .iter()
        .map(|f| repo().join("config/manager").join(f))
        .find(|p| p.exists())
        .expect("config/manager ships the controller configuration");
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

// ---- Against the served test API (tests/src/apiserver): HTTPS, bearer
// tokens, the shipped RBAC and CRDs, list + watch.

/// A management API over HTTPS with the lease namespace, the ha-3 template,
/// and one EtcdCluster `team-a/shop` whose workload kubeconfig Secret
/// points at `workload_kubeconfig`. Served by `rt`'s workers while the test
/// thread blocks on processes.
struct World {
    api: ApiServer,
    ops: OpRecorder,
    // Last: dropped after the server it runs.
    rt: tokio::runtime::Runtime,
}

fn admin_create(rt: &tokio::runtime::Runtime, api: &ApiServer, obj: Value) {
    // The client spawns its request buffer on the current runtime.
    let _inside = rt.enter();
    let obj: DynamicObject = serde_json::from_value(obj).expect("object");
    let types = obj.types.clone().expect("apiVersion and kind");
    let (group, version) = types
        .api_version
        .split_once('/')
        .unwrap_or(("", types.api_version.as_str()));
    let plural = format!("{}s", types.kind.to_lowercase());
    let resource = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: types.api_version.clone(),
        kind: types.kind.clone(),
        plural,
    };
    let client = api.admin_client();
    let dynamic: Api<DynamicObject> = match &obj.metadata.namespace {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
    };
    rt.block_on(dynamic.create(&PostParams::default(), &obj))
        .unwrap_or_else(|e| panic!("create {}: {e}", types.kind));
}

impl World {
    fn start(workload_kubeconfig: &str) -> World {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let api = rt
            .block_on(ApiServer::management())
            .expect("test API server starts");
        for ns in ["etcdfleet-system", "team-a"] {
            admin_create(
                &rt,
                &api,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            );
        }
        let template: Value = etcdfleet_api::yaml::from_str(
            &std::fs::read_to_string(repo().join("templates/ha-3.yaml")).expect("ha-3"),
        )
        .expect("ha-3 parses");
        admin_create(&rt, &api, template);
        let secret_value =
            etcdfleet_tests::controller_process::base64_encode(workload_kubeconfig.as_bytes());
        admin_create(
            &rt,
            &api,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "shop-kubeconfig", "namespace": "team-a"},
                "data": {"value": secret_value},
            }),
        );
        let cluster: Value = etcdfleet_api::yaml::from_str(
            &std::fs::read_to_string(repo().join("config/samples/etcdcluster-minimal.yaml"))
                .expect("sample"),
        )
        .expect("sample parses");
        admin_create(&rt, &api, cluster);
        let ops = OpRecorder::default();
        api.set_recorder(ops.clone());
        World { api, ops, rt }
    }

    /// A kubeconfig with a fresh token of the controller's ServiceAccount.
    fn controller_kubeconfig(&self) -> (String, String) {
        let token = self.api.issue_token(CONTROLLER_USER);
        (self.api.kubeconfig(&token), token)
    }

    /// Writes (anything but get/list/watch) by the holder of `token`,
    /// leaving out the Lease (every candidate writes that) and Events.
    fn writes_by(&self, token: &str) -> Vec<ApiOp> {
        self.ops
            .ops()
            .into_iter()
            .filter(|op| op.token.as_deref() == Some(token))
            .filter(|op| !op.verb.starts_with("get") && op.verb != "list" && op.verb != "watch")
            .filter(|op| op.resource != "leases" && op.resource != "events")
            .collect()
    }
}

/// A workload API that never answers: reconciles of `shop` hang in connect.
fn hanging_workload() -> (SilentServer, String) {
    let silent = SilentServer::start();
    let config = kubeconfig(&format!("https://{}", silent.addr), "w", None);
    (silent, config)
}

// A reconcile of `shop` may hang on the workload API when SIGTERM comes:
// it has taken no step, so it ends at once, whatever the grace (the
// default, 10 s, here).
const ELECTION: &[&str] = &[
    "--leader-elect",
    "true",
    "--lease-namespace",
    "etcdfleet-system",
    "--lease-duration-seconds",
    "3",
];

/// A workload API that answers reads and never a write of the controller:
/// a reconcile of `shop` gets stuck in its first step.
struct StuckWrites {
    api: ApiServer,
    kubeconfig: String,
    ops: OpRecorder,
    _rt: tokio::runtime::Runtime,
}

impl StuckWrites {
    fn start() -> StuckWrites {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let api = rt
            .block_on(ApiServer::workload("stuck"))
            .expect("workload API server starts");
        let user = etcdfleet_tests::fleet::WORKLOAD_USER;
        api.set_hanging_writes(user, true);
        let ops = OpRecorder::default();
        api.set_recorder(ops.clone());
        let kubeconfig = api.kubeconfig(&api.issue_token(user));
        StuckWrites {
            api,
            kubeconfig,
            ops,
            _rt: rt,
        }
    }

    /// Waits until the controller has sent its first workload write (which
    /// never returns): a reconcile is then stuck in its step.
    fn wait_for_a_stuck_write(&self, p: &ControllerProcess) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self
            .ops
            .ops()
            .iter()
            .any(|op| !op.verb.starts_with("get") && op.verb != "list" && op.verb != "watch")
        {
            assert!(
                Instant::now() < deadline,
                "no workload write was tried:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = &self.api;
    }
}

#[test]
fn readyz_turns_ready_only_after_the_first_list_succeeds() {
    let (_silent, workload) = hanging_workload();
    let world = World::start(&workload);
    let (config, _) = world.controller_kubeconfig();
    // The API answers 503 to the controller until the test lifts the outage.
    world.api.set_unavailable(CONTROLLER_USER, true);
    // The world's cluster lives in a workload API that never answers: a
    // reconcile of it may be reading when the test stops the process; it
    // has taken no step and ends at once.
    let mut p = ControllerProcess::start("readiness", &config, &[]);
    p.wait_for_log(
        "cannot reach the management API server",
        Duration::from_secs(20),
    );
    let (code, body) = p.get("/readyz").expect("readyz answers");
    assert_eq!(code, 503, "{body}");
    assert_eq!(p.get("/healthz").map(|r| r.0), Some(200));

    world.api.set_unavailable(CONTROLLER_USER, false);
    // Backoff after two failures is at most 2 s; the list itself is quick.
    let body = p.wait_for_status("/readyz", 200, Duration::from_secs(15));
    assert_eq!(body.trim(), "ready");
    p.wait_for_log(
        "first list of EtcdClusters succeeded",
        Duration::from_secs(5),
    );
    assert_exits_cleanly_after_sigterm(&mut p);
    drop(world);
}

#[test]
fn two_replicas_only_the_leader_writes_and_the_standby_takes_over_after_sigkill() {
    let (_silent, workload) = hanging_workload();
    let world = World::start(&workload);
    let (config_a, token_a) = world.controller_kubeconfig();
    let (config_b, token_b) = world.controller_kubeconfig();
    let mut a = ControllerProcess::start("replica-a", &config_a, ELECTION);
    a.wait_for_log("acquired leadership", Duration::from_secs(20));
    let mut b = ControllerProcess::start("replica-b", &config_b, ELECTION);

    // Both ready (a standby is ready: that is what lets a Deployment roll
    // out); only one leads.
    a.wait_for_status("/readyz", 200, Duration::from_secs(20));
    let standby = b.wait_for_status("/readyz", 200, Duration::from_secs(20));
    assert_eq!(standby.trim(), "ready (standby)");
    assert_eq!(a.get("/leader").map(|r| r.0), Some(200));
    assert_eq!(b.get("/leader").map(|r| r.0), Some(503));

    // The leader reconciles `shop` (its first write: the finalizer or the
    // materialized template); the standby writes nothing but the Lease.
    let deadline = Instant::now() + Duration::from_secs(20);
    while world.writes_by(&token_a).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the leader wrote nothing:\n{}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let standby_writes = world.writes_by(&token_b);
    assert!(
        standby_writes.is_empty(),
        "the standby wrote: {standby_writes:?}"
    );

    // Failover: SIGKILL gives the leader no chance to release the Lease; the
    // standby takes it once it has seen it unrenewed for the lease duration.
    let killed = Instant::now();
    a.signal(libc::SIGKILL);
    assert!(a.wait_exit(Duration::from_secs(5)).is_some());
    b.wait_for_log("acquired leadership", Duration::from_secs(10));
    let took = killed.elapsed();
    // Lease 3 s + one renew interval (1 s) to notice + polling slack.
    assert!(
        took <= Duration::from_secs(6),
        "took {took:?} to take over:\n{}",
        b.log()
    );
    b.wait_for_status("/leader", 200, Duration::from_secs(5));
    let writes_before = world.writes_by(&token_b).len();
    let deadline = Instant::now() + Duration::from_secs(20);
    while world.writes_by(&token_b).len() == writes_before {
        assert!(
            Instant::now() < deadline,
            "the new leader wrote nothing:\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("failover took {took:?} after SIGKILL of the leader");
    assert_exits_cleanly_after_sigterm(&mut b);
    drop(world);
}

#[test]
fn sigterm_ends_a_reconcile_stuck_reading_a_workload_cluster_at_once() {
    let (_silent, workload) = hanging_workload();
    let world = World::start(&workload);
    let (config, _) = world.controller_kubeconfig();
    // The default grace (10 s) and the workload client's timeouts (5 s to
    // connect, 20 s to read) are far longer than the exit may take.
    let mut p = ControllerProcess::start("stuck-read", &config, &[]);
    p.wait_for_status("/readyz", 200, Duration::from_secs(20));
    // The reconcile of `shop` is now waiting to connect to the workload API.
    std::thread::sleep(Duration::from_secs(1));
    let sent = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(2))
        .unwrap_or_else(|| panic!("still running 2 s after SIGTERM:\n{}", p.log()));
    assert!(status.success(), "{status}:\n{}", p.log());
    assert!(
        !p.log().contains("did not finish within the grace period"),
        "{}",
        p.log()
    );
    eprintln!("stuck-read: exited {:?} after SIGTERM", sent.elapsed());
    drop(world);
}

#[test]
fn sigterm_bounds_the_drain_of_a_stuck_reconcile_by_the_grace_period() {
    let stuck = StuckWrites::start();
    let world = World::start(&stuck.kubeconfig);
    let (config, _) = world.controller_kubeconfig();
    let mut p =
        ControllerProcess::start("stuck-drain", &config, &["--shutdown-grace-seconds", "2"]);
    p.wait_for_status("/readyz", 200, Duration::from_secs(20));
    // The reconcile of `shop` took its first step, whose workload write
    // never returns; the drain waits for it, but not past the grace.
    stuck.wait_for_a_stuck_write(&p);
    let sent = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("still running 5 s after SIGTERM:\n{}", p.log()));
    assert!(status.success(), "{status}:\n{}", p.log());
    assert!(
        sent.elapsed() >= Duration::from_secs(1),
        "it did drain first"
    );
    assert!(
        p.log().contains("did not finish within the grace period"),
        "{}",
        p.log()
    );
    drop(world);
}

#[test]
fn a_second_sigterm_exits_at_once_while_reconciles_drain() {
    let stuck = StuckWrites::start();
    let world = World::start(&stuck.kubeconfig);
    let (config, _) = world.controller_kubeconfig();
    let mut p = ControllerProcess::start(
        "second-signal",
        &config,
        &["--shutdown-grace-seconds", "60"],
    );
    p.wait_for_status("/readyz", 200, Duration::from_secs(20));
    stuck.wait_for_a_stuck_write(&p);
    p.signal(libc::SIGTERM);
    p.wait_for_log("shutdown requested", Duration::from_secs(5));
    // Draining the step stuck in its write could take its 20 s read timeout.
    assert!(
        p.wait_exit(Duration::from_millis(500)).is_none(),
        "{}",
        p.log()
    );
    let sent = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(2))
        .unwrap_or_else(|| panic!("still running after a second SIGTERM:\n{}", p.log()));
    assert_eq!(status.code(), Some(143), "{}", p.log());
    assert!(p.log().contains("second signal"), "{}", p.log());
    eprintln!("exited {:?} after the second SIGTERM", sent.elapsed());
    drop(world);
}

#[test]
fn run_plans_a_fleet_rollout_over_its_own_cluster_cache() {
    let (_silent, workload) = hanging_workload();
    let world = World::start(&workload);
    let (config, token) = world.controller_kubeconfig();
    let mut p = ControllerProcess::start("rollouts", &config, &[]);
    p.wait_for_log(
        "rollout controller running over the EtcdCluster caches",
        Duration::from_secs(20),
    );
    admin_create(
        &world.rt,
        &world.api,
        json!({
            "apiVersion": "etcdfleet.dev/v1alpha1", "kind": "EtcdFleetRollout",
            "metadata": {"name": "to-3-5-21"},
            "spec": {"selector": {"namespaces": ["team-a"]}, "version": "3.5.21"},
        }),
    );
    let api: Api<etcdfleet_api::EtcdFleetRollout> = {
        let _inside = world.rt.enter();
        Api::all(world.api.admin_client())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let rollout = world.rt.block_on(api.get("to-3-5-21")).expect("rollout");
        if let Some(status) = rollout.status.filter(|s| !s.clusters.is_empty()) {
            break status;
        }
        assert!(Instant::now() < deadline, "no rollout status:\n{}", p.log());
        std::thread::sleep(Duration::from_millis(200));
    };
    // The cluster came from the controller's own cache: no list or watch
    // of EtcdClusters beyond the cluster controller's one watch.
    assert_eq!(
        status
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), c.wave))
            .collect::<Vec<_>>(),
        [("team-a/shop", 1)],
        "{status:#?}"
    );
    let cluster_watches = world
        .ops
        .ops()
        .into_iter()
        .filter(|op| op.token.as_deref() == Some(token.as_str()))
        .filter(|op| op.resource == "etcdclusters" && op.verb == "watch")
        .count();
    assert_eq!(cluster_watches, 1, "one watch of EtcdClusters in all");
    assert_exits_cleanly_after_sigterm(&mut p);
    drop(world);
}
