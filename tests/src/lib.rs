pub mod apiserver;
pub mod demo;
pub mod driver;
pub mod etcd_harness;
pub mod fleet;
pub mod runtime;
pub mod scenario;
pub mod ssa;
