package kerneltest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/shardproxy/shardproxy/supervisor"
	"github.com/shardproxy/shardproxy/supervisor/config"
)

// decodeConfig reads a test's configuration as the CLI does: decoded, defaults filled
// in, validated.
func decodeConfig(t *testing.T, yaml, file string) *config.Config {
	t.Helper()
	cfg, err := config.Decode([]byte(yaml), file)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runSupervisor runs a supervisor of cfg over deps until the returned stop (also called
// at the test's end) has returned; an error from Run fails the test.
func runSupervisor(t *testing.T, cfg *config.Config, deps supervisor.Deps) (stop func()) {
	t.Helper()
	sup, err := supervisor.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sup.Run(ctx); err != nil {
			t.Errorf("supervisor of %s: %v", cfg.NodeName, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// scrapeMetrics returns the text of the metrics server on 127.0.0.1:port.
func scrapeMetrics(t *testing.T, port int) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}
