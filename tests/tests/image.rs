//! The controller image `make image` builds (`hack/build-image.sh`):
//!
//! - standard tools read it: `skopeo inspect` (manifest and config) and
//!   `umoci` (the tag in the layout); it is tagged with the workspace version,
//!   the tag the manifests deploy, and holds one layer with two files: the
//!   binary and a CA bundle;
//! - the bundle is the Mozilla set of Debian's `ca-certificates`, where the
//!   object-store client looks for it, and none of the build machine's own
//!   CAs: the binary trusts those certificates in the image's root, and
//!   none in a root without them;
//! - its binary is static and runs in an empty root: it starts there, and
//!   resolves names from `/etc/hosts` and through `/etc/resolv.conf` (a DNS
//!   server of the test on a loopback address), as the controller must for
//!   workload API servers named in kubeconfigs;
//! - the seeder's two init containers run as they do in a pod, each in a
//!   root of its own: `install-seeder` from the image's root filesystem
//!   copies the binary into an emptyDir, and `restore-seed` runs that copy
//!   inside a bare etcd image layout (nothing but `etcdutl`, no libc, no
//!   shell) and restores a real etcd 3.5 snapshot into the data volume
//!   (`restore_seed.rs` shows etcd serving every key of such a restore),
//!   from a directory or from an S3 bucket over plain HTTP, which needs no
//!   CA bundle in the etcd image;
//! - the seeder command the controller renders for `install-seeder` is a
//!   program of the image, found as a runtime finds it (no `PATH`);
//! - the test world's image table runs the seeder from this image.

use std::net::{Ipv4Addr, UdpSocket};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::{EtcdCluster, ObjectStoreDestination};
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::etcdcluster::resolve::{render_inputs, resolve_own_spec};
use etcdfleet_controllers::render::{self, RenderProfile};
use etcdfleet_controllers::restore::seed::{ENV_ACCESS_KEY_ID, ENV_SECRET_ACCESS_KEY};
use etcdfleet_controllers::store::{Credentials, Store};
use etcdfleet_tests::etcd_harness::{
    ClusterOptions, EtcdBinary, EtcdVersion, LocalEtcdCluster, random_u64, require_etcd,
};
use etcdfleet_tests::image::{BuiltImage, require_image};
use etcdfleet_tests::runtime::{ImageTable, SEEDER_IMAGE};
use etcdfleet_tests::s3::{ACCESS_KEY_ID, S3Server, SECRET_ACCESS_KEY};
use serde_json::Value;

fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

fn json_of(cmd: &mut Command) -> Result<Value> {
    Ok(serde_json::from_slice(&run(cmd)?.stdout)?)
}

/// Runs `program args` chrooted into `root`, in a private mount namespace
/// where each `(host dir, path in root)` is bind-mounted and `/proc` is
/// mounted (as a container runtime does).
fn in_root(root: &Path, binds: &[(&Path, &str)], program: &str, args: &[&str]) -> Command {
    let mut script =
        String::from("set -e\nmkdir -p \"$ROOT/proc\"\nmount -t proc proc \"$ROOT/proc\"\n");
    for (i, _) in binds.iter().enumerate() {
        script.push_str(&format!(
            "mkdir -p \"$ROOT$T{i}\"\nmount --bind \"$S{i}\" \"$ROOT$T{i}\"\n"
        ));
    }
    script.push_str("exec chroot \"$ROOT\" \"$@\"\n");
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", &script, "sh", program])
        .args(args)
        .env_clear()
        .env("ROOT", root)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
    for (i, (source, target)) in binds.iter().enumerate() {
        cmd.env(format!("S{i}"), source)
            .env(format!("T{i}"), target);
    }
    cmd
}

