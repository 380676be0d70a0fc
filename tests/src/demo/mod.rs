//! `make demo`: a management cluster and three workload clusters, in-process,
//! on real etcd — no Kubernetes cluster needed.
//!
//! The demo brings up a [`Fleet`] (`shop`, `payments`, `search`), publishes
//! the platform `ClusterEtcdTemplate`s from `templates/` into the fake
//! management API, and runs the real reconciler ([`TestController`] with
//! [`fast_settings`]) in a loop while the workload runtimes sync in the
//! background. Then, phase by phase:
//!
//! 1. creates three `EtcdCluster`s that name only a template and a workload
//!    cluster (the controller materializes the rest), and waits until all are
//!    Available;
//! 2. scales `search` from 1 to 3 members;
//! 3. wipes the data volume of a `shop` follower and lets the controller
//!    replace the failed member;
//! 4. upgrades `payments` from the templates' etcd 3.5 (3.5.35) to 3.6
//!    (3.6.16), one member at a time, leader last.
//!
//! Throughout, it prints the fleet as `kubectl get etcdclusters` plus
//! `describe` would show it (read from `EtcdCluster.status` in the management
//! API) and every step the controller takes. [`run_demo`] is the whole demo;
//! the `demo` binary only calls it, and `tests/tests/demo.rs` runs it too.
//!
//! The setup and the four phases are the list [`PHASES`], walked in order by
//! a short loop; how the fleet is shown (the table, steps in plain words)
//! lives in `show`.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::conditions::{self, AVAILABLE};
use etcdfleet_api::{ClusterEtcdTemplate, EtcdCluster};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::render::Names;
use futures::future::LocalBoxFuture;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

use crate::driver::{TestController, fast_settings};
use crate::etcd_harness::workspace_root;
use crate::fleet::Fleet;
use crate::runtime::BackgroundSync;

mod show;

/// The management namespace of the demo's EtcdClusters and kubeconfig Secrets.
pub const DEMO_NAMESPACE: &str = "team-a";

/// The workload clusters of the demo, in display order.
pub const WORKLOADS: [&str; 3] = ["shop", "payments", "search"];
/// The etcd the platform templates run (the newest 3.5 patch the suite
/// builds, `hack/upstream/etcd-3.5`), which `payments` is created on.
pub const UPGRADE_FROM: &str = "3.5.35";
/// The etcd `payments` is upgraded to in phase 4 (`hack/upstream/etcd-3.6`).
pub const UPGRADE_TO: &str = "3.6.16";

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// A phase that has not completed after this long fails the demo.
    pub phase_timeout: Duration,
    /// How often the status table is redrawn (live) or may be reprinted.
    pub refresh: Duration,
    /// Redraw the screen in place with ANSI escapes (stdout is a terminal).
    /// Otherwise a new table is printed whenever it changed.
    pub live: bool,
    /// Set (e.g. on ctrl-c) to stop the demo: it cleans up and returns an error.
    pub cancel: Arc<AtomicBool>,
    /// Where the platform templates are read from.
    pub templates_dir: std::path::PathBuf,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            phase_timeout: Duration::from_secs(120),
            refresh: Duration::from_secs(1),
            live: false,
            cancel: Arc::new(AtomicBool::new(false)),
            templates_dir: workspace_root().join("templates"),
        }
    }
}

/// One completed phase.
#[derive(Debug, Clone)]
pub struct PhaseReport {
    pub name: String,
    pub took: Duration,
    /// Every step the controller took in the phase.
    pub steps: Vec<StepRecord>,
}

/// One step the controller took.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub cluster: String,
    /// `Step::kind()`: `AddLearner`, `PromoteLearner`, `RemoveMember`, ...
    pub kind: String,
    /// The step as the controller describes it.
    pub text: String,
}

/// One cluster as the final table shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterReport {
    pub name: String,
    pub available: bool,
    pub ready: i32,
    pub desired: i32,
    pub version: Option<String>,
}

/// The member the demo broke and what replaced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealReport {
    pub cluster: String,
    pub member: String,
    pub old_id: String,
    pub new_id: String,
}

/// What the demo did.
#[derive(Debug, Clone)]
pub struct DemoSummary {
    /// The setup (fleet and templates), then every phase, in order.
    pub phases: Vec<PhaseReport>,
    /// The last table printed.
    pub final_table: String,
    pub clusters: Vec<ClusterReport>,
    pub healed: Option<HealReport>,
    pub total: Duration,
}

