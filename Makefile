# The two commands: `make test` (installs what the suite needs, then runs it)
# and `make demo` (a management cluster and three workload clusters, in-process).
SHELL := /bin/bash
export ETCDFLEET_REQUIRE_ETCD ?= 1

.PHONY: test prerequisites test-build tools rust-tools structure image previous-release lint crds demo bench bench-fleet bench-backup fresh-machine-check test-portforward test-kubernetes-oldest pins

tools:
	./hack/install-tools.sh

# cargo-nextest (the test runner) is installed with `cargo install` when
# missing, optimized less than a release build (opt-level 1, many codegen
# units) so that a fresh machine builds it sooner; a test runner needs no more.
rust-tools:
	@command -v cargo-nextest >/dev/null 2>&1 || \
	  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 \
	  cargo install --locked cargo-nextest

# The controller image: a static etcdfleet binary alone in an OCI image
# layout (FROM scratch, written by umoci), tagged v<workspace version>, in
# target/image/oci. See hack/build-image.sh.
image: tools
	./hack/build-image.sh || { status=$$?; ./hack/disk-hint.sh; exit $$status; }

# The previous release's binary (CHANGELOG.md), built from its commit in a
# worktree and cached by commit, for the upgrade test.
previous-release: tools
	./hack/build-release.sh previous

# The test binaries, as `cargo nextest run` builds them (it then finds them
# built).
test-build: tools
	cargo test --workspace --all-targets --no-run --quiet

# Everything the suite needs, two recipes at a time (a fresh machine spends
# much of the tool install waiting on downloads, and a build's last crates
# use one core), each recipe's output printed when it ends.
prerequisites: tools rust-tools image previous-release test-build

# nextest runs every test (unit, integration, end to end, the real
# control-plane tier) each in its own process, so a test's etcd and
# Kubernetes processes never outlive it. The crates have no doc tests.
# The image and the previous release are built first: the image test, the
# seeder of every restore and the upgrade test use them.
# On failure hack/disk-hint.sh says so when the disk is (nearly) full.
test: structure
	$(MAKE) --no-print-directory -j2 --output-sync=target prerequisites
	cargo nextest run --workspace --all-targets --no-fail-fast || { status=$$?; ./hack/disk-hint.sh; exit $$status; }

# The lifecycle and version suites with the controller reaching etcd only
# through pods/portforward tunnels (the production default dialer).
test-portforward: tools rust-tools
	ETCDFLEET_DIALER=portForward cargo nextest run --workspace --test e2e_lifecycle --test e2e_versions --test portforward --no-fail-fast

# The real control-plane tier (tests/tests/real_*.rs) on the oldest
# Kubernetes minor the project supports (hack/upstream/kubernetes-oldest).
test-kubernetes-oldest: tools rust-tools
	./hack/upstream/build.sh kubernetes-oldest
	ETCDFLEET_KUBERNETES_DIR=$(CURDIR)/.tools/kubernetes-oldest cargo nextest run --workspace --no-fail-fast -E 'binary(/^real_/)'

# The project's own bounds, in seconds and without a build: no function
# outside tests over 120 lines and no file over 1,000 lines before its tests
# (hack/check-bounds.py), no import circle between the files of a crate
# (hack/check-imports.py), and no test that asserts only inside a condition
# that may be false (hack/check-test-asserts.py). The bounds and the circles
# are checked in the controllers, the API types and the test harness
# (tests/src) alike. Part of `lint` and `test`.
structure:
	python3 hack/check-bounds.py controllers/src api/src etcd/src tests/src
	python3 hack/check-imports.py controllers/src api/src etcd/src tests/src
	python3 hack/check-test-asserts.py .

lint: structure
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

crds:
	cargo run -q -p etcdfleet-controllers --bin crdgen -- --out config/crd

demo: tools
	cargo run -q -p etcdfleet-tests --bin demo

bench: tools
	cargo bench -p etcdfleet-tests --bench scale_out
	cargo bench -p etcdfleet-tests --bench reconcile
	cargo bench -p etcdfleet-tests --bench operations

# Removes what `make test` installs (Debian packages, .tools/), then runs
# .ci/run in a fresh clone with an empty target dir: the install step from
# scratch. Changes the machine; see the script's header.
fresh-machine-check:
	./hack/fresh-machine-check.sh

# Peak RSS of the backup path streaming a >= 512 MiB snapshot (prints the figure).
# The `etcdfleet run` process (release build) carrying a fleet through
# port-forward, in a test world built with optimizations too (it shares the
# two cores with the controller it measures): first 20 three-member clusters
# on real etcd, then 2,000 one-member clusters on the etcd stand-in
# (controller cost only), then the same 2,000 with a real kube-apiserver as
# the management cluster (its calls counted from its audit log; its peak RSS
# and CPU measured too). The stand-in runs fail over the budget (resync
# 10 s, peak RSS 300 MiB, any write in a converged reconcile). Each prints
# resync time, peak RSS, API calls per converged reconcile and RSS with
# 200 x 500 KB Secrets; the stand-in runs also a rollout's planning time
# and API calls per wave. The last lines are `fleet clusters=...` and
# `fleet_real_api clusters=...`.
bench-fleet: tools
	cargo build --release -p etcdfleet-controllers --bin etcdfleet
	ETCDFLEET_BENCH_ETCD=real ETCDFLEET_BINARY=$(CURDIR)/target/release/etcdfleet cargo bench -p etcdfleet-tests --bench fleet
	ETCDFLEET_BENCH_ETCD=standin ETCDFLEET_BINARY=$(CURDIR)/target/release/etcdfleet cargo bench -p etcdfleet-tests --bench fleet
	ETCDFLEET_BENCH_ETCD=standin ETCDFLEET_BENCH_MANAGEMENT=real ETCDFLEET_BINARY=$(CURDIR)/target/release/etcdfleet cargo bench -p etcdfleet-tests --bench fleet

bench-backup: tools
	cargo test --workspace --test backup_memory -- --ignored --nocapture streaming_a_large_snapshot

# Every version pin (hack/upstream, PyPI and Debian etcds, the Kubernetes
# client crates) next to the newest its registry serves; reads registries,
# not part of `make test`.
pins:
	python3 hack/pins.py
