//! What the bench reads off processes: a controller's /metrics, and any
//! process's peak RSS and CPU time from /proc.

use anyhow::{Context as _, Result};
use etcdfleet_tests::controller_process::ControllerProcess;

/// `etcdfleet_plans_total{plan="Converged"}` of a controller, from /metrics.
pub fn converged_reconciles(process: &ControllerProcess) -> Option<u64> {
    let (_, body) = process.get("/metrics")?;
    body.lines()
        .find(|l| l.starts_with(r#"etcdfleet_plans_total{plan="Converged"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .or(Some(0))
}

/// `VmHWM` (peak resident set) of a process, in MiB.
pub fn peak_rss_mib(pid: i32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmHWM")?;
    Ok(kib / 1024.0)
}

/// CPU time (user + system) a process has used so far, in milliseconds.
pub fn cpu_ms(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) end with ')'.
    let rest = stat.rsplit_once(')').context("no ')' in stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: the 14th and 15th fields, 12th and 13th after ')'.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks * 1000.0 / per_second)
}

/// The bearer token in a kubeconfig written by the test API.
pub fn token_of(kubeconfig: &str) -> Option<String> {
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().trim_matches('"').to_string())
}

/// One Prometheus sample of a controller's /metrics (`name` with its labels).
pub fn sample(process: &ControllerProcess, name: &str) -> Option<f64> {
    let (_, body) = process.get("/metrics")?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The upper bound of the lowest bucket of a histogram holding all samples.
pub fn histogram_max(process: &ControllerProcess, name: &str) -> Option<f64> {
    let (_, body) = process.get("/metrics")?;
    let count = sample(process, &format!("{name}_count"))?;
    body.lines()
        .filter_map(|l| l.strip_prefix(&format!("{name}_bucket{{le=\"")))
        .filter_map(|rest| {
            let (le, value) = rest.split_once("\"} ")?;
            Some((le.parse::<f64>().ok()?, value.trim().parse::<f64>().ok()?))
        })
        .find(|(_, v)| *v >= count)
        .map(|(le, _)| le)
}
