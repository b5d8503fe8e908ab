package legacy

import (
	"context"
	"maps"
	"testing"
)

// kubeProxyNFT has the shape of kube-proxy v1.36's nftables-mode table in the parts
// ProgrammedServices reads (upstream pkg/proxy/nftables; testdata/nft is its real
// output): ns1/web has endpoints (its cluster IP goes to its service- chain; its
// load-balancer IP to its external- chain), ns1/local has internalTrafficPolicy Local
// (its local- chain), ns1/noep has none (reject), and ns1/nolocal has endpoints but none
// local for its load-balancer IP (drop).
const kubeProxyNFT = `table ip kube-proxy {
	comment "rules for kube-proxy"
	chain reject-chain {
		reject
	}
	chain service-ULMVA6XW-ns1/web/tcp/http {
	}
	chain local-ULMVA6XW-ns1/local/tcp/http {
	}
	chain external-ULMVA6XW-ns1/web/tcp/http {
	}
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-ns1/web/tcp/http,
			     192.0.2.10 . tcp . 80 : goto external-ULMVA6XW-ns1/web/tcp/http,
			     10.96.0.11 . tcp . 80 : goto local-ULMVA6XW-ns1/local/tcp/http }
	}
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
		elements = { 10.96.0.12 . tcp . 80 comment "ns1/noep:http" : goto reject-chain,
			     192.0.2.13 . tcp . 80 comment "ns1/nolocal:http" : drop }
	}
}
table ip6 kube-proxy {
	chain reject-chain {
		reject
	}
	map service-ips {
		type ipv6_addr . inet_proto . inet_service : verdict
	}
	map no-endpoint-services {
		type ipv6_addr . inet_proto . inet_service : verdict
		elements = { fd00:96::12 . tcp . 80 comment "ns1/v6noep" : goto reject-chain }
	}
}
`

// TestKernelProgrammedServicesNFT: in nftables mode, ProgrammedServices reads kube-proxy's
// maps with the real nft, in the namespace it runs in, and leaves shardproxy's and
// iptables' tables out.
func TestKernelProgrammedServicesNFT(t *testing.T) {
	tp := kernelTopology(t)
	if err := tp.NFT(tp.Node, ourTable+kubeProxyNFT); err != nil {
		t.Fatal(err)
	}
	var got map[string]ServiceRules
	err := tp.Do(tp.Node, func() (err error) {
		got, err = ProgrammedServices(context.Background(), RealExec{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]ServiceRules{
		"ns1/web":    {Endpoints: true},
		"ns1/local":  {Endpoints: true},
		"ns1/noep":   {NoEndpoints: true},
		"ns1/v6noep": {NoEndpoints: true},
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
