package fromkubeproxy

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

// ipvsSchedulers maps IPVS schedulers to the load-balancing modes that pick alike; ""
// is IPVS's default, rr.
var ipvsSchedulers = map[string]string{"": "roundRobin", "rr": "roundRobin", "sh": "sourceHash", "mh": "consistentHash"}

// Upstream kube-proxy's defaults (pkg/proxy/apis/config/v1alpha1, v1.36) for fields a
// configuration may leave at their zero value, as kubeadm's does.
const (
	defaultMode          = "iptables"
	defaultHealthzPort   = 10256
	defaultMetricsPort   = 10249
	defaultHealthzHost   = "0.0.0.0"
	defaultMetricsHost   = "127.0.0.1"
	defaultMasqueradeBit = 14
	defaultSyncPeriod    = 30 * time.Second
	defaultMinSync       = time.Second
	defaultDetectLocal   = "ClusterCIDR"
	// kubeletDropBit is the kubelet's KUBE-MARK-DROP bit: never a masquerade bit.
	kubeletDropBit = 15
)

// AlongsidePortOffset moves shardproxy's health and metrics ports off kube-proxy's when
// both run on a node (the alongside overlay's 10356 and 10349).
const AlongsidePortOffset = 100

// Options tune Convert.
type Options struct {
	// Alongside writes a configuration to run beside this kube-proxy for a staged
	// migration rather than instead of it: no default instance (kube-proxy keeps the
	// unlabeled Services), one instance serving the proxy name "shardproxy", its own ports
	// and masquerade bit, and the conntrack sysctls left to kube-proxy.
	Alongside bool
	// Namespaces are the namespaces the alongside instance serves (default: "default").
	Namespaces []string
	// Source says where the configuration came from, for the header comment.
	Source string
	// APIServer is the API server URL kube-proxy's kubeconfig names (APIServer reads
	// it from kubeadm's ConfigMap), "" when unknown. Without kube-proxy the supervisor
	// must reach it directly: the replace overlay's apiserver-endpoint.yaml.
	APIServer string
}

// Endpoint is the host and port of an API server URL, as the replace overlay's
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT take them.
func Endpoint(server string) (host, port string, err error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("API server %q: not a URL with a host", server)
	}
	host, port = u.Hostname(), u.Port()
	if port == "" {
		port = "443"
	}
	return host, port, nil
}

// converter collects the output, the notes on what is not carried, and what it changed
// so that the shipped overlays (deploy/) can run it.
type converter struct {
	kp      *kpv1alpha1.KubeProxyConfiguration
	opts    Options
	mode    string
	notes   []string
	changes []string
}

// change records what the output does differently from kube-proxy's configuration for
// the overlays' sake, and why.
func (c *converter) change(format string, args ...any) {
	c.changes = append(c.changes, fmt.Sprintf(format, args...))
}

// note records a setting the output does not carry, and why.
func (c *converter) note(field string, value any, why string) {
	c.notes = append(c.notes, fmt.Sprintf("%s: %v: %s", field, value, why))
}

// Convert returns the shardproxy configuration file, YAML with comments, that behaves as
// kp does. Its header lists every setting of kp it cannot carry, each with why. The
// result passes shardproxy's own validation; an error means kp itself is unusable.
func Convert(kp *kpv1alpha1.KubeProxyConfiguration, opts Options) ([]byte, error) {
	c := &converter{kp: kp, opts: opts, mode: string(kp.Mode)}
	if c.mode == "" {
		c.mode = defaultMode
	}
	switch c.mode {
	case "iptables", "ipvs", "nftables":
	default:
		return nil, fmt.Errorf("mode %q: shardproxy runs on Linux nodes and replaces the iptables, ipvs and nftables modes only", c.mode)
	}
	if c.mode == "ipvs" && opts.Alongside {
		return nil, errors.New("mode ipvs: shardproxy does not run beside kube-proxy in IPVS mode, which takes Service traffic in the INPUT path " +
			"outside the nat-hook order a gapless handover relies on (docs/design.md, \"Out of scope\"); convert without --alongside to replace it")
	}
	root, err := c.root()
	if err != nil {
		return nil, err
	}
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root.n}, HeadComment: c.header()}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("writing the configuration: %w", err)
	}
	out := []byte(b.String())
	if err := validate(out); err != nil {
		return nil, err
	}
	return out, nil
}

