// Package fromkubeproxy turns an upstream kube-proxy configuration (a
// KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1) into a shardproxy supervisor
// configuration with the same behaviour, and says, as a comment in the output, what it
// cannot carry and why. It is what `shardproxy config from-kube-proxy` prints.
package fromkubeproxy

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// The group version and kind a kube-proxy configuration file carries.
const (
	kubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	kubeProxyKind       = "KubeProxyConfiguration"
)

// ConfigMapKey is where kubeadm keeps the configuration in the kube-proxy ConfigMap.
const ConfigMapKey = "config.conf"

// KubeconfigKey is where kubeadm keeps, in the same ConfigMap, the kubeconfig that
// kube-proxy's pod mounts at /var/lib/kube-proxy/kubeconfig.conf: the pod's
// ServiceAccount token, and the API server's address (kubeadm's controlPlaneEndpoint).
const KubeconfigKey = "kubeconfig.conf"

// Decode reads a KubeProxyConfiguration from YAML or JSON: the object itself, or a
// ConfigMap holding it (as kube-system/kube-proxy does). Unknown fields are errors, as
// for kube-proxy itself.
func Decode(data []byte) (*kpv1alpha1.KubeProxyConfiguration, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, fmt.Errorf("reading the kube-proxy configuration: %w", err)
	}
	switch {
	case tm.Kind == "ConfigMap" && tm.APIVersion == "v1":
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(data, &cm); err != nil {
			return nil, fmt.Errorf("reading the ConfigMap: %w", err)
		}
		return FromConfigMap(&cm)
	case tm.Kind != kubeProxyKind || tm.APIVersion != kubeProxyAPIVersion:
		return nil, fmt.Errorf("not a kube-proxy configuration: apiVersion %q kind %q, want %s %s (or a v1 ConfigMap holding one)",
			tm.APIVersion, tm.Kind, kubeProxyAPIVersion, kubeProxyKind)
	}
	var kp kpv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict(data, &kp); err != nil {
		return nil, fmt.Errorf("reading the kube-proxy configuration: %w", err)
	}
	return &kp, nil
}

// FromConfigMap reads the KubeProxyConfiguration a ConfigMap holds: under ConfigMapKey
// (kubeadm's), else under its only key that holds one.
func FromConfigMap(cm *corev1.ConfigMap) (*kpv1alpha1.KubeProxyConfiguration, error) {
	name := cm.Namespace + "/" + cm.Name
	if v, ok := cm.Data[ConfigMapKey]; ok {
		kp, err := Decode([]byte(v))
		if err != nil {
			return nil, fmt.Errorf("ConfigMap %s, key %s: %w", name, ConfigMapKey, err)
		}
		return kp, nil
	}
	var found []string
	var kp *kpv1alpha1.KubeProxyConfiguration
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(cm.Data)) {
		got, err := Decode([]byte(cm.Data[key]))
		if err != nil {
			errs = append(errs, fmt.Errorf("key %s: %w", key, err))
			continue
		}
		found, kp = append(found, key), got
	}
	switch len(found) {
	case 1:
		return kp, nil
	case 0:
		return nil, fmt.Errorf("ConfigMap %s holds no kube-proxy configuration: %w", name, errors.Join(errs...))
	default:
		return nil, fmt.Errorf("ConfigMap %s holds several kube-proxy configurations (%s): pass the one to convert as a file", name, strings.Join(found, ", "))
	}
}

// APIServer returns the API server URL of the kubeconfig that a kube-proxy ConfigMap
// holds under KubeconfigKey (kubeadm's), or "" when data is not a ConfigMap or holds
// none: the address the replace overlay's supervisor must reach without a Service.
func APIServer(data []byte) (string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil || tm.Kind != "ConfigMap" || tm.APIVersion != "v1" {
		return "", nil
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(data, &cm); err != nil {
		return "", fmt.Errorf("reading the ConfigMap: %w", err)
	}
	return APIServerFromConfigMap(&cm)
}

// APIServerFromConfigMap is APIServer of a ConfigMap read from the cluster.
func APIServerFromConfigMap(cm *corev1.ConfigMap) (string, error) {
	v, ok := cm.Data[KubeconfigKey]
	if !ok {
		return "", nil
	}
	kc, err := clientcmd.Load([]byte(v))
	if err != nil {
		return "", fmt.Errorf("ConfigMap %s/%s, key %s: %w", cm.Namespace, cm.Name, KubeconfigKey, err)
	}
	cluster := ""
	if ctx, ok := kc.Contexts[kc.CurrentContext]; ok {
		cluster = ctx.Cluster
	} else if len(kc.Clusters) == 1 {
		for name := range kc.Clusters {
			cluster = name
		}
	}
	c, ok := kc.Clusters[cluster]
	if !ok || c.Server == "" {
		return "", fmt.Errorf("ConfigMap %s/%s, key %s: no current context naming a cluster with a server", cm.Namespace, cm.Name, KubeconfigKey)
	}
	return c.Server, nil
}
