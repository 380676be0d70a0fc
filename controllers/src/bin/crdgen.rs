fn main() {
    use kube::CustomResourceExt;
    for crd in [etcdfleet_api::EtcdCluster::crd(), etcdfleet_api::EtcdTemplate::crd(), etcdfleet_api::ClusterEtcdTemplate::crd()] {
        println!("---\n{}", serde_yaml::to_string(&crd).unwrap());
    }
}
