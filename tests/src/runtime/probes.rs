//! Container probes as the kubelet runs them on the real tier: a startup
//! probe gates the others; liveness failures past the threshold restart the
//! container; readiness decides `Ready`. `initialDelaySeconds` and
//! `failureThreshold` are honoured; `periodSeconds` is capped at
//! [`MAX_PERIOD`] (the one liberty taken, so tests do not wait ten seconds
//! per member for a probe a real node would run just as surely).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// etcd answers its serializable `/health` locally; a member without a
/// leader answers 503 at once.
const HTTP_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The longest time between two runs of one probe.
pub const MAX_PERIOD: Duration = Duration::from_secs(1);

/// One HTTP GET probe of a container at the pod's IP.
#[derive(Debug, Clone, PartialEq)]
struct HttpProbe {
    addr: SocketAddr,
    path: String,
    initial_delay: Duration,
    period: Duration,
    failure_threshold: u32,
}

impl HttpProbe {
    fn of(probe: Option<&Probe>, ip: Ipv4Addr) -> Option<HttpProbe> {
        let probe = probe?;
        let get = probe.http_get.as_ref()?;
        let port = match &get.port {
            IntOrString::Int(p) => u16::try_from(*p).ok()?,
            IntOrString::String(_) => return None,
        };
        let secs =
            |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        Some(HttpProbe {
            addr: SocketAddr::from((ip, port)),
            path: get.path.clone().unwrap_or_else(|| "/".into()),
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).clamp(Duration::from_millis(100), MAX_PERIOD),
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
        })
    }
}

/// One probe's schedule and consecutive failures.
#[derive(Debug)]
struct ProbeRun {
    probe: HttpProbe,
    last: Option<Instant>,
    failures: u32,
    ok: bool,
}

impl ProbeRun {
    fn new(probe: HttpProbe) -> Self {
        ProbeRun {
            probe,
            last: None,
            failures: 0,
            ok: false,
        }
    }

    /// Runs the probe if it is due (`started` is when the container started);
    /// returns whether it ran.
    async fn run_if_due(&mut self, started: Instant) -> bool {
        let now = Instant::now();
        if now < started + self.probe.initial_delay
            || self.last.is_some_and(|at| now < at + self.probe.period)
        {
            return false;
        }
        self.last = Some(now);
        self.ok = http_probe(self.probe.addr, &self.probe.path).await;
        self.failures = if self.ok { 0 } else { self.failures + 1 };
        true
    }

    fn failed_out(&self) -> bool {
        self.failures >= self.probe.failure_threshold
    }
}

/// What the probes of one running container say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub ready: bool,
    /// Startup or liveness failed past its threshold: the kubelet kills the
    /// container and restarts it.
    pub restart: bool,
}

/// The probes of one container run (reset on every container start).
#[derive(Debug)]
pub struct Probes {
    started_at: Instant,
    startup: Option<ProbeRun>,
    liveness: Option<ProbeRun>,
    readiness: Option<ProbeRun>,
    started: bool,
    ready: bool,
}

impl Probes {
    /// The probes of `container`, whose process started now at `ip`.
    pub fn new(container: &Container, ip: Ipv4Addr) -> Probes {
        let run = |p: Option<&Probe>| HttpProbe::of(p, ip).map(ProbeRun::new);
        let startup = run(container.startup_probe.as_ref());
        Probes {
            started_at: Instant::now(),
            started: startup.is_none(),
            startup,
            liveness: run(container.liveness_probe.as_ref()),
            readiness: run(container.readiness_probe.as_ref()),
            ready: false,
        }
    }

    /// Runs what is due. Without a readiness probe a started container is ready.
    pub async fn tick(&mut self) -> Verdict {
        if !self.started {
            let startup = self
                .startup
                .as_mut()
                .expect("unstarted only with a startup probe");
            if startup.run_if_due(self.started_at).await {
                if startup.ok {
                    self.started = true;
                } else if startup.failed_out() {
                    return Verdict {
                        ready: false,
                        restart: true,
                    };
                }
            }
            if !self.started {
                return Verdict {
                    ready: false,
                    restart: false,
                };
            }
        }
        if let Some(liveness) = self.liveness.as_mut()
            && liveness.run_if_due(self.started_at).await
            && liveness.failed_out()
        {
            return Verdict {
                ready: false,
                restart: true,
            };
        }
        match self.readiness.as_mut() {
            Some(readiness) => {
                if readiness.run_if_due(self.started_at).await {
                    if readiness.ok {
                        self.ready = true;
                    } else if readiness.failed_out() {
                        self.ready = false;
                    }
                }
            }
            None => self.ready = true,
        }
        Verdict {
            ready: self.ready,
            restart: false,
        }
    }
}

/// An HTTP readiness probe as the kubelet runs it: a GET within the probe
/// timeout, ready on a 2xx or 3xx answer.
pub(super) async fn http_probe(addr: SocketAddr, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(HTTP_PROBE_TIMEOUT, probe).await {
        // "HTTP/1.x NNN"
        Ok(Ok(head)) => matches!(head.get(9), Some(b'2' | b'3')),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::HTTPGetAction;

    fn probe(port: u16, delay: i32, threshold: i32) -> Probe {
        Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/health".into()),
                port: IntOrString::Int(port.into()),
                ..Default::default()
            }),
            initial_delay_seconds: Some(delay),
            period_seconds: Some(10),
            failure_threshold: Some(threshold),
            ..Default::default()
        }
    }

    #[test]
    fn probe_timing_honours_delay_and_threshold_and_caps_the_period() {
        let p = HttpProbe::of(Some(&probe(2381, 5, 8)), Ipv4Addr::new(127, 1, 2, 3)).unwrap();
        assert_eq!(p.addr, "127.1.2.3:2381".parse().unwrap());
        assert_eq!(p.initial_delay, Duration::from_secs(5));
        assert_eq!(p.period, MAX_PERIOD);
        assert_eq!(p.failure_threshold, 8);
    }

    #[tokio::test]
    async fn a_failing_liveness_probe_restarts_after_its_threshold_and_never_before() {
        // Nothing listens on this port: every probe fails.
        let port = crate::controller_process::free_port();
        let container = Container {
            liveness_probe: Some(probe(port, 0, 2)),
            ..Default::default()
        };
        let mut probes = Probes::new(&container, Ipv4Addr::LOCALHOST);
        let first = probes.tick().await;
        assert_eq!(
            first,
            Verdict {
                ready: true,
                restart: false
            }
        );
        // Not due again within the period: no second failure yet.
        assert!(!probes.tick().await.restart);
        tokio::time::sleep(MAX_PERIOD).await;
        assert!(probes.tick().await.restart);
    }

    #[tokio::test]
    async fn readiness_waits_for_the_startup_probe() {
        let port = crate::controller_process::free_port();
        let container = Container {
            startup_probe: Some(probe(port, 0, 3)),
            ..Default::default()
        };
        let mut probes = Probes::new(&container, Ipv4Addr::LOCALHOST);
        assert_eq!(
            probes.tick().await,
            Verdict {
                ready: false,
                restart: false
            }
        );
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        std::thread::spawn(move || {
            use std::io::Write;
            for mut s in listener.incoming().flatten() {
                let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\n");
            }
        });
        tokio::time::sleep(MAX_PERIOD).await;
        assert_eq!(
            probes.tick().await,
            Verdict {
                ready: true,
                restart: false
            }
        );
    }
}