// validate checks the output as `shardproxy check` would, with a placeholder node name
// (the DaemonSet gives it through $NODE_NAME).
func validate(out []byte) error {
	cfg, err := config.Decode(out, "converted")
	if err != nil {
		return fmt.Errorf("the converted configuration does not decode: %w", err)
	}
	cfg.DefaultWith(func(string) string { return "node" }, nil)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("the converted configuration is not valid: %w", err)
	}
	return nil
}

// header is the comment above the configuration.
func (c *converter) header() string {
	how := "to run instead of kube-proxy: one default instance serves every Service as it did"
	if c.opts.Alongside {
		how = "to run beside kube-proxy (--alongside): kube-proxy keeps the unlabeled Services,\n" +
			"the instance \"migration\" serves those labeled service.kubernetes.io/service-proxy-name: shardproxy"
	}
	lines := []string{
		"shardproxy configuration converted by `shardproxy config from-kube-proxy` from",
		fmt.Sprintf("kube-proxy's configuration (%s, mode %s), %s.", orDefault(c.opts.Source, "input"), c.mode, how),
		"Check it on a node with `shardproxy check --config FILE`.",
	}
	if c.mode != "nftables" {
		lines = append(lines, fmt.Sprintf("shardproxy programs nftables where kube-proxy's %s mode programmed %s: Services behave the same.",
			c.mode, map[string]string{"iptables": "iptables", "ipvs": "IPVS"}[c.mode]))
	}
	if len(c.changes) > 0 {
		lines = append(lines, "", "Changed so that deploy/'s overlays can run it:")
		for _, ch := range c.changes {
			lines = append(lines, "- "+ch)
		}
	}
	if len(c.notes) == 0 {
		lines = append(lines, "", "Every setting of the kube-proxy configuration is carried over.")
	} else {
		lines = append(lines, "", "Not carried over, and why:")
		for _, n := range c.notes {
			lines = append(lines, "- "+n)
		}
	}
	return commentLines(lines...)
}

// root builds the top-level mapping.
func (c *converter) root() (*mapNode, error) {
	kp := c.kp
	root := newMap()
	root.set("apiVersion", config.APIVersion, "")
	root.set("kind", config.Kind, "")
	if kp.HostnameOverride != "" {
		root.set("nodeName", kp.HostnameOverride, commentLines("From hostnameOverride: one node's name. In a DaemonSet leave it out; $NODE_NAME names each node."))
	}
	if kc := kp.ClientConnection.Kubeconfig; kc != "" {
		c.change("clientConnection.kubeconfig %s is left out: it is a file of kube-proxy's pod (kubeadm mounts it from its ConfigMap), "+
			"which shardproxy's DaemonSet does not mount; the supervisor uses its own ServiceAccount (in-cluster), which deploy/'s RBAC grants.", kc)
	}
	if !c.opts.Alongside {
		c.apiServer()
	}
	if cc := c.clientConnection(); cc != nil {
		root.set("clientConnection", cc, commentLines("From clientConnection."))
	}
	for _, b := range []struct {
		field, key, addr, host string
		port                   int
	}{
		{"healthzBindAddress", "healthzBindAddress", kp.HealthzBindAddress, defaultHealthzHost, defaultHealthzPort},
		{"metricsBindAddress", "metricsBindAddress", kp.MetricsBindAddress, defaultMetricsHost, defaultMetricsPort},
	} {
		addr, comment, err := c.bindAddress(b.field, b.addr, b.host, b.port)
		if err != nil {
			return nil, err
		}
		root.set(b.key, addr, comment)
	}
	if kp.EnableProfiling {
		root.set("enableProfiling", true, commentLines("pprof on metricsBindAddress, unauthenticated, as kube-proxy's."))
	}
	bit, bitComment := c.masqueradeBit()
	root.set("masqueradeBit", bit, bitComment)
	if m, comment := c.conntrack(); m != nil {
		root.set("conntrack", m, comment)
	}
	inst, err := c.instance()
	if err != nil {
		return nil, err
	}
	root.set("instances", seq(inst.n), "")
	c.ignored()
	return root, nil
}

