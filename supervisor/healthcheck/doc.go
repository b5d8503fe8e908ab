// Package healthcheck serves the node-wide health endpoints of a shardproxy node: one proxy
// health server (/healthz, /livez, /status) covering every proxy instance the supervisor
// runs, and one service health server per health-check node port of a LoadBalancer Service
// with externalTrafficPolicy Local, whichever instance owns the Service.
//
// The behaviour follows upstream kube-proxy's pkg/proxy/healthcheck, with the single proxier
// replaced by a set of named instances, one per tenant: the node fails /healthz only for
// what is node-wide (its deletion, or no healthy instance at all), so one tenant's failing
// instance does not drain the node for the others; the response bodies name each instance
// so an operator can see which one is failing, and /status, on loopback only, says why.
package healthcheck
