package legacy

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ServiceRules is what kube-proxy (iptables or nftables mode) has written for one
// Service.
type ServiceRules struct {
	// Endpoints: a cluster IP of it is sent to its endpoints (a nat KUBE-SERVICES rule
	// to its KUBE-SVC/KUBE-SVL chain, or a service-ips element to its service- or local-
	// chain).
	Endpoints bool
	// NoEndpoints: a port of it is rejected for want of endpoints (a filter KUBE-SERVICES
	// "has no endpoints" rule, or a no-endpoint-services element going to reject-chain).
	NoEndpoints bool
}

// ProgrammedServices reads which Services kube-proxy has programmed, by
// "namespace/name": the evidence a rollback waits on before the shadow that served them
// meanwhile goes. It reads both modes, whichever is there (none: an empty map), as
// kube-proxy removes the other mode's rules when it starts: in iptables mode, with every
// installed iptables, its rule comments ("ns/name:port cluster IP", "ns/name:port has no
// endpoints"), which upstream writes for every Service port in both backends; in
// nftables mode, its kube-proxy tables' service-ips and no-endpoint-services maps
// (nftables.go).
//
// A backend it cannot read does not hide what the others show: it returns what it read
// with the errors. The evidence is only ever positive, so a missing backend delays a
// rollback, never hurries it. (In the DaemonSet's unprivileged pod iptables-nft-save
// reads with its file capability, iptables-legacy-save cannot: it needs root.)
func ProgrammedServices(ctx context.Context, ex Exec) (map[string]ServiceRules, error) {
	out := map[string]ServiceRules{}
	tools, err := Tools(ex)
	if err != nil && !errors.Is(err, ErrNoIPTables) {
		return nil, err
	}
	var errs []error
	for _, tool := range tools {
		// Without -t, as planTool: asking for a table by name creates it (legacy backend).
		data, err := ex.Run(ctx, nil, tool.save())
		if err != nil {
			errs = append(errs, fmt.Errorf("reading rules with %s: %w", tool.save(), err))
			continue
		}
		tables, err := parseSave(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("parsing %s output: %w", tool.save(), err))
			continue
		}
		for _, t := range tables {
			collectServiceRules(t, out)
		}
	}
	if err := nftServices(ctx, ex, out); err != nil {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

func collectServiceRules(t *savedTable, out map[string]ServiceRules) {
	for _, r := range t.rules {
		if r.chain != "KUBE-SERVICES" {
			continue
		}
		svc, what, ok := serviceComment(r.spec)
		if !ok {
			continue
		}
		rules := out[svc]
		switch {
		case t.name == tableNAT && what == "cluster IP" && (strings.HasPrefix(r.target, "KUBE-SVC-") || strings.HasPrefix(r.target, "KUBE-SVL-")):
			rules.Endpoints = true
		case t.name == tableFilter && what == "has no endpoints":
			rules.NoEndpoints = true
		default:
			continue
		}
		out[svc] = rules
	}
}

// serviceComment splits a rule's "--comment" into the Service ("namespace/name", the
// port name cut off: neither part may hold a colon) and what the rule is for.
func serviceComment(spec string) (svc, what string, ok bool) {
	words, err := splitWords(spec)
	if err != nil {
		return "", "", false
	}
	for i := 0; i+1 < len(words); i++ {
		if words[i] != "--comment" {
			continue
		}
		port, what, found := strings.Cut(words[i+1], " ")
		svc, _, _ = strings.Cut(port, ":")
		if !found || strings.Count(svc, "/") != 1 {
			return "", "", false
		}
		return svc, what, true
	}
	return "", "", false
}
