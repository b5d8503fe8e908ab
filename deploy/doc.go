// Package deploy holds shardproxy's Kubernetes manifests, which are not Go: a kustomize
// base (base/: ServiceAccount, ClusterRole and binding, DaemonSet, and the supervisor
// configuration as a ConfigMap), the overlays alongside-kube-proxy and replace-kube-proxy,
// the image's Dockerfile and a Grafana dashboard.
//
// The package's tests are the manifests' CI: they render the base and every overlay with
// kustomize's library, check the DaemonSet's invariants, run each ConfigMap's
// configuration through `shardproxy check --skip-probe`, send every object to a real
// kube-apiserver as a server-side dry run (root only, like every control-plane test),
// check the ClusterRole's rights there, and check that the dashboard only queries metrics
// the metrics package registers. README.md says what is and is not tested.
package deploy