// clientConnection carries the API client's pacing and encoding, when set (unset:
// kube-proxy's defaults, which are shardproxy's).
func (c *converter) clientConnection() *mapNode {
	cc := c.kp.ClientConnection
	m := newMap()
	if cc.QPS != 0 {
		m.set("qps", cc.QPS, "")
	}
	if cc.Burst != 0 {
		m.set("burst", cc.Burst, "")
	}
	if cc.ContentType != "" {
		m.set("contentType", cc.ContentType, "")
	}
	if cc.AcceptContentTypes != "" {
		m.set("acceptContentTypes", cc.AcceptContentTypes, "")
	}
	if len(m.n.Content) == 0 {
		return nil
	}
	return m
}

// bindAddress converts a health or metrics bind address, moved AlongsidePortOffset up
// when shardproxy runs beside kube-proxy.
func (c *converter) bindAddress(field, addr, defHost string, defPort int) (string, string, error) {
	host, port := defHost, defPort
	if addr != "" {
		h, p, err := net.SplitHostPort(addr)
		switch {
		case err == nil:
			n, perr := strconv.Atoi(p)
			if perr != nil {
				return "", "", fmt.Errorf("%s %q: bad port: %w", field, addr, perr)
			}
			host, port = h, n
			if host == "" {
				host = "0.0.0.0" // ":port" listens on every address, as 0.0.0.0 does here
			}
		default:
			host = addr // an address without a port: kube-proxy's default port
		}
	}
	var comment []string
	if pfx, err := netip.ParsePrefix(host); err == nil {
		wild := "0.0.0.0"
		if pfx.Addr().Is6() {
			wild = "::"
		}
		c.note(field, addr, fmt.Sprintf("kube-proxy listens on the node addresses inside %s; shardproxy binds one address, so this listens on %s", pfx, wild))
		host = wild
	} else if _, err := netip.ParseAddr(host); err != nil {
		return "", "", fmt.Errorf("%s %q: not an IP address", field, addr)
	}
	if c.opts.Alongside {
		comment = append(comment, fmt.Sprintf("kube-proxy's port %d plus %d: both run on this node.", port, AlongsidePortOffset))
		port += AlongsidePortOffset
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), commentLines(comment...), nil
}

// proxierSettings returns the mode's masquerade bit, masqueradeAll and sync periods; ipvs
// mode takes the first two from the iptables section, as kube-proxy does.
func (c *converter) proxierSettings() (bit *int32, all bool, sync, minSync metav1.Duration) {
	switch c.mode {
	case "nftables":
		n := c.kp.NFTables
		return n.MasqueradeBit, n.MasqueradeAll, n.SyncPeriod, n.MinSyncPeriod
	case "ipvs":
		return c.kp.IPTables.MasqueradeBit, c.kp.IPTables.MasqueradeAll, c.kp.IPVS.SyncPeriod, c.kp.IPVS.MinSyncPeriod
	default:
		i := c.kp.IPTables
		return i.MasqueradeBit, i.MasqueradeAll, i.SyncPeriod, i.MinSyncPeriod
	}
}

// masqueradeBit is kube-proxy's bit, or beside it another one.
func (c *converter) masqueradeBit() (int, string) {
	p, _, _, _ := c.proxierSettings()
	bit := defaultMasqueradeBit
	if p != nil {
		bit = int(*p)
	}
	if !c.opts.Alongside {
		return bit, commentLines(fmt.Sprintf("From %s.masqueradeBit.", c.section()))
	}
	own := 13
	for own == bit || own == kubeletDropBit {
		own--
	}
	return own, commentLines(fmt.Sprintf("kube-proxy marks with bit %d (the kubelet's drop mark is bit %d): a bit of shardproxy's own", bit, kubeletDropBit),
		"keeps the two proxies' masquerade decisions apart. No other component on the node may use it.")
}

