//! How the demo shows the fleet: the status table (a row per cluster, as
//! `kubectl get etcdclusters` would print it, with its members and any
//! progressing or degraded condition under it), and the controller's steps
//! in words a person reads.

use std::collections::BTreeMap;

use etcdfleet_api::conditions::{self, AVAILABLE, DEGRADED, PROGRESSING};
use etcdfleet_api::{EtcdCluster, MemberStatus};
use etcdfleet_controllers::etcdcluster::plan::{ObjectKind, Step};
use kube::ResourceExt;

/// The fleet as a table: one row per cluster (those named in `first` first,
/// in that order), its members under it.
pub(super) fn fleet_table(clusters: &BTreeMap<String, EtcdCluster>, first: &[&str]) -> String {
    let header = [
        "CLUSTER",
        "WORKLOAD",
        "TEMPLATE",
        "VERSION",
        "MEMBERS",
        "LEADER",
        "AVAILABLE",
        "PROGRESSING",
        "LAST OPERATION",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    let ordered: Vec<&EtcdCluster> = first
        .iter()
        .filter_map(|n| clusters.get(*n))
        .chain(
            clusters
                .values()
                .filter(|c| !first.contains(&c.name_any().as_str())),
        )
        .collect();
    for c in &ordered {
        let status = c.status.clone().unwrap_or_default();
        let cond = |t: &str| {
            conditions::find(&status.conditions, t)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        let leader = status
            .members
            .iter()
            .find(|m| m.leader)
            .map_or("-".to_string(), |m| m.name.clone());
        let last = status
            .last_operation
            .as_ref()
            .map_or("-".to_string(), |op| {
                let at = op
                    .time
                    .as_ref()
                    .map(|t| format!(" at {}", t.0.strftime("%H:%M:%S")))
                    .unwrap_or_default();
                format!("{} {}{at}", op.type_, op.outcome)
            });
        rows.push(vec![
            c.name_any(),
            c.spec
                .cluster_ref
                .as_ref()
                .map_or("-".to_string(), |r| r.name.clone()),
            c.spec
                .template_ref
                .as_ref()
                .map_or("-".to_string(), |t| t.name.clone()),
            status
                .current_version
                .clone()
                .unwrap_or_else(|| "-".to_string()),
            format!(
                "{}/{}",
                status.ready_members,
                c.spec
                    .config
                    .replicas
                    .map_or("?".to_string(), |r| r.to_string())
            ),
            leader,
            cond(AVAILABLE).map_or("-".to_string(), |(s, _, _)| s),
            cond(PROGRESSING).map_or("-".to_string(), |(s, r, _)| format!("{s} ({r})")),
            last,
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let line = |row: &[String]| {
        let mut s = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(&rows[0]);
    for (c, row) in ordered.iter().zip(&rows[1..]) {
        out.push_str(&line(row));
        let status = c.status.clone().unwrap_or_default();
        out.push_str(&render_members(&status.members));
        for (t, label) in [(PROGRESSING, "progressing"), (DEGRADED, "degraded")] {
            if let Some(cond) = conditions::find(&status.conditions, t)
                && cond.status == "True"
                && !cond.message.is_empty()
            {
                out.push_str(&format!(
                    "    {label}: {}: {}\n",
                    cond.reason,
                    shorten(&cond.message, 110)
                ));
            }
        }
    }
    out
}

fn render_members(members: &[MemberStatus]) -> String {
    if members.is_empty() {
        return "    (no members observed yet)\n".to_string();
    }
    let mut rows: Vec<[String; 6]> = vec![[
        "MEMBER".into(),
        "ID".into(),
        "HEALTHY".into(),
        "ROLE".into(),
        "LEADER".into(),
        "DB SIZE".into(),
    ]];
    for m in members {
        rows.push([
            m.name.clone(),
            m.id.clone().unwrap_or_else(|| "-".into()),
            if m.healthy { "yes" } else { "NO" }.into(),
            if m.learner { "learner" } else { "voter" }.into(),
            if m.leader { "leader" } else { "" }.into(),
            m.db_size_bytes.map_or("-".into(), human_bytes),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let mut s = format!("    {} ", if i == 0 { " " } else { "└" });
        s.push_str(
            &row.iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect::<Vec<_>>()
                .join("  "),
        );
        out.push_str(s.trim_end());
        out.push('\n');
    }
    for m in members.iter().filter(|m| !m.healthy) {
        if let Some(msg) = &m.message {
            out.push_str(&format!("      {}: {}\n", m.name, shorten(msg, 100)));
        }
    }
    out
}

fn human_bytes(n: i64) -> String {
    let n = n as f64;
    if n >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", n / (1024.0 * 1024.0))
    } else if n >= 1024.0 {
        format!("{:.0} KiB", n / 1024.0)
    } else {
        format!("{n} B")
    }
}

fn shorten(s: &str, max: usize) -> String {
    let s = s.replace('\n', " ");
    if s.chars().count() <= max {
        s
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// A step as a person reads it (the planner's own text names internal kinds).
pub(super) fn plain(step: &Step) -> String {
    match step {
        Step::WriteObjects(kinds) => {
            let what: Vec<&str> = kinds
                .iter()
                .map(|k| match k {
                    ObjectKind::Pki => "certificate authority",
                    ObjectKind::Namespace => "namespace",
                    ObjectKind::ServerTlsSecret => "server certificates",
                    ObjectKind::PeerTlsSecret => "peer certificates",
                    ObjectKind::CaBundleConfigMap => "CA bundle",
                    ObjectKind::PeerService => "peer service",
                    ObjectKind::ClientService => "client service",
                    ObjectKind::PodDisruptionBudget => "disruption budget",
                    ObjectKind::MembersConfigMap => "member list",
                    ObjectKind::StatefulSet => "StatefulSet",
                })
                .collect();
            format!("write {}", what.join(", "))
        }
        Step::Bootstrap { replicas } => {
            format!("start the cluster with {replicas} member(s)")
        }
        Step::ScaleStatefulSet { replicas } => format!("run {replicas} etcd pods"),
        Step::RecordPvcMember {
            ordinal,
            member_id,
            version,
        } => match version {
            Some(v) => {
                format!("label the data volume of pod {ordinal}: member {member_id:x}, etcd {v}")
            }
            None => format!("label the data volume of pod {ordinal}: member {member_id:x}"),
        },
        other => other.to_string(),
    }
}
