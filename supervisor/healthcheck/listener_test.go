package healthcheck

import (
	"net"
	"net/netip"
	"testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestTCPListenerFamilies: each socket is of its address's family and bound to it.
func TestTCPListenerFamilies(t *testing.T) {
	for _, tc := range []struct {
		addr        string
		wantNetwork string
	}{
		{addr: "127.0.0.1", wantNetwork: "tcp"},
		{addr: "::1", wantNetwork: "tcp"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			l, err := TCPListener{}.Listen(netip.MustParseAddr(tc.addr), 0)
			if err != nil {
				testutil.Unavailable(t, "no %s here: %v", tc.addr, err)
			}
			defer l.Close()
			got := l.Addr().(*net.TCPAddr)
			if !got.IP.Equal(net.ParseIP(tc.addr)) || got.Network() != tc.wantNetwork {
				t.Errorf("listening on %s %s, want %s", got.Network(), got, tc.addr)
			}
		})
	}
}
