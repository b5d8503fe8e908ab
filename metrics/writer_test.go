package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestNodeAddressWriterSeries: the writer's series exist from the start (but the last
// publish's timestamp, which appears with the first publish) and follow its state.
func TestNodeAddressWriterSeries(t *testing.T) {
	m := NewNodeAddressWriter("shardproxy-system/shardproxy-nodeaddresses")
	const lastPublish = "shardproxy_node_addresses_writer_last_publish_timestamp_seconds"
	names := []string{"shardproxy_node_addresses_writer_leader", "shardproxy_node_addresses_writer_publish_errors_total",
		"shardproxy_node_addresses_writer_nodes", lastPublish, "shardproxy_node_addresses_writer_budget_wait_seconds"}
	if n, err := testutil.GatherAndCount(m.Registry(), names...); err != nil || n != 4 {
		t.Errorf("at start: %d series (%v), want 4 (no last publish yet)", n, err)
	}
	m.SetLeader(true)
	m.PublishFailed()
	m.Published(7, time.Unix(1700000000, 0))
	m.BudgetWait(1500 * time.Millisecond)
	m.BudgetWait(40 * time.Second)
	want := `
# HELP shardproxy_node_addresses_writer_budget_wait_seconds Waits of a write of the node address list for the egress budget (--max-egress), beyond the debounce: one per wait, observed when it begins
# TYPE shardproxy_node_addresses_writer_budget_wait_seconds histogram
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="0.01"} 0
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="0.05"} 0
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="0.1"} 0
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="0.5"} 0
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="1"} 0
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="2"} 1
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="5"} 1
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="10"} 1
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="30"} 1
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="60"} 2
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="120"} 2
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="300"} 2
shardproxy_node_addresses_writer_budget_wait_seconds_bucket{configmap="shardproxy-system/shardproxy-nodeaddresses",le="+Inf"} 2
shardproxy_node_addresses_writer_budget_wait_seconds_sum{configmap="shardproxy-system/shardproxy-nodeaddresses"} 41.5
shardproxy_node_addresses_writer_budget_wait_seconds_count{configmap="shardproxy-system/shardproxy-nodeaddresses"} 2
# HELP shardproxy_node_addresses_writer_leader 1 while this node address writer holds the Lease and publishes the list, 0 while it stands by
# TYPE shardproxy_node_addresses_writer_leader gauge
shardproxy_node_addresses_writer_leader{configmap="shardproxy-system/shardproxy-nodeaddresses"} 1
# HELP shardproxy_node_addresses_writer_nodes Nodes in the node address list this writer last published
# TYPE shardproxy_node_addresses_writer_nodes gauge
shardproxy_node_addresses_writer_nodes{configmap="shardproxy-system/shardproxy-nodeaddresses"} 7
# HELP shardproxy_node_addresses_writer_publish_errors_total Publishes of the node address list that failed (each is retried with backoff), and first lists of the Nodes not in within the bound
# TYPE shardproxy_node_addresses_writer_publish_errors_total counter
shardproxy_node_addresses_writer_publish_errors_total{configmap="shardproxy-system/shardproxy-nodeaddresses"} 1
# HELP shardproxy_node_addresses_writer_last_publish_timestamp_seconds When this writer last published the node address list (wrote it, or found it current), in seconds since the epoch
# TYPE shardproxy_node_addresses_writer_last_publish_timestamp_seconds gauge
shardproxy_node_addresses_writer_last_publish_timestamp_seconds{configmap="shardproxy-system/shardproxy-nodeaddresses"} 1.7e+09
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}