impl DemoSummary {
    /// Every step of every phase.
    pub fn steps(&self) -> impl Iterator<Item = &StepRecord> {
        self.phases.iter().flat_map(|p| p.steps.iter())
    }
}

/// Runs the whole demo, writing to `out`. The fleet's processes are stopped
/// before it returns, whatever the result.
pub async fn run_demo(out: &mut impl Write, options: DemoOptions) -> Result<DemoSummary> {
    let started = Instant::now();
    if !options.live {
        writeln!(
            out,
            "etcdfleet demo: a management cluster and {} workload clusters, in-process, on real etcd",
            WORKLOADS.len()
        )?;
    }
    let fleet = Fleet::with_namespace(DEMO_NAMESPACE, &WORKLOADS)
        .await
        .context("bringing up the fleet")?;
    let result = {
        let mut demo = Demo::new(out, &fleet, &options, started);
        demo.run().await
    };
    fleet.shutdown().await;
    let mut summary = result?;
    summary.total = started.elapsed();
    write_summary(out, &summary)?;
    Ok(summary)
}

/// What a phase waits for (besides every cluster reporting `Converged`).
enum Goal {
    /// Every cluster Available with all desired members healthy voters.
    AllAvailable,
    /// As `AllAvailable`, and `cluster` runs `version` on every member.
    Version { cluster: String, version: String },
    /// As `AllAvailable`, and `member` of `cluster` is no longer `old_id`.
    Replaced {
        cluster: String,
        member: String,
        old_id: String,
    },
}

/// One phase of the demo: what it does to the fleet, then waits for.
type Phase = for<'d, 'a> fn(&'d mut Demo<'a>) -> LocalBoxFuture<'d, Result<()>>;

/// The demo, phase by phase (the module docs tell the story), walked in
/// order by [`Demo::run`]; each phase writes its own headline and report.
const PHASES: &[(&str, Phase)] = &[
    ("publish templates", |d| Box::pin(d.setup())),
    ("create clusters", |d| Box::pin(d.create_clusters())),
    ("scale search", |d| Box::pin(d.scale_search())),
    ("break and heal shop", |d| Box::pin(d.break_and_heal_shop())),
    ("upgrade payments", |d| Box::pin(d.upgrade_payments())),
];

struct Demo<'a> {
    out: &'a mut dyn Write,
    fleet: &'a Fleet,
    options: &'a DemoOptions,
    ctl: TestController,
    started: Instant,
    /// Completed phases, for the summary and the live header.
    phases: Vec<PhaseReport>,
    /// Recent step lines, shown under the live table.
    recent: VecDeque<String>,
    /// The last outcome of each cluster, as text (to log only changes).
    last_outcome: BTreeMap<String, String>,
    errors: Vec<String>,
    last_table: String,
    last_draw: Option<Instant>,
    current: String,
    current_about: String,
    phase_started: Instant,
    /// The workload runtimes' background syncs, from the setup on.
    syncs: Vec<BackgroundSync>,
    /// The member phase 3 broke and what replaced it.
    healed: Option<HealReport>,
}

impl<'a> Demo<'a> {
    fn new(
        out: &'a mut dyn Write,
        fleet: &'a Fleet,
        options: &'a DemoOptions,
        started: Instant,
    ) -> Self {
        let ctl = TestController::new(
            fleet.management(),
            fleet.client_factory(),
            fleet.dialer(),
            fast_settings(),
        );
        Demo {
            out,
            fleet,
            options,
            ctl,
            started,
            phases: Vec::new(),
            recent: VecDeque::new(),
            last_outcome: BTreeMap::new(),
            errors: Vec::new(),
            last_table: String::new(),
            last_draw: None,
            current: String::new(),
            current_about: String::new(),
            phase_started: Instant::now(),
            syncs: Vec::new(),
            healed: None,
        }
    }

    fn api(&self) -> Api<EtcdCluster> {
        Api::namespaced(self.fleet.management_direct(), DEMO_NAMESPACE)
    }

    /// The demo: every phase of [`PHASES`] in order, then the summary.
    async fn run(&mut self) -> Result<DemoSummary> {
        for (_, phase) in PHASES {
            phase(self).await?;
        }
        self.summary().await
    }