// section names the kube-proxy section the mode's proxier settings come from.
func (c *converter) section() string {
	if c.mode == "nftables" {
		return "nftables"
	}
	return "iptables"
}

// apiServer says where the replace overlay's supervisor must reach the API server: the
// server of kube-proxy's kubeconfig, which the overlay's apiserver-endpoint.yaml carries
// (the configuration file has no field for it: in-cluster configuration reads it from
// the environment).
func (c *converter) apiServer() {
	const patch = "deploy/overlays/replace-kube-proxy/apiserver-endpoint.yaml"
	if c.opts.APIServer == "" {
		c.change("The API server: kube-proxy's configuration does not say where it is; set KUBERNETES_SERVICE_HOST and " +
			"KUBERNETES_SERVICE_PORT in " + patch + " to your control plane's address (kubeadm: controlPlaneEndpoint).")
		return
	}
	host, port, err := Endpoint(c.opts.APIServer)
	if err != nil {
		c.change("The API server: kube-proxy's kubeconfig names %q, which is not a URL; set %s by hand.", c.opts.APIServer, patch)
		return
	}
	msg := fmt.Sprintf("The API server: kube-proxy's kubeconfig names %s; without kube-proxy the supervisor reaches it directly, "+
		"so set KUBERNETES_SERVICE_HOST=%s and KUBERNETES_SERVICE_PORT=%s in %s (--write-overlay does).", c.opts.APIServer, host, port, patch)
	if _, err := netip.ParseAddr(host); err != nil {
		msg += fmt.Sprintf(" %s is a name: the pod resolves it through the node's resolver, never cluster DNS; an IP address is safer.", host)
	}
	c.change("%s", msg)
}

// Conntrack sysctl values the replace overlay's init container (conntrack-sysctls.yaml)
// writes: kube-proxy's defaults.
const (
	overlayMaxPerCore  = 32768
	overlayMin         = 131072
	overlayEstablished = 24 * time.Hour
	overlayCloseWait   = time.Hour
)

