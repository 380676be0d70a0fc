
pub mod etcd;
pub mod pki;
