//! The etcd version a snapshot was written by, read from the snapshot itself
//! while the restore check streams it through SHA-256: no second read, no
//! temporary file, and memory bounded by a few pages whatever the size.
//!
//! A snapshot is etcd's bbolt database file (`snapshot save` appends a
//! 32-byte SHA-256 after it). etcd keeps the cluster version (`MAJOR.MINOR.0`,
//! the minor every member agreed on) under the key `clusterVersion` of the
//! bucket `cluster`; 3.4 and 3.5 both write it (seen in snapshots of 3.4.23
//! and 3.5.1). `etcdutl snapshot status` of 3.5 does not print it, and the
//! controller has no etcd tools on the management side, so the few pages
//! needed are read here.
//!
//! The bbolt layout relied on (go.etcd.io/bbolt, file format 2, little
//! endian): page `i` starts at `i` × page size with a 16-byte header (id u64,
//! flags u16, count u16, overflow u32). Pages 0 and 1 are meta pages: after
//! the header come magic `0xED0CDAED`, version 2, page size, flags, the root
//! bucket (root page u64, sequence u64), freelist, high-water page, txid and
//! an FNV-1a 64 checksum of the 56 bytes before it; the valid one with the
//! higher txid is current. A leaf page (flag 0x02) holds `count` 16-byte
//! elements (flags u32, pos u32, key size u32, value size u32); the key
//! starts `pos` bytes after its element and the value follows it. Element
//! flag 0x01 marks a bucket: its value starts with a bucket header (root page
//! u64, sequence u64) and, when the root is 0, an inline page follows it.
//! The root bucket of etcd's database (a dozen buckets) is one leaf page;
//! its `cluster` bucket (one or two small keys) is inline. Pages freed by
//! older transactions stay in the file, so only the pages the current meta
//! leads to are trusted.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use etcdfleet_api::restore::SnapshotVersion;
use tokio::io::AsyncWrite;

const MAGIC: u32 = 0xED0C_DAED;
const FORMAT_VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BUCKET_HEADER: usize = 16;
const META_CHECKSUMMED: usize = 56;
const LEAF_PAGE: u16 = 0x02;
const BUCKET_ELEMENT: u32 = 0x01;
const CLUSTER_BUCKET: &[u8] = b"cluster";
const CLUSTER_VERSION_KEY: &[u8] = b"clusterVersion";
/// The root page of the root bucket is kept whole up to this size.
const MAX_ROOT_BYTES: usize = 1 << 20;
/// Leaf pages holding a `clusterVersion` key remembered, in case the
/// `cluster` bucket is not inline (stale copies included).
const MAX_CANDIDATES: usize = 4096;

/// Reads a snapshot as it streams by (an [`AsyncWrite`] sink that never
/// fails or blocks), then [`finish`](Self::finish) says what it found.
#[derive(Debug, Default)]
pub struct SnapshotScanner {
    /// Bytes seen so far.
    offset: u64,
    page_size: usize,
    /// The page being filled.
    page: Vec<u8>,
    /// (txid, root page) of each valid meta page.
    metas: [Option<(u64, u64)>; 2],
    /// The root bucket's root page, as the current meta says.
    root: Option<u64>,
    /// The root bucket's root page (with its overflow pages), once read.
    root_page: Vec<u8>,
    root_bytes_wanted: usize,
    /// Leaf pages with a `clusterVersion` key: page id → value.
    candidates: BTreeMap<u64, Vec<u8>>,
    failed: Option<String>,
}