// conntrack converts the conntrack sysctls. The supervisor's container cannot write
// /proc/sys, so the output leaves every sysctl alone (0): beside kube-proxy they stay
// kube-proxy's; replacing it, the replace overlay's privileged init container writes
// kube-proxy's defaults, and a value of kube-proxy's that differs is noted with where to
// set it.
func (c *converter) conntrack() (*mapNode, string) {
	ct := c.kp.Conntrack
	if ct.TCPBeLiberal {
		c.note("conntrack.tcpBeLiberal", true, "shardproxy does not set nf_conntrack_tcp_be_liberal: set the sysctl on the node (an init container) if you need it")
	}
	m := newMap()
	m.set("maxPerCore", 0, "").set("tcpEstablishedTimeout", "0s", "").set("tcpCloseWaitTimeout", "0s", "")
	if c.opts.Alongside {
		return m, commentLines("kube-proxy owns the conntrack sysctls on this node: 0 leaves them alone.")
	}
	const initContainer = "the replace overlay's conntrack-sysctls.yaml init container writes kube-proxy's default"
	const unwritable = "shardproxy's unprivileged container cannot write /proc/sys"
	if v := ct.MaxPerCore; v != nil && *v != overlayMaxPerCore {
		c.note("conntrack.maxPerCore", *v, fmt.Sprintf("%s; %s (%d): change its value there", unwritable, initContainer, overlayMaxPerCore))
	}
	if v := ct.Min; v != nil && *v != overlayMin {
		c.note("conntrack.min", *v, fmt.Sprintf("%s; %s (%d): change its value there", unwritable, initContainer, overlayMin))
	}
	for _, d := range []struct {
		key  string
		v    *metav1.Duration
		want time.Duration
	}{{"tcpEstablishedTimeout", ct.TCPEstablishedTimeout, overlayEstablished}, {"tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout, overlayCloseWait}} {
		if d.v != nil && d.v.Duration != d.want {
			c.note("conntrack."+d.key, d.v.Duration, fmt.Sprintf("%s; %s (%s): change its value there", unwritable, initContainer, d.want))
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"udpTimeout", ct.UDPTimeout.Duration}, {"udpStreamTimeout", ct.UDPStreamTimeout.Duration}} {
		if d.v != 0 {
			c.note("conntrack."+d.key, d.v, unwritable+", and the replace overlay's init container does not set it: add it to conntrack-sysctls.yaml or set it on the node")
		}
	}
	return m, commentLines("The supervisor's container cannot write /proc/sys: 0 leaves these alone. The replace overlay's",
		"conntrack-sysctls.yaml init container sets kube-proxy's defaults (notes above for values that differ).")
}

// ignored notes the settings with no shardproxy counterpart at all.
func (c *converter) ignored() {
	kp := c.kp
	if len(kp.FeatureGates) > 0 {
		gates := make([]string, 0, len(kp.FeatureGates))
		for _, g := range slices.Sorted(maps.Keys(kp.FeatureGates)) {
			gates = append(gates, fmt.Sprintf("%s=%v", g, kp.FeatureGates[g]))
		}
		c.note("featureGates", strings.Join(gates, ","), "shardproxy has no feature gates: it behaves as kube-proxy v1.36 with its GA and default-on features")
	}
	if kp.Logging.Format != "" && kp.Logging.Format != "text" || kp.Logging.Verbosity != 0 {
		c.note("logging", fmt.Sprintf("format %q verbosity %d", kp.Logging.Format, kp.Logging.Verbosity),
			"logging is set on shardproxy's command line: --logging-format text|json and -v N (the DaemonSet's args)")
	}
	if a := kp.BindAddress; a != "" && a != "0.0.0.0" && a != "::" {
		c.note("bindAddress", a, "shardproxy takes the node's addresses from its Node object (InternalIPs)")
	}
	if kp.BindAddressHardFail {
		c.note("bindAddressHardFail", true, "shardproxy logs a health or metrics server it cannot bind and keeps proxying")
	}
	if kp.ShowHiddenMetricsForVersion != "" {
		c.note("showHiddenMetricsForVersion", kp.ShowHiddenMetricsForVersion, "shardproxy hides no metrics")
	}
	if kp.OOMScoreAdj != nil {
		c.note("oomScoreAdj", *kp.OOMScoreAdj, "set by the container runtime from the DaemonSet's resources (deploy/), not by shardproxy")
	}
	if kp.ConfigSyncPeriod.Duration != 0 {
		c.note("configSyncPeriod", kp.ConfigSyncPeriod.Duration, "shardproxy's watches never relist; each instance's fullSyncPeriod (default 1h) rewrites its tables")
	}
	if kp.PortRange != "" {
		c.note("portRange", kp.PortRange, "unused by kube-proxy since v1.26, and by shardproxy")
	}
	if c.mode == "ipvs" {
		v := kp.IPVS
		if _, ok := ipvsSchedulers[v.Scheduler]; !ok {
			c.note("ipvs.scheduler", fmt.Sprintf("%q", v.Scheduler), "no counterpart: endpoints are picked at random (loadBalancing.mode random); "+
				"shardproxy has roundRobin (IPVS rr), sourceHash (sh) and consistentHash (mh)")
		}
		if v.StrictARP || len(v.ExcludeCIDRs) > 0 || v.TCPTimeout.Duration != 0 || v.TCPFinTimeout.Duration != 0 || v.UDPTimeout.Duration != 0 {
			c.note("ipvs", fmt.Sprintf("strictARP %v excludeCIDRs %v timeouts %v/%v/%v", v.StrictARP, v.ExcludeCIDRs,
				v.TCPTimeout.Duration, v.TCPFinTimeout.Duration, v.UDPTimeout.Duration),
				"IPVS only: no IPVS here (once kube-proxy is gone, `shardproxy cleanup --legacy ipvs` removes its IPVS state)")
		}
	}
	w := kp.Winkernel
	if w != (kpv1alpha1.KubeProxyWinkernelConfiguration{}) || kp.WindowsRunAsService {
		c.note("winkernel", "set", "Windows only")
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
