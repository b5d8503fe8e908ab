package healthcheck

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// refusingListener fails to listen on the ports in held, as if another process had them.
type refusingListener struct{ held map[int]bool }

func (l refusingListener) Listen(_ netip.Addr, port int) (net.Listener, error) {
	if l.held[port] {
		return nil, errors.New("bind: address already in use")
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// TestReadyz: /readyz is /healthz's verdict and every server listening; why a server
// does not listen is in /status (loopback), only its name in /readyz.
func TestReadyz(t *testing.T) {
	tests := []struct {
		name         string
		listenErrors map[string]string
		unserved     map[string]string
		deleting     bool
		wantCode     int
		wantBody     string
	}{
		{name: "healthy and listening", wantCode: 200, wantBody: `"ready":true`},
		{name: "a server not listening", listenErrors: map[string]string{"metrics": "listening on 127.0.0.1:10249: address already in use"},
			wantCode: 503, wantBody: `"notListening":["metrics"]`},
		{name: "a health check the configuration cannot serve is not a readiness failure",
			unserved: map[string]string{"healthCheckNodePorts": "port 30001 (Service shop/v6, instance team-a)"},
			wantCode: 200, wantBody: `"ready":true`},
		{name: "the node is being deleted", deleting: true, wantCode: 503, wantBody: `"healthy":false`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewProxyHealth(nil, nil)
			h.AddInstance("a")
			h.SetNodeDeleting(tc.deleting)
			for server, msg := range tc.listenErrors {
				h.SetListenError(server, msg)
			}
			for server, msg := range tc.unserved {
				h.SetUnserved(server, msg)
			}
			rec := httptest.NewRecorder()
			h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, ReadyzPath, nil))
			if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Errorf("%d %s, want %d with %s", rec.Code, rec.Body, tc.wantCode, tc.wantBody)
			}
			if strings.Contains(rec.Body.String(), "address already in use") {
				t.Errorf("/readyz carries the error text, which stays on loopback: %s", rec.Body)
			}
			req := httptest.NewRequest(http.MethodGet, "/status", nil)
			req.RemoteAddr = "127.0.0.1:1234"
			rec = httptest.NewRecorder()
			h.Handler().ServeHTTP(rec, req)
			for _, msg := range tc.unserved {
				if !strings.Contains(rec.Body.String(), `"unserved":{"healthCheckNodePorts":"`+msg) {
					t.Errorf("/status lacks unserved %q: %s", msg, rec.Body)
				}
			}
			for _, msg := range tc.listenErrors {
				if !strings.Contains(rec.Body.String(), msg) {
					t.Errorf("/status lacks %q: %s", msg, rec.Body)
				}
			}
		})
	}
	h := NewProxyHealth(nil, nil)
	h.SetListenError("metrics", "held")
	h.SetListenError("metrics", "")
	h.SetUnserved("healthCheckNodePorts", "port 30001")
	h.SetUnserved("healthCheckNodePorts", "")
	if s := h.snapshot(); len(s.listenErrors) != 0 || len(s.unserved) != 0 {
		t.Error("an empty message does not clear the error")
	}
}

// TestUnboundHealthChecks: a health-check node port this node refuses to bind (another
// process holds it) is listed by Unbound, which gates readiness, until a retry binds it;
// those the configuration and the Services ask for but cannot have (no node port address
// in the Service's families, a port another Service holds, an invalid port) are listed by
// Unserved instead, which does not.
func TestUnboundHealthChecks(t *testing.T) {
	l := refusingListener{held: map[int]bool{30001: true}}
	s := NewServiceHealth(l, nil, nil)
	defer s.Close()
	s.SetInstanceAddrs("team-a", []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	s.SetInstanceAddrs("team-b", []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	s.SyncServices("team-a", map[types.NamespacedName]HealthCheck{
		nsn("shop", "web"):  {Port: 30001, IPv4: true},
		nsn("shop", "api"):  {Port: 30002, IPv4: true},
		nsn("shop", "v6"):   {Port: 30003, IPv6: true},
		nsn("shop", "zero"): {Port: 0, IPv4: true},
	})
	s.SyncServices("team-b", map[types.NamespacedName]HealthCheck{nsn("b", "same-port"): {Port: 30002, IPv4: true}})
	want := []string{"port 30001 (Service shop/web, instance team-a)"}
	if got := s.Unbound(); !slices.Equal(got, want) {
		t.Errorf("Unbound() = %q, want %q", got, want)
	}
	wantUnserved := []string{
		"port 0 (Service shop/zero, instance team-a)",
		"port 30002 (Service b/same-port, instance team-b)",
		"port 30003 (Service shop/v6, instance team-a)",
	}
	if got := s.Unserved(); !slices.Equal(got, wantUnserved) {
		t.Errorf("Unserved() = %q, want %q", got, wantUnserved)
	}
	delete(l.held, 30001)
	s.RetryFailed()
	if got := s.Unbound(); len(got) != 0 {
		t.Errorf("after the port was freed: Unbound() = %q", got)
	}
	// The instance gets an IPv6 address: the IPv6 Service opens and is no longer listed.
	s.SetInstanceAddrs("team-a", []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")})
	if got := s.Unserved(); !slices.Equal(got, slices.Delete(slices.Clone(wantUnserved), 2, 3)) {
		t.Errorf("after team-a got an IPv6 address: Unserved() = %q", got)
	}
}
