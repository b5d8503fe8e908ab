package kerneltest

import (
	"context"
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
