
pub mod etcd;
pub mod pki;
pub mod connector;
pub mod dialer;
