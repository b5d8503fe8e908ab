package cluster

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/shardproxy/shardproxy/test/controlplane"
)

// startControlPlane runs etcd and kube-apiserver inside the first node's namespace (a
// control-plane node), on all of its IPv4 addresses, advertising the node's (a routable
// address: the kubernetes Service's endpoint, and in the serving certificate, which pods
// verify), with a Service CIDR of each family.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	first := c.Nodes[0]
	cp, stop, err := controlplane.StartProcess(ctx, controlplane.Options{
		Netns: first.NS, Dial: c.Dialer(first.NS),
		BindAddress: "0.0.0.0", AdvertiseAddress: first.IP,
		ServiceCIDRs: ServiceCIDRs,
		// The node's name resolves nowhere: reach kubelets (logs, exec) by address.
		ExtraAPIServerArgs: []string{"--kubelet-preferred-address-types=InternalIP"},
		Progress:           c.opts.Logf,
	})
	c.CP, c.stopCP = cp, stop
	if err != nil {
		return err
	}
	c.Client = cp.Client()
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	return controlplane.WriteKubeconfig(c.Kubeconfig, c.apiServer(), "admin", cp.AdminToken)
}

// startControllers runs kube-controller-manager (EndpointSlices, Deployments,
// DaemonSets, node CIDRs, the root CA ConfigMap pods mount) and kube-scheduler, with the
// admin credentials and no serving port of their own.
func (c *Cluster) startControllers(context.Context) error {
	certs := filepath.Join(c.CP.Dir, "certs")
	if _, err := c.startChild("kube-controller-manager", c.Bins["kube-controller-manager"],
		"--kubeconfig="+c.Kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		// The CA pods trust: kube-apiserver's self-signed serving certificate, which
		// carries its CA (kube-root-ca.crt; in-cluster clients verify against it).
		"--root-ca-file="+filepath.Join(certs, "apiserver.crt"),
		"--service-account-private-key-file="+filepath.Join(c.CP.Dir, "service-account.key"),
		"--allocate-node-cidrs=true",
		"--cluster-cidr="+strings.Join(ClusterCIDRs, ","),
		"--node-cidr-mask-size-ipv4=24",
		"--node-cidr-mask-size-ipv6=64",
		"--service-cluster-ip-range="+strings.Join(ServiceCIDRs, ","),
		"--controllers=*,-cloud-node-lifecycle,-service-lb-controller,-route",
		"--v=1",
	); err != nil {
		return err
	}
	_, err := c.startChild("kube-scheduler", c.Bins["kube-scheduler"],
		"--kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=10259",
		"--v=1",
	)
	return err
}
