#!/usr/bin/env bash
# After a failed `make test`: says so when the disk the build writes to is
# (nearly) full, so the end of the log names the cause instead of leaving a
# compiler's or a test's "No space left on device" somewhere above it.
# A cold `make test` writes about 11 GiB: target/ (the test build, 6–8 GiB
# with incremental artifacts), the static image build (0.8 GiB) and the
# previous release's build in ~/.cache/etcdfleet/releases (2.2 GiB).
set -u
dir=${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target}
mkdir -p "$dir" 2>/dev/null || dir=.
free_kib=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
free_gib=$((free_kib / 1024 / 1024))
if [ "$free_gib" -lt 4 ]; then
  echo "make test: only ${free_gib} GiB free where $dir is: the failure above is probably a full disk (a cold run writes about 11 GiB; see hack/disk-hint.sh)" >&2
fi