    /// Setup: the platform publishes its templates; from then on the
    /// runtimes play kubelet on their own, as real ones would.
    async fn setup(&mut self) -> Result<()> {
        self.headline(
            "Publish the platform templates",
            "the ClusterEtcdTemplates of templates/ go into the management API",
        )?;
        let templates = self.publish_templates().await?;
        for t in &templates {
            let line = format!(
                "ClusterEtcdTemplate/{:<10} replicas {} etcd {}: {}",
                t.name_any(),
                t.spec.config.replicas.unwrap_or_default(),
                t.spec.config.version.as_deref().unwrap_or("?"),
                t.spec.description.as_deref().unwrap_or("").trim()
            );
            self.log(line)?;
        }
        self.finish_phase(Vec::new())?;
        self.syncs = self.fleet.spawn_background_sync(Duration::from_millis(200));
        Ok(())
    }

    /// 1. Three clusters from templates.
    async fn create_clusters(&mut self) -> Result<()> {
        let manifests = [
            manifest("shop", "ha-3", ""),
            manifest(
                "payments",
                "ha-3",
                "  # overrides of the template (its etcd 3.5 is upgraded to 3.6 in phase 4)\n  storage: {size: 50Gi}\n  etcd: {heartbeatIntervalMillis: 50, electionTimeoutMillis: 500}\n",
            ),
            manifest("search", "dev-single", ""),
        ];
        self.headline(
            "Create shop, payments and search from templates",
            "shop: ha-3; payments: ha-3 + overrides (50Gi, heartbeat 50 ms / election 500 ms); search: dev-single",
        )?;
        if !self.options.live {
            for m in &manifests {
                writeln!(self.out, "---\n{m}")?;
            }
        }
        for m in &manifests {
            let cluster: EtcdCluster = etcdfleet_api::yaml::from_str(m).context("demo manifest")?;
            self.api()
                .create(&PostParams::default(), &cluster)
                .await
                .with_context(|| format!("creating EtcdCluster {}", cluster.name_any()))?;
        }
        self.run_phase(Goal::AllAvailable).await?;
        Ok(())
    }

