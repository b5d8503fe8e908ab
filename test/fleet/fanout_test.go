package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestMeasureFanout checks the fan-out measurement's mechanics on a fake clientset:
// every size is written updates times and each write reaches every watcher before the
// next (else it would not return), and its ConfigMaps are gone afterwards. The fake has
// no apiserver: no CPU or byte figures, which the table prints as n/a.
func TestMeasureFanout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := testutil.NewClientset()
	rs, err := MeasureFanout(ctx, Env{Admin: client, NodeClient: client}, "default", 3, 4, []int{1 << 10, 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Size != 1<<10 || rs[1].Size != 8<<10 || rs[1].Watchers != 3 || rs[1].Updates != 4 || rs[1].Took <= 0 {
		t.Fatalf("results: %+v", rs)
	}
	left, err := client.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(left.Items) != 0 {
		t.Errorf("ConfigMaps left: %d, %v", len(left.Items), err)
	}
	if table := FanoutTable(rs); !strings.Contains(table, "8 kB") || !strings.Contains(table, "n/a") {
		t.Errorf("table:\n%s", table)
	}
}
