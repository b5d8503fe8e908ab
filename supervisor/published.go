package supervisor

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
)

// The states of the published node address list (healthcheck.NodeAddressesStatus).
const (
	publishedAbsent  = "absent"
	publishedOK      = "ok"
	publishedInvalid = "invalid"
)

// publishedList is the watch of the published node address list (otherNodeAddresses:
// published): one ConfigMap, by a field selector on its name, instead of every Node.
// What it last read validly stays in force while the ConfigMap is absent or unreadable.
type publishedList struct {
	key      types.NamespacedName
	self     string
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer

	mu sync.Mutex
	// ips are the other Nodes' addresses of the last valid list (otherNodeIPs' form).
	ips    []selector.NodeIP
	status healthcheck.NodeAddressesStatus
}

func newPublishedList(client kubernetes.Interface, key types.NamespacedName, self string) *publishedList {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(key.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", key.Name).String()
		}), informers.WithTransform(trimForCache))
	return &publishedList{key: key, self: self, factory: f, informer: f.Core().V1().ConfigMaps().Informer(),
		status: healthcheck.NodeAddressesStatus{ConfigMap: key.String(), State: publishedAbsent, Error: "the ConfigMap does not exist"}}
}

// handlers read the list on each event and then call changed.
func (p *publishedList) handlers(changed func()) cache.ResourceEventHandlerFuncs {
	// The field selector makes the watch hold the list alone; a fake clientset's watch
	// does not apply it.
	ours := func(obj any) (*corev1.ConfigMap, bool) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		cm, ok := obj.(*corev1.ConfigMap)
		return cm, ok && cm.Name == p.key.Name && cm.Namespace == p.key.Namespace
	}
	read := func(obj any) {
		if cm, ok := ours(obj); ok {
			p.read(cm, time.Now())
			changed()
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    read,
		UpdateFunc: func(_, obj any) { read(obj) },
		DeleteFunc: func(obj any) {
			if _, ok := ours(obj); !ok {
				return
			}
			p.mu.Lock()
			p.status.State, p.status.Error = publishedAbsent, "the ConfigMap was deleted"
			p.mu.Unlock()
			changed()
		},
	}
}

// read decodes the ConfigMap's list; a list it cannot read leaves the last one in force.
func (p *publishedList) read(cm *corev1.ConfigMap, now time.Time) {
	nodes, err := nodeaddrs.Decode(cm.Data[nodeaddrs.DataKey])
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.status.State, p.status.Error = publishedInvalid, err.Error()
		return
	}
	p.ips = nodeIPs(nodes, p.self)
	p.status = healthcheck.NodeAddressesStatus{ConfigMap: p.key.String(), State: publishedOK, Nodes: len(nodes),
		ResourceVersion: cm.ResourceVersion, Read: now}
}

// otherNodeIPs are the other Nodes' addresses of the last valid list.
func (p *publishedList) otherNodeIPs() []selector.NodeIP {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ips
}

// current is the list's state now.
func (p *publishedList) current() healthcheck.NodeAddressesStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// OtherNodeIPs lists the other Nodes' addresses this node reserves now (from every
// Node's watch or the published list; none before Run has made the watches, or when it
// reserves none).
func (s *Supervisor) OtherNodeIPs() []selector.NodeIP {
	if s.watches == nil {
		return nil
	}
	return s.watches.OtherNodeIPs()
}
