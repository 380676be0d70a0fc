// Command coredns is CoreDNS with only the plugins the real nodes' cluster
// DNS uses (tests/src/real_node/dns.rs writes its Corefile): `bind` puts it
// on the plane's DNS address, `kubernetes`
// answers the cluster zone from a workload API server, `errors` and `log`
// put failures and queries into the test's log. Linking the plugins by
// name, not CoreDNS's whole plugin list, keeps the build to a few minutes.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func main() {
	coremain.Run()
}
