package config

import (
	"fmt"
	"strings"

	"github.com/shardproxy/shardproxy/tables"
)

// LoadBalancing is how an instance's Services pick endpoints for new connections.
type LoadBalancing struct {
	// Mode is "random" (the default, as kube-proxy's nftables mode), "roundRobin",
	// "sourceHash" or "consistentHash" (tables/README.md, "Load-balancing modes").
	Mode string `yaml:"mode"`
	// AllowedModes are the modes a Service may ask for itself with the annotation
	// shardproxy.io/load-balancing. Empty (the default) allows none: a Service asking
	// gets a Warning event and the instance's mode.
	AllowedModes []string `yaml:"allowedModes"`
}

// Modes returns the instance's mode and the allowed ones, parsed (Validate has checked
// them).
func (lb LoadBalancing) Modes() (tables.LBMode, []tables.LBMode) {
	mode, _ := tables.ParseLBMode(lb.Mode)
	var allowed []tables.LBMode
	for _, m := range lb.AllowedModes {
		if a, err := tables.ParseLBMode(m); err == nil {
			allowed = append(allowed, a)
		}
	}
	return mode, allowed
}

func (lb *LoadBalancing) validate(p *problems, path string) {
	if _, err := tables.ParseLBMode(lb.Mode); err != nil {
		p.add(path+".mode", "%q is not one of %s", lb.Mode, modeList())
	}
	seen := map[string]bool{}
	for j, m := range lb.AllowedModes {
		mp := fmt.Sprintf("%s.allowedModes[%d]", path, j)
		switch _, err := tables.ParseLBMode(m); {
		case m == "" || err != nil:
			p.add(mp, "%q is not one of %s", m, modeList())
		case seen[m]:
			p.add(mp, "%q is listed twice", m)
		}
		seen[m] = true
	}
}

// modeList is the valid modes, quoted: `"random", "roundRobin", ...`.
func modeList() string {
	var out []string
	for _, m := range tables.LBModes() {
		out = append(out, fmt.Sprintf("%q", m))
	}
	return strings.Join(out, ", ")
}