#[test]
fn standard_tools_read_the_image_and_it_carries_the_release_tag() -> Result<()> {
    let Some(image) = require_image() else {
        return Ok(());
    };
    let reference = format!("oci:{}:{}", image.layout().display(), image.tag);
    let manifest = json_of(Command::new("skopeo").args(["inspect", &reference]))?;
    assert_eq!(manifest["Architecture"], "amd64");
    assert_eq!(manifest["Os"], "linux");
    assert_eq!(
        manifest["Labels"]["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(manifest["Layers"].as_array().map(Vec::len), Some(1));
    let config = json_of(Command::new("skopeo").args(["inspect", "--config", &reference]))?;
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/etcdfleet"])
    );
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["run"]));
    assert_eq!(config["config"]["User"], "65532:65532");
    let tags = run(Command::new("umoci")
        .args(["ls", "--layout"])
        .arg(image.layout()))?;
    assert_eq!(String::from_utf8_lossy(&tags.stdout).trim(), image.tag);

    // FROM scratch: the layer holds the binary and the CA bundle, nothing else.
    assert_eq!(
        files_under(&image.rootfs())?,
        vec![CA_BUNDLE.to_string(), "etcdfleet".to_string()]
    );
    assert!(
        manifest["Labels"]["dev.etcdfleet.ca-certificates.version"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "the image names the ca-certificates version it carries"
    );
    let size: u64 = std::fs::read_dir(image.layout().join("blobs/sha256"))?
        .map(|e| e.and_then(|e| e.metadata()).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    eprintln!(
        "image {}: {:.1} MiB in the layout ({} bytes), binary {} bytes",
        image.reference(),
        size as f64 / (1 << 20) as f64,
        size,
        std::fs::metadata(image.rootfs_binary())?.len()
    );

    // The tag the manifests deploy is the image's.
    let deployment = std::fs::read_to_string(
        etcdfleet_tests::etcd_harness::workspace_root().join("config/manager/deployment.yaml"),
    )?;
    assert!(
        deployment.contains(&format!("image: {}", image.reference())),
        "config/manager/deployment.yaml does not deploy {}",
        image.reference()
    );
    Ok(())
}

/// Where the image holds its CA bundle: the first file openssl-probe (under
/// rustls-native-certs, under the object-store client) looks for on Linux.
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";
/// Debian's CA certificates, one file each; the machine's own additions.
const DEBIAN_CAS: &str = "/usr/share/ca-certificates/mozilla";
const LOCAL_CAS: &str = "/usr/local/share/ca-certificates";

/// Every regular file under `root`, as paths relative to it, sorted.
fn files_under(root: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let relative = path.strip_prefix(root)?;
                files.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The PEM blocks of a file, each trimmed.
fn pem_certificates(text: &str) -> Vec<String> {
    text.split_inclusive("-----END CERTIFICATE-----")
        .filter_map(|block| {
            block
                .find("-----BEGIN CERTIFICATE-----")
                .map(|i| &block[i..])
        })
        .map(|block| block.trim().to_string())
        .collect()
}

#[test]
fn the_image_trusts_debians_ca_certificates_and_none_of_the_machines_own() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let Some(image) = require_image() else {
        return Ok(());
    };
    let bundle_path = image.rootfs().join(CA_BUNDLE);
    // Read by the controller's user (65532), not only by root.
    let mode = std::fs::metadata(&bundle_path)?.permissions().mode();
    assert_eq!(mode & 0o777, 0o644, "{CA_BUNDLE} mode {mode:o}");
    let bundle = pem_certificates(&std::fs::read_to_string(&bundle_path)?);
    let mut debian = Vec::new();
    for entry in std::fs::read_dir(DEBIAN_CAS)? {
        debian.extend(pem_certificates(&std::fs::read_to_string(entry?.path())?));
    }
    assert!(debian.len() > 100, "{} CAs in {DEBIAN_CAS}", debian.len());
    let mut sorted = bundle.clone();
    sorted.sort();
    debian.sort();
    assert!(sorted == debian, "the bundle is not Debian's Mozilla set");
    // CAs added on the build machine (update-ca-certificates puts them in
    // its /etc/ssl/certs bundle) never reach the image.
    for entry in std::fs::read_dir(LOCAL_CAS).into_iter().flatten() {
        let path = entry?.path();
        for local in pem_certificates(&std::fs::read_to_string(&path).unwrap_or_default()) {
            assert!(
                !bundle.contains(&local),
                "{} is in the image",
                path.display()
            );
        }
    }

    // The binary trusts them in the image's root, as its S3 client loads
    // them, and none in a root without them (exit 1).
    let work = tempfile::tempdir()?;
    let image_root = work.path().join("image");
    copy_dir(&image.rootfs(), &image_root)?;
    let out = run(&mut in_root(
        &image_root,
        &[],
        "/etcdfleet",
        &["ca-certificates"],
    ))?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{} CA certificates", bundle.len())
    );
    let bare = work.path().join("bare");
    std::fs::create_dir_all(&bare)?;
    std::fs::copy(image.rootfs_binary(), bare.join("etcdfleet"))?;
    let out = in_root(&bare, &[], "/etcdfleet", &["ca-certificates"]).output()?;
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0 CA certificates"
    );
    Ok(())
}

