//! The pod network on loopback: a `127.X.Y.0/24` block per runtime, a
//! stable IP per pod, the hosts file every pod process sees as `/etc/hosts`
//! (whose names `WorkloadRuntime::resolve` answers too), and the one
//! substitution: `0.0.0.0` in etcd's listen URLs becomes the pod's IP.

use std::collections::BTreeSet;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use anyhow::{Result, bail};

use super::state::{Inner, PodKey, State};
use crate::etcd_harness::random_u64;

/// Loopback /24 blocks taken by runtimes of this process.
static TAKEN_BLOCKS: Mutex<BTreeSet<(u8, u8)>> = Mutex::new(BTreeSet::new());

/// A random free `127.X.Y.0/24` (X in 16..=250), locked by a listener on
/// `127.X.Y.254:2379` and checked free by binding `127.X.Y.1:{2379,2380}`.
pub(super) fn allocate_block() -> Result<((u8, u8), TcpListener)> {
    for _ in 0..500 {
        let r = random_u64();
        let x = 16 + (r % 235) as u8;
        let y = (r >> 16) as u8;
        if !TAKEN_BLOCKS.lock().expect("lock").insert((x, y)) {
            continue;
        }
        let lock = TcpListener::bind((Ipv4Addr::new(127, x, y, 254), 2379));
        let free = [2379u16, 2380]
            .iter()
            .all(|&port| TcpListener::bind((Ipv4Addr::new(127, x, y, 1), port)).is_ok());
        match lock {
            Ok(lock) if free => return Ok(((x, y), lock)),
            _ => continue,
        }
    }
    bail!("no free 127.X.Y.0/24 loopback block found")
}

pub(super) fn hosts_base() -> String {
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_string()
}

/// Rewrites host `0.0.0.0` to `ip` in the listen-URL arguments (the one
/// substitution this runtime makes, see the module docs). Handles
/// `--flag=value`, `-flag=value` and `--flag value`.
pub(super) fn substitute_listen_urls(args: &[String], ip: Ipv4Addr) -> Vec<String> {
    const FLAGS: [&str; 3] = [
        "listen-client-urls",
        "listen-peer-urls",
        "listen-metrics-urls",
    ];
    let rewrite = |urls: &str| urls.replace("://0.0.0.0:", &format!("://{ip}:"));
    let mut out = Vec::with_capacity(args.len());
    let mut value_of_flag = false;
    for arg in args {
        if value_of_flag {
            out.push(rewrite(arg));
            value_of_flag = false;
            continue;
        }
        let bare = arg.trim_start_matches('-');
        match bare.split_once('=') {
            Some((flag, value)) if arg.starts_with('-') && FLAGS.contains(&flag) => {
                out.push(format!(
                    "{}={}",
                    &arg[..arg.len() - bare.len() + flag.len()],
                    rewrite(value)
                ));
            }
            None if arg.starts_with('-') && FLAGS.contains(&bare) => {
                out.push(arg.clone());
                value_of_flag = true;
            }
            _ => out.push(arg.clone()),
        }
    }
    out
}

/// The first `--listen-client-urls` address, for the readiness check.
pub(super) fn client_listen_addr(args: &[String]) -> Option<SocketAddr> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let bare = arg.trim_start_matches('-');
        let value = match bare.split_once('=') {
            Some(("listen-client-urls", v)) => v.to_string(),
            None if bare == "listen-client-urls" => iter.next()?.clone(),
            _ => continue,
        };
        let first = value.split(',').next()?;
        let authority = first.split_once("://")?.1.split('/').next()?;
        return authority.parse().ok();
    }
    None
}

impl Inner {
    pub(super) fn ip_for(&self, state: &mut State, key: &PodKey) -> Result<Ipv4Addr> {
        if let Some(ip) = state.ips.get(key) {
            return Ok(*ip);
        }
        let n = state.ips.len() + 1;
        if n > 250 {
            bail!("the runtime's /24 block is exhausted");
        }
        let (x, y) = self.block;
        let ip = Ipv4Addr::new(127, x, y, n as u8);
        state.ips.insert(key.clone(), ip);
        Ok(ip)
    }

    /// Rewrites the hosts file in place (same inode): appends when only lines
    /// were added, else overwrites and truncates.
    pub(super) fn write_hosts(&self, state: &mut State) -> Result<()> {
        let mut content = hosts_base();
        for line in state.host_lines.values() {
            content.push_str(line);
            content.push('\n');
        }
        {
            let mut names = self.names.lock().expect("lock");
            names.clear();
            for (key, ip) in &state.ips {
                names.insert(format!("{}.{}.pod", key.1, key.0), *ip);
            }
            for line in state.host_lines.values() {
                let mut fields = line.split_whitespace();
                let Some(ip) = fields.next().and_then(|i| i.parse().ok()) else {
                    continue;
                };
                for name in fields {
                    names.insert(name.to_ascii_lowercase(), ip);
                }
            }
        }
        if content == state.hosts_content {
            return Ok(());
        }
        let file = fs::OpenOptions::new().write(true).open(&self.hosts_file)?;
        if let Some(suffix) = content.strip_prefix(state.hosts_content.as_str()) {
            file.write_all_at(suffix.as_bytes(), state.hosts_content.len() as u64)?;
        } else {
            file.write_all_at(content.as_bytes(), 0)?;
            file.set_len(content.len() as u64)?;
        }
        state.hosts_content = content;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listen_urls_on_any_address_are_rewritten() {
        let ip = Ipv4Addr::new(127, 20, 1, 3);
        let args: Vec<String> = [
            "--listen-client-urls=http://0.0.0.0:2379,http://127.0.0.1:2379",
            "--listen-peer-urls",
            "https://0.0.0.0:2380",
            "--advertise-client-urls=http://0.0.0.0:2379",
            "-listen-metrics-urls=http://0.0.0.0:2381",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = substitute_listen_urls(&args, ip);
        assert_eq!(
            out,
            vec![
                "--listen-client-urls=http://127.20.1.3:2379,http://127.0.0.1:2379",
                "--listen-peer-urls",
                "https://127.20.1.3:2380",
                "--advertise-client-urls=http://0.0.0.0:2379",
                "-listen-metrics-urls=http://127.20.1.3:2381",
            ]
        );
        assert_eq!(
            client_listen_addr(&out),
            Some("127.20.1.3:2379".parse().unwrap())
        );
    }
}
