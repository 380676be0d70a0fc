pub mod connector;
pub mod crd;
pub mod dialer;
pub mod etcd;
pub mod etcdcluster;
pub mod metrics;
pub mod pki;
pub mod render;
