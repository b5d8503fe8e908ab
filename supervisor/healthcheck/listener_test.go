package healthcheck

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
)

func TestTCPListener(t *testing.T) {
	tests := []struct {
		name  string
		addrs []string
		// wantMulti is whether the listener merges several sockets.
		wantMulti bool
	}{
		{name: "no addresses listens on all", addrs: nil},
		{name: "one address", addrs: []string{"127.0.0.1"}},
		// Port 0 gives each address its own ephemeral port, which lets the test reach each
		// socket of the merged listener separately.
		{name: "several addresses", addrs: []string{"127.0.0.1", "127.0.0.1"}, wantMulti: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := NewTCPListener(tc.addrs).Listen(0)
			if err != nil {
				t.Fatalf("Listen: %v", err)
			}
			var addrs []string
			if m, ok := l.(*multiListener); ok {
				for _, sub := range m.listeners {
					addrs = append(addrs, sub.Addr().String())
				}
			} else {
				addrs = []string{fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)}
			}
			if got := len(addrs) > 1; got != tc.wantMulti {
				t.Fatalf("listening on %v, want merged listener %v", addrs, tc.wantMulti)
			}

			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusNoContent)
			})}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(l) }()
			for _, addr := range addrs {
				if r := get(t, "http://"+addr); r.code != http.StatusNoContent {
					t.Errorf("GET %s: status %d, want 204", addr, r.code)
				}
			}

			if err := srv.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
			for _, addr := range addrs {
				checkRefused(t, addr)
			}
		})
	}
}

func TestTCPListenerPartialFailureClosesAll(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port

	// 127.0.0.2 is free on the port; 127.0.0.1 is not, so the listener must give up
	// 127.0.0.2 again.
	if _, err := NewTCPListener([]string{"127.0.0.2", "127.0.0.1"}).Listen(port); err == nil {
		t.Fatalf("Listen on a taken port succeeded")
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port))
	if err != nil {
		t.Fatalf("address bound by the failed Listen was not released: %v", err)
	}
	l.Close()
}
