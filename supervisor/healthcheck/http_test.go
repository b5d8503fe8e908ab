package healthcheck

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestServeAnswersRequestsInFlight: Serve returns only once a request in flight when ctx
// ended is answered, so a process exiting after Serve does not cut a probe's response.
func TestServeAnswersRequestsInFlight(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	entered, release := make(chan struct{}), make(chan struct{})
	var answered atomic.Bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "ok")
		answered.Store(true)
	})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, l, h) }()

	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- string(b)
	}()
	<-entered
	cancel()
	// Shutdown has begun once the listener refuses new connections.
	testutil.Eventually(t, 5*time.Second, "the listener closed", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) while a request was in flight", err)
	default:
	}
	close(release)
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if !answered.Load() {
		t.Error("Serve returned before the request in flight was answered")
	}
	if body := <-got; body != "ok" {
		t.Errorf("the request in flight got %q, want ok", body)
	}
}

// TestServeReportsAFailedListener: a listener that fails (closed under the server) ends
// Serve with the error, without waiting for ctx.
func TestServeReportsAFailedListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := Serve(context.Background(), l, http.NotFoundHandler()); err == nil {
		t.Error("Serve on a closed listener returned nil")
	}
}