/// Answers A queries for `name` with `answer` (and nothing else) on
/// `addr:53`, `count` times.
fn dns_server(addr: Ipv4Addr, name: &'static str, answer: Ipv4Addr) -> Result<()> {
    let socket = UdpSocket::bind((addr, 53))?;
    socket.set_read_timeout(Some(Duration::from_secs(30)))?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let query = &buf[..n];
            let Some(end) = query[12..].iter().position(|&b| b == 0).map(|p| 12 + p + 5) else {
                continue;
            };
            let question = &query[12..end];
            let mut labels = Vec::new();
            let mut i = 0;
            while question[i] != 0 {
                let len = question[i] as usize;
                labels.push(String::from_utf8_lossy(&question[i + 1..i + 1 + len]).into_owned());
                i += len + 1;
            }
            let is_a = question[end - 12 - 4..end - 12 - 2] == [0, 1];
            let hit = is_a && labels.join(".") == name;
            let mut reply = query[..2].to_vec();
            reply.extend([0x81, 0x80, 0, 1, 0, u8::from(hit), 0, 0, 0, 0]);
            reply.extend(question);
            if hit {
                reply.extend([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
                reply.extend(answer.octets());
            }
            let _ = socket.send_to(&reply, from);
        }
    });
    Ok(())
}

