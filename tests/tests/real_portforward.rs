//! Port-forward through a real API server to the process kubelet, in both
//! protocols the API server uses towards a kubelet: the controller's own
//! WebSocket tunnels (`v4.channel.k8s.io`, passed through), and `kubectl
//! port-forward` (WebSocket tunnelling to the API server, SPDY/3.1 from the
//! API server to the kubelet).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_tests::control_plane::scenario::{
    cluster_yaml, converge_real, etcd_of, installed_world, put, wait_available,
};
use etcdfleet_tests::scenario::WORKLOAD_NS;

/// A `kubectl port-forward` process, killed on drop.
struct KubectlForward(Child);

impl Drop for KubectlForward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kubectl port-forward pod/<pod> :<port>` and returns the local
/// port it printed.
fn kubectl_port_forward(mut cmd: Command, pod: &str, port: u16) -> Result<(KubectlForward, u16)> {
    let mut child = cmd
        .args([
            "port-forward",
            "-n",
            WORKLOAD_NS,
            &format!("pod/{pod}"),
            &format!(":{port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("kubectl port-forward")?;
    let stdout = child.stdout.take().context("stdout")?;
    let guard = KubectlForward(child);
    let mut lines = BufReader::new(stdout).lines();
    // "Forwarding from 127.0.0.1:40123 -> 2379"
    while let Some(line) = lines.next().transpose()? {
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            let local = rest.split_whitespace().next().context("port")?.parse()?;
            std::thread::spawn(move || lines.for_each(drop));
            return Ok((guard, local));
        }
    }
    bail!("kubectl port-forward printed no forwarding line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_portforward_of_the_controller_and_of_kubectl_reach_etcd_through_the_api_server()
-> Result<()> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("shop", "w1", 1, "3.5.1"))?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(&world, "shop")?;
    let audit = world.workload("w1").plane.audit()?;
    let tunnels = audit
        .by("etcdfleet-controller")
        .into_iter()
        .filter(|e| e.resource() == "pods/portforward" && e.code() == 101)
        .count();
    assert!(
        tunnels > 0,
        "the controller reached etcd through port-forward tunnels"
    );
    put(&world, "w1", "shop", 1, "through-the-controller").await?;

    let kubectl = world.workload("w1").plane.kubectl(&world.binaries);
    let (_forward, local) = kubectl_port_forward(kubectl, "shop-etcd-0", 2379)?;
    let (_, config) = etcd_of(&world, "w1", "shop", 1).await?;
    let endpoint = format!("https://127.0.0.1:{local}");
    let mut kv = ClusterClient::connect(std::slice::from_ref(&endpoint), &config)
        .await?
        .kv();
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        kv.get("through-the-controller", None),
    )
    .await??;
    assert_eq!(got.kvs().len(), 1, "read through kubectl port-forward");
    tokio::time::timeout(
        Duration::from_secs(10),
        kv.put("through-kubectl", "v", None),
    )
    .await??;
    let spdy = world
        .workload("w1")
        .plane
        .audit()?
        .by(etcdfleet_tests::control_plane::ADMIN_USER)
        .into_iter()
        .filter(|e| e.resource() == "pods/portforward")
        .count();
    assert!(
        spdy > 0,
        "kubectl's port-forward went through the API server"
    );
    Ok(())
}
