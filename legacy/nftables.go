package legacy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Names in kube-proxy's nftables mode (upstream pkg/proxy/nftables): one table per
// family, whose service-ips map sends a Service IP, protocol and port to the Service's
// chain and whose no-endpoint-services map rejects those without endpoints.
const (
	nftTable       = "kube-proxy"
	nftServiceIPs  = "service-ips"
	nftNoEndpoints = "no-endpoint-services"
	// nftRejectChain is the no-endpoint-services verdict of a Service without any
	// endpoints; a Service with endpoints but none local for a Local policy gets "drop".
	nftRejectChain = "reject-chain"
)

// nftInternalChainPrefixes start the chains a cluster IP's service-ips element goes to:
// the Cluster policy chain or the Local one (internalTrafficPolicy: Local), both named
// "<prefix>HASH-namespace/name/protocol/port". ("external-" chains, for external and
// load-balancer IPs, say nothing of the cluster IP, as iptables mode's KUBE-EXT-*.)
var nftInternalChainPrefixes = []string{"service-", "local-"}

// nftServices adds to out what kube-proxy in nftables mode has programmed in the
// families whose kube-proxy table exists: none when nft is not installed or kube-proxy
// runs in another mode.
func nftServices(ctx context.Context, ex Exec, out map[string]ServiceRules) error {
	if ex.LookPath("nft") != nil {
		return nil
	}
	data, err := ex.Run(ctx, nil, "nft", "-j", "list", "tables")
	if err != nil {
		return fmt.Errorf("listing nftables tables: %w", err)
	}
	families, err := nftKubeProxyFamilies(data)
	if err != nil {
		return fmt.Errorf("parsing nft -j list tables: %w", err)
	}
	for _, fam := range families {
		for _, m := range []string{nftServiceIPs, nftNoEndpoints} {
			data, err := ex.Run(ctx, nil, "nft", "-j", "list", "map", fam, nftTable, m)
			if err != nil {
				return fmt.Errorf("reading kube-proxy's %s map %s: %w", fam, m, err)
			}
			elems, err := parseNFTMap(data)
			if err != nil {
				return fmt.Errorf("parsing kube-proxy's %s map %s: %w", fam, m, err)
			}
			for _, e := range elems {
				collectNFTElement(m, e, out)
			}
		}
	}
	return nil
}

// nftJSON is the envelope of `nft -j` output: a list of one-key objects.
type nftJSON struct {
	NFTables []struct {
		Table *struct {
			Family string `json:"family"`
			Name   string `json:"name"`
		} `json:"table"`
		Map *struct {
			Elem []json.RawMessage `json:"elem"`
		} `json:"map"`
	} `json:"nftables"`
}

// nftKubeProxyFamilies returns the families ("ip", "ip6") that have a kube-proxy table.
func nftKubeProxyFamilies(data []byte) ([]string, error) {
	var doc nftJSON
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var out []string
	for _, o := range doc.NFTables {
		if o.Table != nil && o.Table.Name == nftTable && (o.Table.Family == "ip" || o.Table.Family == "ip6") {
			out = append(out, o.Table.Family)
		}
	}
	return out, nil
}

// nftElement is one map element as far as the evidence goes: the key's comment, and the
// chain its verdict goes or jumps to ("" for another verdict).
type nftElement struct {
	comment string
	target  string
}

// parseNFTMap returns the elements of the one map in an `nft -j list map` output. Each
// element is a [key, value] pair; a key with a comment is wrapped as {"elem": {"val":
// key, "comment": ...}}.
func parseNFTMap(data []byte) ([]nftElement, error) {
	var doc nftJSON
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var out []nftElement
	found := false
	for _, o := range doc.NFTables {
		if o.Map == nil {
			continue
		}
		found = true
		for _, raw := range o.Map.Elem {
			e, err := parseNFTElement(raw)
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
	}
	if !found {
		return nil, errors.New("no map in the output")
	}
	return out, nil
}

func parseNFTElement(raw json.RawMessage) (nftElement, error) {
	var pair []json.RawMessage
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return nftElement{}, fmt.Errorf("map element %s: not a [key, value] pair", raw)
	}
	var key struct {
		Elem *struct {
			Comment string `json:"comment"`
		} `json:"elem"`
	}
	type chainRef struct {
		Target string `json:"target"`
	}
	var value struct {
		Goto *chainRef `json:"goto"`
		Jump *chainRef `json:"jump"`
	}
	// A key without a comment is an address concatenation, which unmarshals to no elem.
	if err := json.Unmarshal(pair[0], &key); err != nil {
		key.Elem = nil
	}
	if err := json.Unmarshal(pair[1], &value); err != nil {
		return nftElement{}, fmt.Errorf("map element %s: verdict: %w", raw, err)
	}
	var e nftElement
	if key.Elem != nil {
		e.comment = key.Elem.Comment
	}
	switch {
	case value.Goto != nil:
		e.target = value.Goto.Target
	case value.Jump != nil:
		e.target = value.Jump.Target
	}
	return e, nil
}

// collectNFTElement records one element of map m: a service-ips element going to a
// Service's internal chain (named for the Service), or a no-endpoint-services element
// rejecting it (its comment "namespace/name:port").
func collectNFTElement(m string, e nftElement, out map[string]ServiceRules) {
	switch m {
	case nftServiceIPs:
		if svc, ok := nftChainService(e.target); ok {
			rules := out[svc]
			rules.Endpoints = true
			out[svc] = rules
		}
	case nftNoEndpoints:
		svc, _, _ := strings.Cut(e.comment, ":")
		if e.target == nftRejectChain && strings.Count(svc, "/") == 1 {
			rules := out[svc]
			rules.NoEndpoints = true
			out[svc] = rules
		}
	}
}

// nftChainService returns the "namespace/name" of a Service's internal chain name,
// "service-HASH-namespace/name/protocol/port" or "local-...".
func nftChainService(chain string) (string, bool) {
	for _, prefix := range nftInternalChainPrefixes {
		rest, ok := strings.CutPrefix(chain, prefix)
		if !ok {
			continue
		}
		_, base, ok := strings.Cut(rest, "-") // the hash: letters and digits only
		parts := strings.Split(base, "/")
		if !ok || len(parts) != 4 || parts[0] == "" || parts[1] == "" {
			return "", false
		}
		return parts[0] + "/" + parts[1], true
	}
	return "", false
}
