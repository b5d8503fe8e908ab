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
		deleting     bool
		wantCode     int
		wantBody     string
	}{
		{name: "healthy and listening", wantCode: 200, wantBody: `"ready":true`},
		{name: "a server not listening", listenErrors: map[string]string{"metrics": "listening on 127.0.0.1:10249: address already in use"},
			wantCode: 503, wantBody: `"notListening":["metrics"]`},
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
	if len(h.snapshot().listenErrors) != 0 {
		t.Error("an empty message does not clear the error")
	}
}

// TestUnboundHealthChecks: a health-check node port another process holds is listed
// until a retry binds it.
func TestUnboundHealthChecks(t *testing.T) {
	l := refusingListener{held: map[int]bool{30001: true}}
	s := NewServiceHealth(l, nil, nil)
	defer s.Close()
	s.SetInstanceAddrs("team-a", []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	s.SyncServices("team-a", checks(map[types.NamespacedName]int32{{Namespace: "shop", Name: "web"}: 30001, {Namespace: "shop", Name: "api"}: 30002}))
	want := []string{"port 30001 (Service shop/web, instance team-a)"}
	if got := s.Unbound(); !slices.Equal(got, want) {
		t.Errorf("Unbound() = %q, want %q", got, want)
	}
	delete(l.held, 30001)
	s.RetryFailed()
	if got := s.Unbound(); len(got) != 0 {
		t.Errorf("after the port was freed: Unbound() = %q", got)
	}
}