    /// 2. Scale search 1 → 3.
    async fn scale_search(&mut self) -> Result<()> {
        self.headline(
            "Scale search from 1 to 3 members",
            "kubectl scale etcdcluster search --replicas 3: members are added as learners, then promoted, one at a time",
        )?;
        self.api()
            .patch(
                "search",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "replicas": 3 } })),
            )
            .await?;
        self.run_phase(Goal::AllAvailable).await?;
        Ok(())
    }

    /// 3. Break a shop follower and let the controller heal it.
    async fn break_and_heal_shop(&mut self) -> Result<()> {
        let shop = self.api().get("shop").await?;
        let status = shop.status.clone().unwrap_or_default();
        let victim = status
            .members
            .iter()
            .find(|m| !m.leader && !m.learner)
            .or_else(|| status.members.first())
            .cloned()
            .context("shop has no members to break")?;
        let old_id = victim.id.clone().unwrap_or_default();
        let workload_ns = shop
            .spec
            .config
            .workload_namespace
            .clone()
            .unwrap_or_else(|| "etcd-system".to_string());
        let names = Names::new("shop", &workload_ns);
        let ordinal = names
            .ordinal_of(&victim.name)
            .with_context(|| format!("{} is not a shop member name", victim.name))?;
        let pvc = names.pvc(ordinal);
        self.headline(
            &format!("Break shop: wipe the data volume of {}", victim.name),
            &format!(
                "{pvc} loses its data: member {old_id} crash-loops; after the failure grace ({}s) the controller removes it and adds a fresh member in its place",
                fast_settings().member_failure_grace.as_secs()
            ),
        )?;
        self.fleet
            .runtime("shop")
            .wipe_pvc(&workload_ns, &pvc)
            .await?;
        self.log(format!(
            "{} shop      (demo) wiped PVC {workload_ns}/{pvc} of member {old_id}",
            self.stamp()
        ))?;
        let new_id = self
            .run_phase(Goal::Replaced {
                cluster: "shop".into(),
                member: victim.name.clone(),
                old_id: old_id.clone(),
            })
            .await?;
        let healed = HealReport {
            cluster: "shop".into(),
            member: victim.name.clone(),
            old_id,
            new_id: new_id.unwrap_or_default(),
        };
        self.log(format!(
            "{} shop      healed: {} was member {}, is now member {}",
            self.stamp(),
            healed.member,
            healed.old_id,
            healed.new_id
        ))?;
        self.healed = Some(healed);
        Ok(())
    }

    /// 4. Rolling upgrade of payments, 3.5 → 3.6.
    async fn upgrade_payments(&mut self) -> Result<()> {
        let (from, to) = (UPGRADE_FROM, UPGRADE_TO);
        self.headline(
            &format!("Upgrade payments from etcd {from} to {to}"),
            &format!(
                "kubectl patch etcdcluster payments --type merge -p '{{\"spec\":{{\"version\":\"{to}\"}}}}': {from} is past the 3.6 gate (3.5.32), so members restart onto 3.6 one at a time, followers first, the leader last, each only after the previous one is healthy"
            ),
        )?;
        self.api()
            .patch(
                "payments",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "version": to } })),
            )
            .await?;
        self.run_phase(Goal::Version {
            cluster: "payments".into(),
            version: to.into(),
        })
        .await?;
        Ok(())
    }

    /// The final table and what the demo did.
    async fn summary(&mut self) -> Result<DemoSummary> {
        let clusters = self.clusters().await?;
        let reports = WORKLOADS
            .iter()
            .filter_map(|name| clusters.get(*name))
            .map(|c| {
                let status = c.status.clone().unwrap_or_default();
                ClusterReport {
                    name: c.name_any(),
                    available: conditions::is_true(&status.conditions, AVAILABLE),
                    ready: status.ready_members,
                    desired: c.spec.config.replicas.unwrap_or_default(),
                    version: status.current_version,
                }
            })
            .collect();
        self.draw(&clusters, true)?;
        Ok(DemoSummary {
            phases: std::mem::take(&mut self.phases),
            final_table: self.last_table.clone(),
            clusters: reports,
            healed: self.healed.take(),
            total: self.started.elapsed(),
        })
    }

    async fn publish_templates(&mut self) -> Result<Vec<ClusterEtcdTemplate>> {
        let dir = &self.options.templates_dir;
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        paths.sort();
        let api: Api<ClusterEtcdTemplate> = Api::all(self.fleet.management_direct());
        let mut published = Vec::new();
        for path in paths {
            let text = std::fs::read_to_string(&path)?;
            let value = etcdfleet_api::yaml::value(&text)
                .with_context(|| format!("{} is not YAML", path.display()))?;
            if value.get("kind").and_then(|k| k.as_str()) != Some("ClusterEtcdTemplate") {
                continue;
            }
            let template: ClusterEtcdTemplate = etcdfleet_api::yaml::from_value(value)
                .with_context(|| format!("{} is not a ClusterEtcdTemplate", path.display()))?;
            let created = api
                .create(&PostParams::default(), &template)
                .await
                .with_context(|| format!("publishing {}", path.display()))?;
            published.push(created);
        }
        if published.is_empty() {
            bail!("no ClusterEtcdTemplate found in {}", dir.display());
        }
        Ok(published)
    }

    async fn clusters(&self) -> Result<BTreeMap<String, EtcdCluster>> {
        Ok(self
            .api()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect())
    }

    fn stamp(&self) -> String {
        format!("[+{:>6.1}s]", self.started.elapsed().as_secs_f64())
    }

    fn headline(&mut self, title: &str, about: &str) -> Result<()> {
        self.current = title.to_string();
        self.current_about = about.to_string();
        self.phase_started = Instant::now();
        if !self.options.live {
            let n = self.phases.len();
            let rule = "=".repeat(78);
            writeln!(
                self.out,
                "\n{rule}\n{}  {title}\n    {about}\n{rule}",
                if n == 0 {
                    "Setup".to_string()
                } else {
                    format!("Phase {n}")
                }
            )?;
        }
        Ok(())
    }

    fn log(&mut self, line: String) -> Result<()> {
        if self.options.live {
            self.recent.push_back(line);
            while self.recent.len() > 14 {
                self.recent.pop_front();
            }
        } else {
            writeln!(self.out, "{line}")?;
        }
        Ok(())
    }

    fn finish_phase(&mut self, steps: Vec<StepRecord>) -> Result<()> {
        let took = self.phase_started.elapsed();
        let line = format!(
            "{} done: {} ({:.1}s, {} steps)",
            self.stamp(),
            self.current,
            took.as_secs_f64(),
            steps.len()
        );
        self.phases.push(PhaseReport {
            name: self.current.clone(),
            took,
            steps,
        });
        self.log(line)
    }

    /// Reconciles every cluster until all report `Converged` and `goal` is
    /// met. Returns the new member id for [`Goal::Replaced`].
    async fn run_phase(&mut self, goal: Goal) -> Result<Option<String>> {
        let deadline = Instant::now() + self.options.phase_timeout;
        let mut steps = Vec::new();
        loop {
            if self.options.cancel.load(Ordering::SeqCst) {
                bail!("interrupted during phase '{}'", self.current);
            }
            let mut all_converged = true;
            for name in WORKLOADS {
                // A reconcile may wait on etcd for seconds: ctrl-c does not.
                let reconcile_started = Instant::now();
                let outcome = tokio::select! {
                    outcome = self.ctl.reconcile(DEMO_NAMESPACE, name) => outcome,
                    () = cancelled(&self.options.cancel) => {
                        bail!("interrupted during phase '{}'", self.current)
                    }
                };
                let text = match &outcome {
                    Ok(Outcome::Acted(step)) => {
                        steps.push(StepRecord {
                            cluster: name.to_string(),
                            kind: step.kind().to_string(),
                            text: step.to_string(),
                        });
                        all_converged = false;
                        let line = format!("{} {name:<9} {}", self.stamp(), show::plain(step));
                        self.log(line)?;
                        format!("acted: {step}")
                    }
                    Ok(Outcome::Converged) => "converged".to_string(),
                    Ok(Outcome::Waiting(why)) => {
                        all_converged = false;
                        format!("waiting: {why}")
                    }
                    Ok(Outcome::Blocked(why)) => {
                        all_converged = false;
                        format!("cannot proceed: {why}")
                    }
                    Ok(Outcome::Held(why)) => {
                        all_converged = false;
                        format!("needs attention: {why}")
                    }
                    Ok(Outcome::Paused(next)) => {
                        all_converged = false;
                        format!("paused (next: {})", next.as_deref().unwrap_or("nothing"))
                    }
                    Ok(Outcome::Deleted) => {
                        all_converged = false;
                        "deleted".to_string()
                    }
                    Ok(Outcome::Stopped) => {
                        all_converged = false;
                        "stopped".to_string()
                    }
                    Err(e) => {
                        all_converged = false;
                        self.errors.push(format!("{name}: {e}"));
                        format!("error: {e}")
                    }
                };
                // Waits, blocks and errors are logged when they change.
                if !text.starts_with("acted")
                    && text != "converged"
                    && self.last_outcome.get(name) != Some(&text)
                {
                    let line = format!("{} {name:<9} {text}", self.stamp());
                    self.log(line)?;
                }
                // No silent pause: a reconcile that waited long on etcd says so.
                let took = reconcile_started.elapsed();
                if took > Duration::from_secs(2) {
                    let line = format!(
                        "{} {name:<9} (this check took {:.1}s: the controller waited for etcd members to answer)",
                        self.stamp(),
                        took.as_secs_f64()
                    );
                    self.log(line)?;
                }
                self.last_outcome.insert(name.to_string(), text);
            }
            let clusters = self.clusters().await?;
            let met = check(&goal, &clusters);
            self.draw(&clusters, false)?;
            let unmet = match met {
                Ok(new_id) if all_converged => {
                    self.draw(&clusters, true)?;
                    self.finish_phase(steps)?;
                    return Ok(new_id);
                }
                Ok(_) => "a cluster is not converged".to_string(),
                Err(why) => why,
            };
            if Instant::now() > deadline {
                let why = self.diagnose(&clusters, &unmet);
                if !self.options.live {
                    writeln!(self.out, "\nFAILED: {why}")?;
                }
                bail!(
                    "phase '{}' did not complete within {:?}: {why}",
                    self.current,
                    self.options.phase_timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// Why a phase is stuck: the goal, the last outcomes, the conditions.
    fn diagnose(&self, clusters: &BTreeMap<String, EtcdCluster>, unmet: &str) -> String {
        let mut why = format!("{unmet}\nlast outcomes:");
        for (name, outcome) in &self.last_outcome {
            why.push_str(&format!("\n  {name}: {outcome}"));
        }
        why.push_str("\nconditions:");
        for (name, c) in clusters {
            for cond in c.status.iter().flat_map(|s| s.conditions.iter()) {
                why.push_str(&format!(
                    "\n  {name}: {}={} ({}): {}",
                    cond.type_, cond.status, cond.reason, cond.message
                ));
            }
        }
        if !self.errors.is_empty() {
            why.push_str("\nrecent errors:");
            for e in self.errors.iter().rev().take(5) {
                why.push_str(&format!("\n  {e}"));
            }
        }
        why
    }

    /// Shows the table: live, every `refresh`; otherwise when it changed (at
    /// most every `refresh` unless `force`).
    fn draw(&mut self, clusters: &BTreeMap<String, EtcdCluster>, force: bool) -> Result<()> {
        let due = self
            .last_draw
            .is_none_or(|t| t.elapsed() >= self.options.refresh);
        if !force && !due {
            return Ok(());
        }
        let table = render_table(clusters);
        if self.options.live {
            let mut frame = String::from("\x1b[H\x1b[2J");
            frame.push_str(&format!(
                "etcdfleet demo — management cluster + workload clusters {}   (+{:.0}s)\n\n",
                WORKLOADS.join(", "),
                self.started.elapsed().as_secs_f64()
            ));
            for p in &self.phases {
                frame.push_str(&format!(
                    "  ✓ {:<55} {:>6.1}s  {:>3} steps\n",
                    p.name,
                    p.took.as_secs_f64(),
                    p.steps.len()
                ));
            }
            if !self.phases.iter().any(|p| p.name == self.current) {
                frame.push_str(&format!(
                    "  ▶ {:<55} {:>6.1}s\n    {}\n",
                    self.current,
                    self.phase_started.elapsed().as_secs_f64(),
                    self.current_about
                ));
            }
            frame.push('\n');
            frame.push_str(&table);
            frame.push_str("\ncontroller steps:\n");
            for line in &self.recent {
                frame.push_str(&format!("  {line}\n"));
            }
            write!(self.out, "{frame}")?;
            self.out.flush()?;
        } else if table != self.last_table || force {
            if table != self.last_table {
                writeln!(self.out, "\n{} fleet status:\n{table}", self.stamp())?;
            }
            self.out.flush()?;
        }
        self.last_table = table;
        self.last_draw = Some(Instant::now());
        Ok(())
    }
}

/// Resolves once `flag` is set.
async fn cancelled(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The EtcdCluster a customer writes: where, and which template.
fn manifest(name: &str, template: &str, overrides: &str) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata:
  name: {name}
  namespace: {DEMO_NAMESPACE}
spec:
  clusterRef: {{name: {name}}}
  templateRef: {{kind: ClusterEtcdTemplate, name: {template}}}
{overrides}"
    )
}

/// `Ok(new id)` when `goal` is met, else what is missing.
fn check(
    goal: &Goal,
    clusters: &BTreeMap<String, EtcdCluster>,
) -> std::result::Result<Option<String>, String> {
    for name in WORKLOADS {
        let c = clusters
            .get(name)
            .ok_or_else(|| format!("{name} does not exist"))?;
        let status = c.status.clone().unwrap_or_default();
        let desired = c
            .spec
            .config
            .replicas
            .ok_or_else(|| format!("{name}: replicas not materialized yet"))?;
        if !conditions::is_true(&status.conditions, AVAILABLE) {
            return Err(format!("{name} is not Available"));
        }
        let voters = status
            .members
            .iter()
            .filter(|m| m.healthy && !m.learner)
            .count();
        if status.ready_members != desired || voters != desired as usize {
            return Err(format!(
                "{name}: {} of {desired} members ready ({voters} healthy voters)",
                status.ready_members
            ));
        }
        if status.members.len() != desired as usize {
            return Err(format!(
                "{name}: {} members, {desired} desired",
                status.members.len()
            ));
        }
    }
    match goal {
        Goal::AllAvailable => Ok(None),
        Goal::Version { cluster, version } => {
            let status = clusters[cluster.as_str()]
                .status
                .clone()
                .unwrap_or_default();
            let behind: Vec<&str> = status
                .members
                .iter()
                .filter(|m| m.version.as_deref() != Some(version.as_str()))
                .map(|m| m.name.as_str())
                .collect();
            if status.current_version.as_deref() == Some(version.as_str()) && behind.is_empty() {
                Ok(None)
            } else {
                Err(format!(
                    "{cluster}: not every member runs {version} yet ({})",
                    behind.join(", ")
                ))
            }
        }
        Goal::Replaced {
            cluster,
            member,
            old_id,
        } => {
            let c = &clusters[cluster.as_str()];
            let id = c
                .status
                .iter()
                .flat_map(|s| s.members.iter())
                .find(|m| &m.name == member)
                .and_then(|m| m.id.clone())
                .ok_or_else(|| format!("{cluster}: no member {member}"))?;
            if &id == old_id {
                Err(format!(
                    "{cluster}: {member} is still member {old_id} (not replaced yet)"
                ))
            } else {
                Ok(Some(id))
            }
        }
    }
}

/// Whether this process may create a mount namespace and bind-mount in it,
/// as the workload runtime does for every etcd pod. `Err` says, in one line,
/// what the demo needs.
pub fn check_mount_namespaces() -> std::result::Result<(), String> {
    let dir =
        tempfile::tempdir().map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for f in [&a, &b] {
        std::fs::write(f, "").map_err(|e| format!("cannot write {}: {e}", f.display()))?;
    }
    let needs = "the demo runs every etcd pod in its own mount namespace";
    match std::process::Command::new("unshare")
        .args(["-m", "mount", "--bind"])
        .arg(&a)
        .arg(&b)
        .output()
    {
        Err(e) => Err(format!(
            "{needs} and needs `unshare` (Debian util-linux): {e}"
        )),
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{needs}: run it as root (`sudo make demo`) or with CAP_SYS_ADMIN ({})",
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("unshare failed")
        )),
    }
}

