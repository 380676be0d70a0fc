//! Traces of reconciles, received over OTLP/gRPC by a collector on loopback
//! while the real reconciler drives a real etcd cluster: the reconcile, its
//! steps, and under them each etcd call and each Kubernetes API request.

use std::collections::BTreeSet;

use anyhow::{Context as _, Result, anyhow, ensure};
use etcdfleet_controllers::config::LogFormat;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::telemetry::{self, SERVICE_NAME, Telemetry, TracingConfig};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::otlp::{Collector, ReceivedSpan};
use etcdfleet_tests::scenario::{NS, cluster, controller, converge_all, create};

/// Sends what the batch processor holds (it blocks, so off the async workers).
async fn flush(telemetry: &std::sync::Arc<Telemetry>) -> Result<()> {
    let t = telemetry.clone();
    tokio::task::spawn_blocking(move || t.flush())
        .await?
        .map_err(|e| anyhow!("flushing spans: {e}"))
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_span_with_step_etcd_and_api_request_children_arrives_over_otlp() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let collector = Collector::start().await?;
    let telemetry = std::sync::Arc::new(
        telemetry::init(
            LogFormat::Text,
            &TracingConfig {
                otlp_endpoint: Some(collector.endpoint()),
            },
        )
        .map_err(|e| anyhow!(e))?,
    );
    ensure!(telemetry.exporting(), "an endpoint is configured");

    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = controller(&fleet);
    create(&fleet, &cluster("etcd-a", "a", 1, "3.5.1")).await?;
    let log = converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    flush(&telemetry).await?;

    // While converging: every step the controller took is one `act` span,
    // child of an `acted` reconcile, named by its action.
    let spans = collector.spans();
    let acts: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "act").collect();
    assert_eq!(
        acts.len(),
        log.steps.len(),
        "one act span per step: {:?}",
        log.steps
    );
    let kinds: BTreeSet<&str> = log.steps.iter().map(|(_, s)| s.kind()).collect();
    for act in &acts {
        let parent = spans
            .iter()
            .find(|s| s.span_id == act.parent_span_id)
            .context("act span has its reconcile parent")?;
        assert_eq!(parent.name, "reconcile");
        assert_eq!(parent.attr("outcome"), Some("acted"));
        assert_eq!(act.trace_id, parent.trace_id);
        assert_eq!(act.attr("outcome"), Some("ok"), "{act:?}");
        let action = act.attr("action").context("act span names its action")?;
        assert!(kinds.contains(action), "{action} not in {kinds:?}");
    }

    // One reconcile of the converged cluster: its span tree, exactly.
    collector.clear();
    fleet.clear_ops();
    let outcome = ctl.reconcile(NS, "etcd-a").await?;
    assert_eq!(outcome, Outcome::Converged);
    flush(&telemetry).await?;
    let spans = collector.spans();
    let roots: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "reconcile").collect();
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let root = roots[0];
    assert_eq!(root.parent_span_id, "", "the driver has no enclosing span");
    assert_eq!(root.attr("cluster"), Some("team-a/etcd-a"));
    assert_eq!(root.attr("outcome"), Some("converged"));
    // The trace id the log lines carry is the exported one.
    assert_eq!(root.attr("trace_id"), Some(root.trace_id.as_str()));
    assert_eq!(root.service.as_deref(), Some(SERVICE_NAME));

    let steps = children(&spans, root);
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["resolve", "connect", "observe", "plan", "report"]);
    for step in &steps {
        assert_eq!(step.trace_id, root.trace_id);
        assert_eq!(step.attr("step"), Some(step.name.as_str()));
        assert_eq!(step.attr("cluster"), Some("team-a/etcd-a"));
        let expected = if step.name == "plan" {
            "converged"
        } else {
            "ok"
        };
        assert_eq!(step.attr("outcome"), Some(expected), "{step:?}");
    }

    // The etcd calls of observe (member list, status, health) hang under it.
    let observe = steps[2];
    let etcd_calls: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.attr("etcd.op").is_some())
        .collect();
    ensure!(!etcd_calls.is_empty(), "no etcd call span: {spans:#?}");
    for call in &etcd_calls {
        assert_eq!(call.trace_id, root.trace_id);
        assert_eq!(call.attr("outcome"), Some("ok"), "{call:?}");
        let mut parent: &ReceivedSpan = call;
        // An etcd call may sit under an intermediate span; walk up to the step.
        while parent.span_id != observe.span_id {
            parent = spans
                .iter()
                .find(|s| s.span_id == parent.parent_span_id)
                .with_context(|| format!("{call:?} is not under observe"))?;
        }
    }

    // Every request to the workload API is a kube-client span in the same
    // trace, under observe, with its method, URL and status code. (The
    // driver's management client is the in-process test client, without
    // kube's HTTP layer; `run` builds both the same way, with it.)
    let workload_ops: Vec<_> = fleet
        .ops()
        .into_iter()
        .filter(|op| op.cluster == "a")
        .collect();
    ensure!(
        !workload_ops.is_empty(),
        "the reconcile read the workload API"
    );
    let http: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.attr("http.method").is_some())
        .collect();
    assert_eq!(
        http.len(),
        workload_ops.len(),
        "one span per request: {http:#?}\n{workload_ops:#?}"
    );
    for op in &workload_ops {
        let path = match (&op.namespace, &op.name) {
            (Some(ns), Some(name)) => format!("/namespaces/{ns}/{}/{name}", op.resource),
            (Some(ns), None) => format!("/namespaces/{ns}/{}?", op.resource),
            (None, Some(name)) => format!("/{}/{name}", op.resource),
            (None, None) => format!("/{}?", op.resource),
        };
        let span = http
            .iter()
            .find(|s| s.attr("http.url").is_some_and(|u| u.contains(&path)))
            .with_context(|| format!("no span for {op}: {http:#?}"))?;
        assert_eq!(span.name, op.verb, "kube names the span by its verb");
        assert_eq!(span.attr("http.method"), Some("GET"));
        assert_eq!(span.attr("http.status_code"), Some("200"));
        assert_eq!(span.trace_id, root.trace_id);
        assert_eq!(
            span.parent_span_id, observe.span_id,
            "{op} is read in observe"
        );
    }
    fleet.shutdown().await;
    Ok(())
}
