// Package healthcheck serves the node-wide health endpoints of a shardproxy node: one proxy
// health server (/healthz, /livez, /status) covering every proxy instance the supervisor
// runs, and one service health server per health-check node port of a LoadBalancer Service
// with externalTrafficPolicy Local, whichever instance owns the Service.
//
// The behaviour follows upstream kube-proxy's pkg/proxy/healthcheck, with the single proxier
// replaced by a set of named instances: the node is healthy only when every instance is, and
// the response bodies name each instance so an operator can see which one is failing.
package healthcheck
