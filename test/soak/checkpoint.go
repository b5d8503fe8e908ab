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

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
func (c *checker) expected(ctx context.Context) (map[tableKey]renderedTable, []string, error) {
	objects, err := c.dumpObjects(ctx)
	if err != nil {
		return nil, nil, err
	}
	out := map[tableKey]renderedTable{}
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
			t, err := c.list(ctx, c.scratch, k)
			if err != nil {
				return nil, nil, err
			}
			out[k] = renderedTable{listedTable: t, Declared: declaredTables(script, fam)}
		}
	}
	return out, warnings, nil
}

// listedTable is one instance's table of one family as one side of a checkpoint lists
// it.
type listedTable struct {
	Rules Ruleset
	// Present says the table exists: a missing one lists as no rules.
	Present bool
}

// renderedTable is render's side: the table as the scratch namespace lists it once
// render's script is loaded, and the tables of the family the script declares.
type renderedTable struct {
	listedTable
	// Declared are the names of the tables of this family that render's script adds;
	// none says the instance serves nothing in this family.
	Declared []string
}

// declaredTables lists the names of the tables of family that an nft script adds.
func declaredTables(script []byte, family string) []string {
	var names []string
	for _, line := range strings.Split(string(script), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "add" && f[1] == "table" && f[2] == family {
			names = append(names, f[3])
		}
	}
	return names
}

// tableDiff lists how the kernel's table differs from render's, at most limit
// differences after a header; nothing when they are equal. A table missing on both
// sides compared nothing: it is a difference unless render serves nothing in that
// family (its script adds no table of it), so that a table name the soak gets wrong
// (or an instance render and the supervisor both left out) cannot pass as equal.
func tableDiff(k tableKey, want renderedTable, got listedTable, limit int) []string {
	if !want.Present && !got.Present {
		if len(want.Declared) == 0 {
			return nil
		}
		return []string{fmt.Sprintf("table %s is missing both in the kernel and in render's tables, yet render's script adds %s %s: nothing was compared",
			k, k.family, strings.Join(want.Declared, ", "))}
	}
	lines, total := Diff(want.Rules, got.Rules, limit)
	if total == 0 {
		return nil
	}
	return append([]string{fmt.Sprintf("%d differences (- rendered only, + kernel only):", total)}, lines...)
}

// dumpObjects writes the API's Services, EndpointSlices, Nodes and ServiceCIDRs as YAML
// for render, and returns the file.
func (c *checker) dumpObjects(ctx context.Context) (string, error) {
	svcs, err := c.e.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	slices, err := c.e.Client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	// Every Node, not only this one, and the ServiceCIDRs: the supervisor refuses their
	// addresses as externalIPs and load-balancer IPs, and render refuses what it reads.
	nodes, err := c.e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	var cidrs []networkingv1.ServiceCIDR
	if list, err := c.e.Client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{}); err == nil {
		cidrs = list.Items
	} else if !apierrors.IsNotFound(err) {
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
	for i := range nodes.Items {
		nodes.Items[i].TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
		if err := write(&nodes.Items[i]); err != nil {
			return "", err
		}
	}
	for i := range cidrs {
		cidrs[i].TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "ServiceCIDR"}
		if err := write(&cidrs[i]); err != nil {
			return "", err
		}
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
func (c *checker) compare(ctx context.Context, want map[tableKey]renderedTable) (map[tableKey][]string, error) {
	diffs := map[tableKey][]string{}
	for k, w := range want {
		got, err := c.list(ctx, c.e.TP.Node, k)
		if err != nil {
			return nil, err
		}
		if lines := tableDiff(k, w, got, 12); len(lines) > 0 {
			diffs[k] = lines
		}
	}
	return diffs, nil
}

// list reads one table in namespace ns; a missing table lists as not present.
func (c *checker) list(ctx context.Context, ns string, k tableKey) (listedTable, error) {
	out, err := c.run(ctx, ns, nil, "-j", "list", "table", k.family, k.table())
	if err != nil {
		if strings.Contains(err.Error(), "No such file or directory") {
			return listedTable{}, nil
		}
		return listedTable{}, err
	}
	rs, err := ParseRuleset(out)
	return listedTable{Rules: rs, Present: true}, err
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
