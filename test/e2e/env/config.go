package env

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
)

// Status reads the supervisor's /status (on the node's loopback); false when it cannot.
func (e *Env) Status(ctx context.Context) (healthcheck.StatusResponse, bool) {
	code, body, err := e.HTTPGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/status", HealthzPort))
	var st healthcheck.StatusResponse
	if err != nil || code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
		return healthcheck.StatusResponse{}, false
	}
	return st, true
}

// Idle tells whether every instance of the supervisor is up and has applied every
// update queued to it (/status shows none queued): no sync is pending.
func (e *Env) Idle(ctx context.Context) bool {
	st, ok := e.Status(ctx)
	if !ok || len(st.Instances) == 0 {
		return false
	}
	for _, inst := range st.Instances {
		if !inst.Up || !inst.LastQueued.IsZero() {
			return false
		}
	}
	return true
}

// ConfigStatus reads the supervisor's configuration in force from /status (on the
// node's loopback); false when it cannot.
func (e *Env) ConfigStatus(ctx context.Context) (healthcheck.ConfigStatus, bool) {
	st, ok := e.Status(ctx)
	if !ok || st.Config == nil {
		return healthcheck.ConfigStatus{}, false
	}
	return *st.Config, true
}

// ApplyConfig replaces the running supervisor's configuration file (a rename, as a
// ConfigMap volume's symlink swap) and waits until /status shows it applied; it fails
// if the supervisor refuses it.
func (e *Env) ApplyConfig(ctx context.Context, content string, timeout time.Duration) error {
	before, _ := e.ConfigStatus(ctx)
	tmp := e.ConfigPath + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, e.ConfigPath); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		st, ok := e.ConfigStatus(ctx)
		switch {
		case ok && st.Refused != "" && st.Refused != before.Refused:
			return fmt.Errorf("the supervisor refused the configuration: %s", st.Refused)
		case ok && st.Hash != before.Hash:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("the supervisor did not apply the changed configuration within %s (status %+v)", timeout, st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
