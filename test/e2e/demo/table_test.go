package demo

import (
	"strings"
	"testing"
)

// TestProblem checks that a wrong row of the demo's table is named, and a right one not.
func TestProblem(t *testing.T) {
	byName := map[string]Sample{}
	for _, s := range Samples() {
		byName[s.NS+"/"+s.Name] = s
	}
	const client = "203.0.113.7"
	tests := []struct {
		name    string
		row     Row
		problem string // substring; "" for none
	}{
		{"served by its instance", Row{Service: "shop/frontend", Instance: "default", WayIn: "ClusterIP", Answered: "a×5 b×5", Sources: "10.0.0.2"}, ""},
		{"held by the wrong instance", Row{Service: "shop/frontend", Instance: "team-a", WayIn: "ClusterIP", Answered: "a×10"}, "held by instance team-a, want default"},
		{"held by two instances", Row{Service: "team-a/api", Instance: "default,team-a", WayIn: "ClusterIP", Answered: "a×10"}, "want team-a"},
		{"not served", Row{Service: "team-a/api", Instance: "team-a", WayIn: "ClusterIP", Answered: NoAnswer}, "via ClusterIP: (no answer)"},
		{"no endpoints refused", Row{Service: "team-b/empty", Instance: "team-b", WayIn: "ClusterIP", Answered: Refused}, ""},
		{"no endpoints, dropped instead of refused", Row{Service: "team-b/empty", Instance: "team-b", WayIn: "ClusterIP", Answered: NoAnswer}, "want (refused)"},
		{"another proxy's Service left alone", Row{Service: "elsewhere/foreign", Instance: "(none)", WayIn: "ClusterIP", Answered: NoAnswer}, ""},
		{"another proxy's Service served", Row{Service: "elsewhere/foreign", Instance: "(none)", WayIn: "ClusterIP", Answered: "a×10"}, "belongs to no local instance"},
		{"another proxy's Service held", Row{Service: "elsewhere/foreign", Instance: "default", WayIn: "ClusterIP", Answered: NoAnswer}, "want (none)"},
		{"affinity keeps one endpoint", Row{Service: "team-b/cache", Instance: "team-b", WayIn: "ClusterIP", Answered: "a×10"}, ""},
		{"affinity broken", Row{Service: "team-b/cache", Instance: "team-b", WayIn: "ClusterIP", Answered: "a×4 b×6"}, "ClientIP affinity"},
		{"Local policy keeps the client", Row{Service: "team-a/api", Instance: "team-a", WayIn: "LoadBalancer IP", Answered: "a×10", Sources: client}, ""},
		{"Local policy, client masqueraded", Row{Service: "team-a/api", Instance: "team-a", WayIn: "NodePort", Answered: "a×10", Sources: "10.0.0.1"}, "want the client " + client},
		{"Cluster policy may masquerade", Row{Service: "shop/frontend", Instance: "default", WayIn: "NodePort", Answered: "a×10", Sources: "10.0.0.1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := byName[tt.row.Service].Problem(tt.row, client)
			if tt.problem == "" && got != "" || tt.problem != "" && !strings.Contains(got, tt.problem) {
				t.Errorf("Problem(%+v) = %q, want %q", tt.row, got, tt.problem)
			}
		})
	}
}
