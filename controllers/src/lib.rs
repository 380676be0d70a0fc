pub mod connector;
pub mod crd;
pub mod dialer;
pub mod etcd;
pub mod pki;
pub mod render;
