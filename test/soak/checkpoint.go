package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// tablePrefix is the supervisor's default table prefix.
const tablePrefix = "shardproxy"

// families are the nft families of every instance's tables.
var families = []string{"ip", "ip6"}

// checker compares what the kernel holds with what `shardproxy render` makes of the API's
// current objects.
type checker struct {
	e         *env.Env
	nft       string // the real nft, not the supervisor's faulty wrapper
	scratch   string // a namespace of our own to load rendered scripts into
	dir       string
	instances []string
}

// waitSynced waits until /status says every instance is up, healthy, has nothing queued
// and had no error in its last sync.
func (c *checker) waitSynced(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		st, err := c.status(ctx)
		if err == nil {
			last = ""
			for _, name := range c.instances {
				i, ok := st.Instances[name]
				if !ok || !i.Up || !i.Healthy || !i.LastQueued.IsZero() || i.LastError != "" {
					last += fmt.Sprintf(" %s(up=%v healthy=%v queued=%v err=%q)", name, i.Up, i.Healthy, !i.LastQueued.IsZero(), i.LastError)
				}
			}
			if last == "" {
				return nil
			}
		} else {
			last = err.Error()
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("instances not synced within %v:%s", timeout, last)
}

func (c *checker) status(ctx context.Context) (*healthcheck.StatusResponse, error) {
	code, body, err := c.e.HTTPGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/status", env.HealthzPort))
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/status answered %d", code)
	}
	var st healthcheck.StatusResponse
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return nil, fmt.Errorf("decoding /status: %w", err)
	}
	return &st, nil
}

// tableKey names one instance's table of one family.
type tableKey struct{ instance, family string }

func (k tableKey) String() string { return k.family + " " + k.table() }

func (k tableKey) table() string { return tables.TableName(tablePrefix, k.instance) }

// expected renders every instance's tables from the API's current objects, loads them
// into the scratch namespace and lists them back, so that both sides of the comparison
// are the kernel's own rendering.
func (c *checker) expected(ctx context.Context) (map[tableKey]Ruleset, []string, error) {
	objects, err := c.dumpObjects(ctx)
	if err != nil {
		return nil, nil, err
	}
	out := map[tableKey]Ruleset{}
	var warnings []string
	for _, inst := range c.instances {
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", c.e.TP.Node, c.e.Binary, "render", "--config", c.e.ConfigPath, "--instance", inst, "--from", objects)
		cmd.Stderr = &stderr
		script, err := cmd.Output()
		if err != nil {
			return nil, nil, fmt.Errorf("render --instance %s: %w: %s", inst, err, stderr.String())
		}
		warnings = append(warnings, strings.Split(strings.TrimSpace(stderr.String()), "\n")...)
		if _, err := c.run(ctx, c.scratch, nil, "flush", "ruleset"); err != nil {
			return nil, nil, err
		}
		if _, err := c.run(ctx, c.scratch, script, "-f", "-"); err != nil {
			return nil, nil, fmt.Errorf("loading the rendered script of %s: %w", inst, err)
		}
		for _, fam := range families {
			k := tableKey{inst, fam}
			rs, err := c.list(ctx, c.scratch, k)
			if err != nil {
				return nil, nil, err
			}
			out[k] = rs
		}
	}
	return out, warnings, nil
}

// dumpObjects writes the API's Services, EndpointSlices and this node's Node as YAML for
// render, and returns the file.
func (c *checker) dumpObjects(ctx context.Context) (string, error) {
	svcs, err := c.e.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	slices, err := c.e.Client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	node, err := c.e.Client.CoreV1().Nodes().Get(ctx, env.NodeName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	write := func(obj any) error {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		buf.WriteString("---\n")
		buf.Write(b)
		return nil
	}
	node.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
	if err := write(node); err != nil {
		return "", err
	}
	for i := range svcs.Items {
		svcs.Items[i].TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
		if err := write(&svcs.Items[i]); err != nil {
			return "", err
		}
	}
	for i := range slices.Items {
		slices.Items[i].TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		if err := write(&slices.Items[i]); err != nil {
			return "", err
		}
	}
	path := filepath.Join(c.dir, "objects.yaml")
	return path, os.WriteFile(path, buf.Bytes(), 0o644)
}

// compare lists the node's tables and diffs them against want: one entry per table that
// differs, with its first differences.
func (c *checker) compare(ctx context.Context, want map[tableKey]Ruleset) (map[tableKey][]string, error) {
	diffs := map[tableKey][]string{}
	for k, w := range want {
		got, err := c.list(ctx, c.e.TP.Node, k)
		if err != nil {
			return nil, err
		}
		if lines, total := Diff(w, got, 12); total > 0 {
			diffs[k] = append([]string{fmt.Sprintf("%d differences (- rendered only, + kernel only):", total)}, lines...)
		}
	}
	return diffs, nil
}

// list reads one table in namespace ns; a missing table is an empty ruleset.
func (c *checker) list(ctx context.Context, ns string, k tableKey) (Ruleset, error) {
	out, err := c.run(ctx, ns, nil, "-j", "list", "table", k.family, k.table())
	if err != nil {
		if strings.Contains(err.Error(), "No such file or directory") {
			return Ruleset{}, nil
		}
		return nil, err
	}
	return ParseRuleset(out)
}

// run runs the real nft in namespace ns and returns its standard output.
func (c *checker) run(ctx context.Context, ns string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, c.nft}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nft %s in %s: %w: %s", strings.Join(args, " "), ns, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