#[test]
fn the_static_binary_starts_and_resolves_names_in_an_empty_root() -> Result<()> {
    let Some(image) = require_image() else {
        return Ok(());
    };
    let readelf = run(Command::new("readelf").arg("-l").arg(image.rootfs_binary()))?;
    let headers = String::from_utf8_lossy(&readelf.stdout);
    assert!(
        !headers.contains("INTERP"),
        "the image's binary asks for a dynamic loader:\n{headers}"
    );

    // A DNS server on a loopback address of its own (port 53: resolv.conf
    // names no port).
    let r = random_u64();
    let dns = Ipv4Addr::new(127, 53, (r >> 8) as u8, (r as u8).max(2));
    dns_server(dns, "etcd-api.dns.test", Ipv4Addr::new(10, 9, 8, 7))?;
    let root = tempfile::tempdir()?;
    std::fs::create_dir_all(root.path().join("etc"))?;
    std::fs::copy(image.rootfs_binary(), root.path().join("etcdfleet"))?;
    std::fs::write(
        root.path().join("etc/hosts"),
        "10.1.2.3 workload-api.hosts.test\n",
    )?;
    std::fs::write(
        root.path().join("etc/resolv.conf"),
        format!("nameserver {dns}\n"),
    )?;

    let started = Instant::now();
    let version = run(&mut in_root(root.path(), &[], "/etcdfleet", &["--version"]))?;
    eprintln!(
        "the static binary starts in an empty root in {:?}",
        started.elapsed()
    );
    assert!(String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")));
    let resolve = |host: &str| -> Result<String> {
        let out = run(&mut in_root(
            root.path(),
            &[],
            "/etcdfleet",
            &["resolve", host],
        ))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    assert_eq!(
        resolve("workload-api.hosts.test")?,
        "workload-api.hosts.test: 10.1.2.3"
    );
    assert_eq!(resolve("etcd-api.dns.test")?, "etcd-api.dns.test: 10.9.8.7");
    Ok(())
}

/// A one-member etcd 3.5 holding `restore/00..19`, snapshotted into a
/// directory store as `snap/1.db`: (store dir, size, SHA-256).
async fn snapshot(binary: &EtcdBinary, store: &Path) -> Result<(u64, String)> {
    let source = LocalEtcdCluster::start(ClusterOptions::new(1, binary.clone())).await?;
    let mut kv = ClusterClient::connect(&[source.member(0).client_url()], &source.etcd_config())
        .await?
        .kv();
    for i in 0..20 {
        kv.put(format!("restore/{i:02}"), "v", None).await?;
    }
    std::fs::create_dir_all(store.join("snap"))?;
    run(Command::new(&binary.etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", source.member(0).client_url()))
        .args(["snapshot", "save"])
        .arg(store.join("snap/1.db")))?;
    let destination = ObjectStoreDestination {
        path: Some(store.display().to_string()),
        ..Default::default()
    };
    Ok(Store::open(&destination, None)?
        .read_through::<tokio::io::Sink>("snap/1.db", None)
        .await?)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    run(Command::new("cp").arg("-a").arg(from).arg(to))?;
    Ok(())
}

/// Where the seeder's two init containers put things, as a pod's volumes:
/// the emptyDir they share and the member's data volume.
struct SeedPod {
    seeder_dir: std::path::PathBuf,
    data: std::path::PathBuf,
}

/// Runs the seeder's two init containers as a pod runs them, each in a root
/// of its own: `install-seeder` in a root that is the image's file system,
/// then `restore-seed` of `snap/1.db` from `destination` (JSON) in a bare
/// etcd image (`etcdutl` and nothing else: no libc, no shell, no CA bundle),
/// with `env` and `binds` besides the pod's volumes. Returns restore-seed's
/// output and how long each container took.
fn seed_in_bare_etcd(
    image: &BuiltImage,
    etcdutl: &Path,
    work: &Path,
    seed: (&str, u64, &str),
    env: &[(&str, &str)],
    binds: &[(&Path, &str)],
) -> Result<(SeedPod, Output, Duration, Duration)> {
    let (destination, size, sha) = seed;
    let pod = SeedPod {
        seeder_dir: work.join("emptydir"),
        data: work.join("data"),
    };
    std::fs::create_dir_all(&pod.seeder_dir)?;
    std::fs::create_dir_all(&pod.data)?;

    // 1. install-seeder, in a root that is the image's file system.
    let controller_root = work.join("controller-image");
    copy_dir(&image.rootfs(), &controller_root)?;
    let started = Instant::now();
    run(&mut in_root(
        &controller_root,
        &[(&pod.seeder_dir, "/opt/etcdfleet")],
        "/etcdfleet",
        &["install-seeder", "/opt/etcdfleet/etcdfleet"],
    ))?;
    let install_time = started.elapsed();

    // 2. restore-seed, in a bare etcd image: etcdutl and nothing else.
    let etcd_root = work.join("etcd-image");
    std::fs::create_dir_all(etcd_root.join("usr/local/bin"))?;
    std::fs::copy(etcdutl, etcd_root.join("usr/local/bin/etcdutl"))?;
    let size_arg = size.to_string();
    let mut volumes = vec![
        (&*pod.seeder_dir, "/opt/etcdfleet"),
        (&*pod.data, "/var/lib/etcd"),
    ];
    volumes.extend_from_slice(binds);
    let mut seed = in_root(
        &etcd_root,
        &volumes,
        "/opt/etcdfleet/etcdfleet",
        &[
            "restore-seed",
            "--destination",
            destination,
            "--object-key",
            "snap/1.db",
            "--sha256",
            sha,
            "--size-bytes",
            &size_arg,
            "--data-dir",
            "/var/lib/etcd/data",
            "--name",
            "m0",
            "--initial-cluster",
            "m0=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-cluster-token",
            "image-test",
            "--initial-cluster-state",
            "new",
            "--restore-tool",
            "etcdutl",
        ],
    );
    seed.envs(env.iter().copied());
    let started = Instant::now();
    let out = run(&mut seed)?;
    Ok((pod, out, install_time, started.elapsed()))
}

/// What a seeded member's data volume holds after a restore of `sha`.
fn assert_restored(pod: &SeedPod, out: &Output, sha: &str) -> Result<()> {
    assert!(String::from_utf8_lossy(&out.stdout).contains("Restored"));
    assert!(pod.data.join("data/member/snap/db").is_file());
    assert_eq!(
        std::fs::read_to_string(pod.data.join("data.etcdfleet-restored-from"))?,
        sha
    );
    Ok(())
}

#[tokio::test]
async fn the_seeder_runs_from_the_image_inside_a_bare_etcd_image() -> Result<()> {
    let Some(image) = require_image() else {
        return Ok(());
    };
    let Some(etcd) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    let etcdutl = etcd.etcdutl.clone().context("etcd 3.5 has etcdutl")?;
    let work = tempfile::tempdir()?;
    let store = work.path().join("store");
    let (size, sha) = snapshot(&etcd, &store).await?;
    let (pod, out, install_time, seed_time) = seed_in_bare_etcd(
        &image,
        &etcdutl,
        work.path(),
        (r#"{"path":"/snapshots"}"#, size, &sha),
        &[],
        &[(&store, "/snapshots")],
    )?;
    eprintln!(
        "seeder from the image: install-seeder {install_time:?}, restore-seed {seed_time:?} \
         ({size} byte snapshot)\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_restored(&pod, &out, &sha)
}

/// The seeder's S3 client in an etcd image that has no CA bundle: a
/// plain-HTTP endpoint speaks no TLS, so the client is built without the
/// system's CA certificates instead of failing to build ("builder error").
#[tokio::test]
async fn the_seeder_fetches_over_plain_http_in_an_etcd_image_without_ca_certificates() -> Result<()>
{
    let Some(image) = require_image() else {
        return Ok(());
    };
    let Some(etcd) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    let etcdutl = etcd.etcdutl.clone().context("etcd 3.5 has etcdutl")?;
    let work = tempfile::tempdir()?;
    let local = work.path().join("store");
    let (size, sha) = snapshot(&etcd, &local).await?;
    s3.create_bucket("seeds")?;
    let mut destination = s3.destination("seeds", "unused");
    destination.prefix = None;
    destination.credentials_secret_name = None;
    let credentials = Credentials {
        access_key_id: ACCESS_KEY_ID.into(),
        secret_access_key: SECRET_ACCESS_KEY.into(),
        session_token: None,
    };
    Store::open(&destination, Some(&credentials))?
        .put_small("snap/1.db", std::fs::read(local.join("snap/1.db"))?)
        .await?;
    let (pod, out, _, seed_time) = seed_in_bare_etcd(
        &image,
        &etcdutl,
        work.path(),
        (&serde_json::to_string(&destination)?, size, &sha),
        &[
            (ENV_ACCESS_KEY_ID, ACCESS_KEY_ID),
            (ENV_SECRET_ACCESS_KEY, SECRET_ACCESS_KEY),
        ],
        &[],
    )?;
    eprintln!("seeder over plain HTTP with no CA bundle: restore-seed {seed_time:?}");
    assert_restored(&pod, &out, &sha)
}

/// A restoring cluster as the controller holds it (`status.restore`).
const RESTORING: &str = "apiVersion: etcdfleet.dev/v1beta1
kind: EtcdCluster
metadata: {name: restored, namespace: team-a, uid: 0b5e7c1e-0000-4000-8000-000000000004}
spec:
  clusterRef: {name: restored}
  version: 3.5.21
  replicas: 3
  workloadNamespace: etcd-system
  storage: {size: 1Gi}
  tls: {enabled: true}
  bootstrap:
    restore: {backupName: nightly}
status:
  restore:
    backupName: nightly
    destination: {bucket: backups}
    objectKey: team-a/restored/1.db
    sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    seederImage: etcdfleet/controller:v0.2.0
";

/// The `install-seeder` init container runs in the seeder image (this
/// one): its program must be a file there, found as a container runtime
/// finds it. The image sets no `PATH`, so it must be an absolute path.
#[test]
fn the_seeder_command_the_controller_renders_is_a_program_of_the_image() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let Some(image) = require_image() else {
        return Ok(());
    };
    let cluster: EtcdCluster = etcdfleet_api::yaml::from_str(RESTORING)?;
    let resolution = resolve_own_spec(&cluster.spec)?;
    let inputs = render_inputs(&cluster, &resolution);
    let sts = render::statefulset(&inputs, &RenderProfile::default(), 3);
    let pod = sts.spec.template.spec.context("a pod spec")?;
    let install = pod
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "install-seeder")
        .context("a restoring member has install-seeder")?;
    let program = install.command.unwrap_or_default().remove(0);

    let reference = format!("oci:{}:{}", image.layout().display(), image.tag);
    let config = json_of(Command::new("skopeo").args(["inspect", "--config", &reference]))?;
    let env = config["config"]["Env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !env.iter()
            .any(|e| e.as_str().is_some_and(|e| e.starts_with("PATH="))),
        "the image sets a PATH now: {env:?}"
    );
    assert!(
        program.starts_with('/'),
        "install-seeder runs {program:?} by name, but the image sets no PATH"
    );
    let file = image.rootfs().join(program.trim_start_matches('/'));
    let mode = std::fs::metadata(&file)
        .with_context(|| format!("{program} is not in the image"))?
        .permissions()
        .mode();
    assert!(
        file.is_file() && mode & 0o111 != 0,
        "{program}: mode {mode:o}"
    );
    Ok(())
}

#[test]
fn the_test_world_runs_the_seeder_and_the_controller_from_the_image() {
    let Some(image) = require_image() else {
        return;
    };
    let table = ImageTable::installed();
    for reference in [SEEDER_IMAGE.to_string(), image.reference()] {
        assert_eq!(
            table.resolve_command(&reference, "etcdfleet"),
            Some(image.rootfs_binary()),
            "{reference}"
        );
    }
    // And the controller's Deployment (the image's entrypoint) in the real
    // tier's management cluster.
    assert_eq!(
        table.resolve(&image.reference()),
        Some(image.rootfs_binary())
    );
    assert_eq!(BuiltImage::locate().tag, image.tag);
}