impl SnapshotScanner {
    /// Feeds the next bytes of the snapshot.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.failed.is_none() {
            let want = if self.page_size == 0 {
                PAGE_HEADER + META_CHECKSUMMED + 8
            } else {
                self.page_size
            };
            let take = (want - self.page.len()).min(bytes.len());
            self.page.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            self.offset += take as u64;
            if self.page.len() < want {
                return;
            }
            if self.page_size == 0 {
                self.learn_page_size();
            } else {
                // The buffer is reused for the next page: no allocation per page.
                let page = std::mem::take(&mut self.page);
                self.page_done(&page);
                self.page = page;
                self.page.clear();
            }
        }
    }

    /// What the snapshot says, once every byte was fed.
    pub fn finish(&self) -> SnapshotVersion {
        if let Some(why) = &self.failed {
            return SnapshotVersion::Unreadable(why.clone());
        }
        if self.root_bytes_wanted == 0 || self.root_page.len() < self.root_bytes_wanted {
            return SnapshotVersion::Unreadable(format!(
                "the database ends after {} bytes, before its root page",
                self.offset
            ));
        }
        let Some(cluster) = leaf_lookup(&self.root_page, CLUSTER_BUCKET, true) else {
            return SnapshotVersion::NotRecorded;
        };
        if cluster.len() < BUCKET_HEADER {
            return SnapshotVersion::Unreadable("the cluster bucket header is cut short".into());
        }
        let value = match u64_at(cluster, 0) {
            0 => leaf_lookup(&cluster[BUCKET_HEADER..], CLUSTER_VERSION_KEY, false),
            page => match self.candidates.get(&page) {
                Some(v) => Some(v.as_slice()),
                None => {
                    return SnapshotVersion::Unreadable(format!(
                        "the cluster bucket's page {page} holds no cluster version"
                    ));
                }
            },
        };
        match value.map(|v| String::from_utf8_lossy(v).into_owned()) {
            Some(v) if !v.is_empty() => SnapshotVersion::Recorded(v),
            _ => SnapshotVersion::NotRecorded,
        }
    }

    fn fail(&mut self, why: impl Into<String>) {
        self.failed.get_or_insert_with(|| why.into());
    }

    /// The first bytes hold meta page 0: its page size sizes every page.
    fn learn_page_size(&mut self) {
        let head = std::mem::take(&mut self.page);
        if u32_at(&head, PAGE_HEADER) != MAGIC || u32_at(&head, PAGE_HEADER + 4) != FORMAT_VERSION {
            return self.fail("not a bbolt database (etcd's snapshot format): no bbolt magic");
        }
        let size = u32_at(&head, PAGE_HEADER + 8) as usize;
        if !size.is_power_of_two() || !(512..=65536).contains(&size) {
            return self.fail(format!("implausible bbolt page size {size}"));
        }
        self.page_size = size;
        self.page = head;
    }

    fn page_done(&mut self, page: &[u8]) {
        let index = self.offset / self.page_size as u64 - 1;
        if index < 2 {
            self.metas[index as usize] = meta(page);
            return;
        }
        let root = match self.root {
            Some(root) => root,
            None => match self.metas.iter().flatten().max() {
                Some(&(_, root)) if root >= 2 => *self.root.insert(root),
                Some(&(_, root)) => return self.fail(format!("the root bucket is at page {root}")),
                None => return self.fail("neither bbolt meta page is valid"),
            },
        };
        if index == root {
            let overflow = u32_at(page, 12) as usize;
            self.root_bytes_wanted = ((overflow + 1) * self.page_size).min(MAX_ROOT_BYTES);
        }
        if self.root_page.len() < self.root_bytes_wanted {
            self.root_page.extend_from_slice(page);
            self.root_page.truncate(self.root_bytes_wanted);
        }
        if u64_at(page, 0) == index
            && self.candidates.len() < MAX_CANDIDATES
            && let Some(v) = leaf_lookup(page, CLUSTER_VERSION_KEY, false)
        {
            self.candidates.insert(index, v.to_vec());
        }
    }
}

impl AsyncWrite for SnapshotScanner {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().feed(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// (txid, root page) of a valid meta page.
fn meta(page: &[u8]) -> Option<(u64, u64)> {
    let m = page.get(PAGE_HEADER..PAGE_HEADER + META_CHECKSUMMED + 8)?;
    let valid = u32_at(m, 0) == MAGIC
        && u32_at(m, 4) == FORMAT_VERSION
        && fnv1a64(&m[..META_CHECKSUMMED]) == u64_at(m, META_CHECKSUMMED);
    valid.then(|| (u64_at(m, 48), u64_at(m, 16)))
}

/// The value under `key` in a leaf page (or inline page), if it holds one
/// of the wanted kind (a bucket or a plain value).
fn leaf_lookup<'a>(page: &'a [u8], key: &[u8], bucket: bool) -> Option<&'a [u8]> {
    if page.len() < PAGE_HEADER || u16_at(page, 8) != LEAF_PAGE {
        return None;
    }
    let count = u16_at(page, 10) as usize;
    (0..count).find_map(|i| {
        let at = PAGE_HEADER + i * ELEMENT;
        let element = page.get(at..at + ELEMENT)?;
        let is_bucket = u32_at(element, 0) & BUCKET_ELEMENT != 0;
        let start = at + u32_at(element, 4) as usize;
        let key_end = start + u32_at(element, 8) as usize;
        let value_end = key_end + u32_at(element, 12) as usize;
        (is_bucket == bucket && page.get(start..key_end)? == key)
            .then(|| page.get(key_end..value_end))
            .flatten()
    })
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| {
        u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
    })
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
