//! How restore drills run (the controller's configuration) and the slots
//! that bound how many run at once in one controller.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

/// How drills run (the controller's configuration, `drills`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrillSettings {
    /// The image `install-seeder` runs from (the controller's own).
    pub seeder_image: String,
    /// Drills running at once in this controller, across the fleet.
    pub max_concurrent: usize,
    /// A drill whose etcd has not served a read by then ends as an error
    /// (its pod could not be scheduled, its image not pulled, ...).
    pub timeout: Duration,
    /// Keys read back whole from the restored etcd.
    pub sample_keys: i64,
}

impl Default for DrillSettings {
    fn default() -> Self {
        DrillSettings {
            seeder_image: crate::config::DEFAULT_SEEDER_IMAGE.to_string(),
            max_concurrent: 2,
            timeout: Duration::from_secs(15 * 60),
            sample_keys: 100,
        }
    }
}

/// The clusters (`namespace/name`) with a drill this process runs. New
/// drills start while fewer than `max_concurrent` run; a drill found
/// running (after a restart) is counted whatever the bound.
#[derive(Default)]
pub struct DrillSlots {
    running: Mutex<HashSet<String>>,
}

impl DrillSlots {
    /// Takes a slot for `key`; `Err(running)` when all are taken.
    pub(super) fn start(&self, key: &str, max: usize) -> std::result::Result<(), usize> {
        let mut running = self.running.lock().expect("drill slots");
        if running.contains(key) || running.len() < max {
            running.insert(key.to_string());
            Ok(())
        } else {
            Err(running.len())
        }
    }
    pub(super) fn holds(&self, key: &str) {
        self.running
            .lock()
            .expect("drill slots")
            .insert(key.to_string());
    }
    pub(super) fn end(&self, key: &str) {
        self.running.lock().expect("drill slots").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_drills_run_at_once_and_a_cluster_keeps_its_own_slot() {
        let slots = DrillSlots::default();
        assert_eq!(slots.start("ns/a", 2), Ok(()));
        assert_eq!(slots.start("ns/b", 2), Ok(()));
        assert_eq!(slots.start("ns/c", 2), Err(2));
        // A cluster already drilling is not a new drill.
        assert_eq!(slots.start("ns/a", 2), Ok(()));
        slots.end("ns/a");
        assert_eq!(slots.start("ns/c", 2), Ok(()));
        // A drill found running after a restart counts, whatever the bound.
        slots.holds("ns/d");
        assert_eq!(slots.start("ns/a", 2), Err(3));
        slots.end("ns/b");
        slots.end("ns/c");
        assert_eq!(slots.start("ns/a", 2), Ok(()));
    }
}
