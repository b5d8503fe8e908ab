package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// churnNodes numbers the churn Nodes of this process, so that no two fleets of one run
// reuse a name or an address.
var churnNodes atomic.Int32

// ChurnNodeName names churn Node k: a Node with no hollow proxy behind it, as a node an
// autoscaler adds is for the seconds before its proxy starts.
func ChurnNodeName(k int) string { return fmt.Sprintf("churn-%d", k) }

// ChurnAddr is churn Node k's InternalIP (10.250.0.0/16: none of NodeAddr's, none of
// gen's plan).
func ChurnAddr(k int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 250, byte(k >> 8), byte(k)})
}

// churn makes one Node change per interval until window ends: a join (a Node created
// with its Ready status and an InternalIP of its own, as kubelet registers one) while
// fewer than two churn Nodes exist, else the leave of the older one (deleted, as after an
// autoscaler removed its machine). The cluster's size stays put (one Node more, then
// none) and every change gives a set of Node addresses the cluster has not had before
// (join b beside a, a leaves, join c beside b, ...): joining and deleting one Node would
// flip between two sets, and a writer's debounce could find the set unchanged. It
// returns how many changes it made and the churn Nodes still there when the window
// ended, which the caller deletes once its counters are read. The writes run under ctx:
// one sent as the window closes completes.
func churn(ctx, window context.Context, admin kubernetes.Interface, interval time.Duration) (changes int, joined []string, err error) {
	if interval <= 0 {
		<-window.Done()
		return 0, nil, nil
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-window.Done():
			return changes, joined, nil
		case now := <-tick.C:
			if len(joined) >= 2 {
				if err := admin.CoreV1().Nodes().Delete(ctx, joined[0], metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					if ctx.Err() != nil {
						return changes, joined, nil
					}
					return changes, joined, fmt.Errorf("churn: deleting Node %s: %w", joined[0], err)
				}
				joined = joined[1:]
				changes++
				continue
			}
			k := int(churnNodes.Add(1))
			name := ChurnNodeName(k)
			node := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
				Status:     churnStatus(k, now),
			}
			if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
				if ctx.Err() != nil {
					return changes, joined, nil
				}
				return changes, joined, fmt.Errorf("churn: creating Node %s: %w", name, err)
			}
			joined = append(joined, name)
			changes++
		}
	}
}

// churnStatus is churn Node k's status: Ready, an InternalIP and a hostname, as a
// kubelet registers its Node.
func churnStatus(k int, now time.Time) corev1.NodeStatus {
	return corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ChurnAddr(k).String()}, {Type: corev1.NodeHostName, Address: ChurnNodeName(k)}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}},
	}
}

// deleteChurnNodes deletes the Nodes churn left joined.
func deleteChurnNodes(ctx context.Context, admin kubernetes.Interface, names []string) error {
	var errs []error
	for _, name := range names {
		if err := admin.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("churn: deleting Node %s after the window: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
