pub mod etcd_harness;
pub mod fleet;
pub mod runtime;
