package legacy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Mode is the mode the legacy kube-proxy ran in.
type Mode string

// The modes Cleanup handles.
const (
	ModeIPTables Mode = "iptables"
	ModeIPVS     Mode = "ipvs"
)

// ParseMode parses a --legacy value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeIPTables, ModeIPVS:
		return m, nil
	}
	return "", fmt.Errorf("unknown legacy mode %q (want iptables or ipvs)", s)
}

// Options configure Cleanup. Zero seams mean the real ones.
type Options struct {
	Mode Mode
	// Force cleans up even while a kube-proxy runs (it will put its rules back on its
	// next sync).
	Force bool
	// DryRun only reports what would be removed.
	DryRun bool
	// Out receives the report (nil: discarded).
	Out io.Writer

	// KubeProxyMetricsAddress is probed for kube-proxy's /proxyMode (default
	// DefaultKubeProxyMetricsAddress; "-" skips the probe).
	KubeProxyMetricsAddress string
	// NodePorts is the NodePort range (default 30000-32767).
	NodePorts NodePortRange

	Exec   Exec
	IPVS   IPVS
	Links  Links
	IPSets IPSets
	// ProcRoot is where processes are looked for (default "/proc").
	ProcRoot string
	// Probe replaces ProbeKubeProxy (tests).
	Probe func(ctx context.Context, addr string) string
}

func (o *Options) defaults() {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.KubeProxyMetricsAddress == "" {
		o.KubeProxyMetricsAddress = DefaultKubeProxyMetricsAddress
	}
	if o.NodePorts == (NodePortRange{}) {
		o.NodePorts = NodePortRange{Min: DefaultNodePortMin, Max: DefaultNodePortMax}
	}
	if o.Exec == nil {
		o.Exec = RealExec{}
	}
	if o.IPVS == nil {
		o.IPVS = KernelIPVS{}
	}
	if o.Links == nil {
		o.Links = KernelLinks{}
	}
	if o.IPSets == nil {
		o.IPSets = KernelIPSets{}
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.Probe == nil {
		o.Probe = ProbeKubeProxy
	}
}

// RunningError is returned when a legacy kube-proxy still runs on the node.
type RunningError struct {
	Processes []Process
	// ProxyMode is what kube-proxy's /proxyMode answered at Address, if it did.
	ProxyMode, Address string
}

func (e *RunningError) Error() string {
	var what []string
	for _, p := range e.Processes {
		what = append(what, p.String())
	}
	if e.ProxyMode != "" {
		what = append(what, fmt.Sprintf("a kube-proxy in %s mode answers on %s", e.ProxyMode, e.Address))
	}
	return fmt.Sprintf("kube-proxy is still running on this node: %s; stop it first (remove it from the node: its DaemonSet, static pod or service), or pass --force (it would put its rules back on its next sync)",
		strings.Join(what, "; "))
}

// CheckNotRunning returns a *RunningError if a kube-proxy runs in this network namespace
// (process scan) or answers on its metrics address.
func CheckNotRunning(ctx context.Context, opts Options) error {
	opts.defaults()
	procs, err := FindKubeProxy(opts.ProcRoot)
	if err != nil {
		return fmt.Errorf("looking for a running kube-proxy: %w", err)
	}
	re := &RunningError{Processes: procs, Address: opts.KubeProxyMetricsAddress}
	if opts.KubeProxyMetricsAddress != "-" {
		re.ProxyMode = opts.Probe(ctx, opts.KubeProxyMetricsAddress)
	}
	if len(re.Processes) > 0 || re.ProxyMode != "" {
		return re
	}
	return nil
}

// Cleanup removes a gone kube-proxy's iptables rules (and with ModeIPVS its virtual
// services, kube-ipvs0 and ipsets) from this network namespace, reporting each step to
// opts.Out. It refuses while a kube-proxy is running unless opts.Force. It never touches
// an nftables table that iptables does not own, nor any chain doc.go does not list.
func Cleanup(ctx context.Context, opts Options) error {
	opts.defaults()
	if opts.Mode != ModeIPTables && opts.Mode != ModeIPVS {
		return fmt.Errorf("unknown legacy mode %q (want iptables or ipvs)", opts.Mode)
	}
	if err := CheckNotRunning(ctx, opts); err != nil {
		var re *RunningError
		if !opts.Force || !errors.As(err, &re) {
			return err
		}
		fmt.Fprintf(opts.Out, "warning: %v; going on (--force)\n", err)
	}
	w := opts.Out
	verb := "removed"
	if opts.DryRun {
		verb = "would remove"
	}

	tools, err := Tools(opts.Exec)
	if err != nil {
		return err
	}
	plans, err := PlanIPTables(ctx, opts.Exec, tools)
	if err != nil {
		return err
	}
	for _, p := range plans {
		for _, r := range p.Unlinked {
			fmt.Fprintf(w, "%s: %s rule from table %s: %s\n", p.Tool, verb, p.Table, r)
		}
		fmt.Fprintf(w, "%s: %s %d kube-proxy chains from table %s: %s\n", p.Tool, verb, len(p.Chains), p.Table, strings.Join(p.Chains, " "))
	}
	if len(plans) == 0 {
		fmt.Fprintf(w, "iptables: no kube-proxy chains (checked %s)\n", toolList(tools))
	}
	if !opts.DryRun {
		if err := ApplyIPTables(ctx, opts.Exec, plans); err != nil {
			return err
		}
	}
	if opts.Mode != ModeIPVS {
		return nil
	}

	ip, err := PlanIPVS(opts.IPVS, opts.Links, opts.IPSets, opts.NodePorts)
	if err != nil {
		return err
	}
	switch {
	case ip.NoIPVS:
		fmt.Fprintln(w, "ipvs: the kernel has no IPVS loaded: no virtual services to remove")
	case len(ip.Services) == 0:
		// Said as plainly when IPVS is there (a Debian kernel loads ip_vs on the first
		// look) and holds nothing of kube-proxy's.
		fmt.Fprintln(w, "ipvs: no virtual services to remove")
	}
	for _, s := range ip.Services {
		fmt.Fprintf(w, "ipvs: %s virtual service %s\n", verb, s)
	}
	for _, s := range ip.Kept {
		fmt.Fprintf(w, "ipvs: kept virtual service %s (not kube-proxy's)\n", s)
	}
	switch {
	case ip.Dummy:
		fmt.Fprintf(w, "ipvs: %s interface %s\n", verb, DummyInterface)
	case ip.NotDummy != "":
		fmt.Fprintf(w, "ipvs: warning: %s is a %s interface, not the dummy kube-proxy creates: left alone\n", DummyInterface, ip.NotDummy)
	default:
		fmt.Fprintf(w, "ipvs: no interface %s\n", DummyInterface)
	}
	if len(ip.IPSets) > 0 {
		fmt.Fprintf(w, "ipvs: %s ipsets %s\n", verb, strings.Join(ip.IPSets, " "))
	}
	if opts.DryRun {
		return nil
	}
	return ApplyIPVS(ip, opts.IPVS, opts.Links, opts.IPSets)
}

func toolList(tools []Tool) string {
	s := make([]string, len(tools))
	for i, t := range tools {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}
