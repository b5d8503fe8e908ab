package migrate

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/selector"
)

// PlanRow is one Service in a migration plan.
type PlanRow struct {
	Service string `json:"service"`
	// ProxyName is the service-proxy-name label, "" when unlabeled.
	ProxyName string `json:"proxyName,omitempty"`
	// ServedBy names who serves it: shardproxy instances (from the node statuses), or
	// the legacy proxy.
	ServedBy string `json:"servedBy"`
	// Notes flag what behaves differently under shardproxy than under iptables kube-proxy.
	Notes []string `json:"notes,omitempty"`
}

// Differences an operator should know before moving a Service off iptables kube-proxy.
const (
	NoteLocalhostNodePort = "nodeport-localhost: iptables kube-proxy answers NodePorts on 127.0.0.1; shardproxy does not"
	NoteNodePortAddresses = "nodeport-addresses: iptables kube-proxy answers NodePorts on every node IP; shardproxy only on nodePortAddresses (default: the node's primary IPs)"
	NoteSourceRanges      = "source-ranges: loadBalancerSourceRanges filter traffic to the LB IPs; the NodePort is not filtered by source"
	NoteHealthCheck       = "health-check-node-port: served by the supervisor of the instance that owns the Service once it moves"
	NoteUndefinedPorts    = "undefined-ports: connections to ports the Service does not define are rejected (iptables: not handled)"
)

// Plan lists the selected Services with who serves them and what to look out for.
func (m *Mover) Plan(ctx context.Context, sel Selection) ([]PlanRow, error) {
	m.defaults()
	svcs, err := m.Select(ctx, sel)
	if err != nil {
		return nil, err
	}
	statuses, err := ReadStatuses(ctx, m.Client, m.StatusNamespace)
	if err != nil {
		return nil, err
	}
	var rows []PlanRow
	for _, s := range svcs {
		if s.Spec.Type == corev1.ServiceTypeExternalName || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue // nothing to proxy
		}
		label, labeled := s.Labels[selector.LabelServiceProxyName]
		row := PlanRow{Service: s.Namespace + "/" + s.Name, ProxyName: label, ServedBy: servedBy(statuses, label, labeled)}
		row.Notes = notes(&s)
		rows = append(rows, row)
	}
	return rows, nil
}

func servedBy(statuses []NodeStatus, label string, labeled bool) string {
	insts := map[string]bool{}
	for _, st := range statuses {
		for name, inst := range st.Instances {
			if (labeled && slices.Contains(inst.ProxyNames, label)) || (!labeled && inst.Default) {
				insts[name] = true
			}
		}
	}
	if len(insts) == 0 {
		if labeled {
			return "proxy " + label + " (not shardproxy)"
		}
		return "legacy (unlabeled)"
	}
	var names []string
	for n := range insts {
		names = append(names, "shardproxy/"+n)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func notes(s *corev1.Service) []string {
	var out []string
	hasNodePorts := false
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			hasNodePorts = true
		}
	}
	if hasNodePorts {
		out = append(out, NoteLocalhostNodePort, NoteNodePortAddresses)
		if len(s.Spec.LoadBalancerSourceRanges) > 0 {
			out = append(out, NoteSourceRanges)
		}
	}
	if s.Spec.HealthCheckNodePort != 0 {
		out = append(out, NoteHealthCheck)
	}
	out = append(out, NoteUndefinedPorts)
	return out
}

// WritePlan prints a plan as a table, then the notes each flagged Service carries.
func WritePlan(w io.Writer, rows []PlanRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tLABEL\tSERVED BY\tNOTES")
	for _, r := range rows {
		label := r.ProxyName
		if label == "" {
			label = "-"
		}
		var short []string
		for _, n := range r.Notes {
			short = append(short, n[:strings.IndexByte(n, ':')])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Service, label, r.ServedBy, strings.Join(short, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nNotes:")
	for _, n := range []string{NoteLocalhostNodePort, NoteNodePortAddresses, NoteSourceRanges, NoteHealthCheck, NoteUndefinedPorts} {
		fmt.Fprintln(w, "  "+n)
	}
	return nil
}