/// The fleet as a table: one row per cluster, the demo's workload clusters
/// first, its members under it.
pub fn render_table(clusters: &BTreeMap<String, EtcdCluster>) -> String {
    show::fleet_table(clusters, &WORKLOADS)
}

fn write_summary(out: &mut impl Write, summary: &DemoSummary) -> Result<()> {
    let rule = "=".repeat(78);
    writeln!(out, "\n{rule}\nSummary\n{rule}")?;
    let width = summary
        .phases
        .iter()
        .map(|p| p.name.chars().count())
        .max()
        .unwrap_or(5)
        .max("starting and stopping the fleet".len());
    writeln!(out, "{:<width$}  {:>8}  {:>5}", "PHASE", "TIME", "STEPS")?;
    for p in &summary.phases {
        writeln!(
            out,
            "{:<width$}  {:>7.1}s  {:>5}",
            p.name,
            p.took.as_secs_f64(),
            p.steps.len()
        )?;
    }
    // So the column adds up: the rest is starting the workload clusters'
    // runtimes and stopping every etcd process at the end.
    let phases: Duration = summary.phases.iter().map(|p| p.took).sum();
    writeln!(
        out,
        "{:<width$}  {:>7.1}s  {:>5}",
        "starting and stopping the fleet",
        summary.total.saturating_sub(phases).as_secs_f64(),
        0
    )?;
    writeln!(
        out,
        "{:<width$}  {:>7.1}s  {:>5}",
        "total",
        summary.total.as_secs_f64(),
        summary.steps().count()
    )?;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for step in summary.steps() {
        *kinds.entry(step.kind.clone()).or_default() += 1;
    }
    writeln!(
        out,
        "steps by kind: {}",
        kinds
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    if let Some(h) = &summary.healed {
        writeln!(
            out,
            "healed: {}/{} was member {}, replaced by member {}",
            h.cluster, h.member, h.old_id, h.new_id
        )?;
    }
    for c in &summary.clusters {
        writeln!(
            out,
            "{:<9} {} {}/{} members, etcd {}",
            c.name,
            if c.available {
                "Available"
            } else {
                "NOT Available"
            },
            c.ready,
            c.desired,
            c.version.as_deref().unwrap_or("?")
        )?;
    }
    out.flush()?;
    Ok(())
}
